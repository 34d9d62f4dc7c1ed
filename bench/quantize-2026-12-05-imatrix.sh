#!/usr/bin/env bash
# docs/QUANTIZE.md "Quality", with an importance matrix: llama.cpp's
# llama-imatrix over bench/corpus.txt (not the held-out text) for the
# default model, then Q4_K, Q2_K and IQ2_XXS (ffn_down, the only rows that
# are whole 256 blocks) by `ds4server quantize --imatrix` and by
# `llama-quantize --pure --imatrix`; tensors compared byte for byte and
# each file scored against the Q4_1 source over bench/heldout.txt.
# Log: bench/quantize-2026-12-05-imatrix.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ours=$root/target/release/ds4server
src=${SRC:-$HOME/.cache/ds4server/models/SmolLM2-135M-Instruct.Q4_1.gguf}
bin=$(dirname "$(ls -d "$HOME"/.cache/ds4server/llamacpp/llama.cpp/build-*/bin/llama-quantize | head -1)")
out=${OUT:-/tmp/ds4-quantize-imatrix}
mkdir -p "$out"
log=$root/bench/quantize-2026-12-05-imatrix.log
im=$out/smol-imatrix.gguf
"$bin/llama-imatrix" -m "$src" -f "$root/bench/corpus.txt" -o "$im" -c 512 --chunks 32 -t "$(nproc)" 2>&1 |
  grep -E "Final estimate|compute_imatrix: tokenizing|saved|stored" > "$log" || true
run() { # name, our flags, llama flags..., llama type
  local name=$1 oflags=$2 ltype=$3; shift 3
  echo "== $name" >> "$log"
  "$ours" quantize "$src" "$out/ours-$name.gguf" $oflags --imatrix "$im" 2>&1 | grep -E "^ +[A-Z0-9_]+: +[0-9]+ tensors|^wrote" >> "$log"
  "$bin/llama-quantize" --allow-requantize --pure --imatrix "$im" "$@" "$src" "$out/llama-$name.gguf" "$ltype" 2>&1 |
    grep -E "quant size|WARNING" >> "$log" || true
  python3 "$root/bench/quantize-compare.py" "$out/ours-$name.gguf" "$out/llama-$name.gguf" >> "$log"
}
run q4_k "--recipe q4_k" Q4_K
run q2_k "--recipe q4_k --type embedding=Q2_K --type attention=Q2_K --type ffn=Q2_K --type ffn-down=Q2_K" Q2_K
run iq2_xxs-down "--recipe q4_k --type ffn-down=IQ2_XXS" Q4_K --tensor-type ffn_down=iq2_xxs
files=()
for n in q4_k q2_k iq2_xxs-down; do files+=("$out/ours-$n.gguf" "$out/llama-$n.gguf"); done
"$ours" quantize-report "$src" "${files[@]}" --text "$root/bench/heldout.txt" --window 1024 --kernels reference 2>/dev/null >> "$log"
cat "$log"
