#!/usr/bin/env bash
# docs/QUANTIZE.md "Quality": the default model (SmolLM2-135M-Instruct,
# Q4_1 GGUF) requantized by `ds4server quantize` and by llama.cpp's
# `llama-quantize --allow-requantize --pure` to the same types; per-tensor
# byte comparison (bench/quantize-compare.py) and each file's distance
# from the Q4_1 source (`ds4server quantize-report`, teacher-forced over
# bench/heldout.txt). Logs: bench/quantize-2026-12-05-*.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ours=$root/target/release/ds4server
src=${SRC:-$HOME/.cache/ds4server/models/SmolLM2-135M-Instruct.Q4_1.gguf}
llq=${LLAMA_QUANTIZE:-$(ls -d "$HOME"/.cache/ds4server/llamacpp/llama.cpp/build-*/bin/llama-quantize | head -1)}
out=${OUT:-/tmp/ds4-quantize-bench}
threads=${THREADS:-$(nproc)}
mkdir -p "$out"
log=$root/bench/quantize-2026-12-05
# type  our flags
declare -A flags=(
  [q8_0]="--recipe q8_0"
  [q4_k]="--recipe q4_k"
  [q2_k]="--recipe q4_k --type embedding=Q2_K --type attention=Q2_K --type ffn=Q2_K --type ffn-down=Q2_K --type output=Q2_K --type other=Q2_K"
)
types=${TYPES:-q8_0 q4_k q2_k}
: > "$log-quantize.log"
for t in $types; do
  T=$(echo "$t" | tr a-z A-Z)
  { echo "== ours $t: ds4server quantize ${flags[$t]} --threads $threads"
    /usr/bin/time -f "wall %e s, max rss %M KiB" "$ours" quantize "$src" "$out/ours-$t.gguf" ${flags[$t]} --threads "$threads" 2>&1 | grep -v "MiB (.*left$"
    echo "== llama.cpp $t: llama-quantize --allow-requantize --pure $T $threads"
    /usr/bin/time -f "wall %e s, max rss %M KiB" "$llq" --allow-requantize --pure "$src" "$out/llama-$t.gguf" "$T" "$threads" 2>&1 | grep -E "model size|quant size|WARNING|llama_model_loader: - type|wall" || true
  } >> "$log-quantize.log" 2>&1
done
: > "$log-compare.log"
for t in $types; do
  python3 "$root/bench/quantize-compare.py" "$out/ours-$t.gguf" "$out/llama-$t.gguf" >> "$log-compare.log"
done
files=()
for t in $types; do files+=("$out/ours-$t.gguf" "$out/llama-$t.gguf"); done
"$ours" quantize-report "$src" "${files[@]}" --text "$root/bench/heldout.txt" --window "${WINDOW:-1024}" --kernels "${KERNELS:-reference}" \
  > "$log-report.log" 2> "$log-report.stderr.log"
cat "$log-report.log"
