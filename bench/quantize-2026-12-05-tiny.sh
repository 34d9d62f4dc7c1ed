#!/usr/bin/env bash
# docs/QUANTIZE.md "Quality", tiny fixtures: every family's tiny checkpoint
# (a Hugging Face directory) through every recipe, each file compared with
# its source by `ds4server quantize-report` (64 pseudo-random tokens,
# teacher-forced). Log: bench/quantize-2026-12-05-tiny.log.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ours=$root/target/release/ds4server
out=${OUT:-/tmp/ds4-quantize-tiny}
mkdir -p "$out"
log=$root/bench/quantize-2026-12-05-tiny.log
: > "$log"
for fam in llama/tiny/f32_untied deepseek_v4/tiny_a qwen4_exp/tiny_a glm5_next/tiny_a; do
  src=$root/tests/fixtures/$fam
  name=$(echo "$fam" | cut -d/ -f1)
  files=()
  for recipe in f32 bf16 f16 q8_0 q4_k ds4-q4 ds4-q2; do
    f=$out/$name-$recipe.gguf
    extra=()
    [ "$recipe" = ds4-q2 ] && extra=(--allow-no-imatrix)
    if "$ours" quantize "$src" "$f" --recipe "$recipe" "${extra[@]}" > "$out/$name-$recipe.txt" 2>&1; then
      files+=("$f")
    else
      echo "$name $recipe: refused: $(grep error: "$out/$name-$recipe.txt")" >> "$log"
    fi
  done
  echo "## $name ($fam)" >> "$log"
  "$ours" quantize-report "$src" "${files[@]}" --tokens 64 --kernels reference >> "$log" 2>/dev/null || echo "report failed" >> "$log"
  for f in "${files[@]}"; do
    echo "  $(basename "$f"): $(grep -E '^ +[A-Z0-9_]+:' "${f%.gguf}.txt" | sed 's/ tensors, / x /' | awk '{printf "%s %s ", $1, $2}')" >> "$log"
  done
done
cat "$log"
