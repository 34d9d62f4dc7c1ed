#!/usr/bin/env bash
# docs/QUANTIZE.md "`ds4server imatrix`": our importance matrix against
# llama.cpp's llama-imatrix on the default model, same text (bench/corpus.txt,
# calibration text) and chunks (-c 512: 5 chunks); per-entry relative
# differences of in_sum2 (bench/imatrix-compare.py); then Q2_K (the q2_k mix
# of bench/quantize-2026-12-05-imatrix.sh) and Q4_K with ffn_down IQ2_XXS,
# each quantized by `ds4server quantize --imatrix` with either matrix, scored
# against the Q4_1 source over bench/heldout.txt (reference kernels).
# Log: bench/imatrix-2026-12-05.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ours=$root/target/release/ds4server
py=$root/tools/oracle/.venv/bin/python
src=${SRC:-$HOME/.cache/ds4server/models/SmolLM2-135M-Instruct.Q4_1.gguf}
bin=$(dirname "$(ls -d "$HOME"/.cache/ds4server/llamacpp/llama.cpp/build-*/bin/llama-imatrix | head -1)")
out=${OUT:-/tmp/ds4-imatrix}
mkdir -p "$out"
log=$root/bench/imatrix-2026-12-05.log
: > "$log"
cd "$root"
echo "== llama-imatrix -c 512 -t $(nproc)" >> "$log"
/usr/bin/time -f "%e s wall" "$bin/llama-imatrix" -m "$src" -f bench/corpus.txt -o "$out/llama.gguf" -c 512 --chunks 32 -t "$(nproc)" 2>&1 |
  grep -E "Final estimate|computing over|s wall" >> "$log" || true
for k in reference fast; do
  echo "== ds4server imatrix -c 512 --kernels $k" >> "$log"
  /usr/bin/time -f "%e s wall" "$ours" imatrix "$src" --text bench/corpus.txt -o "$out/ours-$k.gguf" -c 512 --kernels "$k" 2>&1 |
    grep -E "Final estimate|chunks of|wrote|s wall" >> "$log"
  echo "-- compared with llama-imatrix's" >> "$log"
  "$py" bench/imatrix-compare.py "$out/ours-$k.gguf" "$out/llama.gguf" >> "$log"
done
q2="--recipe q4_k --type embedding=Q2_K --type attention=Q2_K --type ffn=Q2_K --type ffn-down=Q2_K"
iq2="--recipe q4_k --type ffn-down=IQ2_XXS"
files=()
for m in llama ours-reference ours-fast; do
  for t in q2 iq2; do
    flags=${!t}
    "$ours" quantize "$src" "$out/$t-$m.gguf" $flags --imatrix "$out/$m.gguf" > /dev/null 2>&1
    files+=("$out/$t-$m.gguf")
  done
done
echo "== quantize-report (files: {q2,iq2}-{matrix}.gguf)" >> "$log"
"$ours" quantize-report "$src" "${files[@]}" --text bench/heldout.txt --window 1024 --kernels reference 2>/dev/null >> "$log"
cat "$log"
