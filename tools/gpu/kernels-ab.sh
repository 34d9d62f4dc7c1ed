#!/usr/bin/env bash
# A kernel change against its baseline on one GPU, side by side: the
# binary in .gpu-old/ (baseline) and .gpu-synth/ (new), each carried with
# its `run.sh` (tools/gpu/ds4-synthetic.sh) and `ds4server.xz`.
#   1. DeepSeek-V4 q2 under --kernels fast, old and new alternating ROUNDS
#      times (default 2): prefill, decode step, verify windows, digest.
#      SHAPE as for ds4-synthetic.sh (default: the 32-layer shape, which
#      fits an H100; `full` on an H200).
#   2. The SmolLM2-135M shape (Q4_1, written by the `cuda` test binary in
#      .gpu-synth/) one stream, old and new: `bench --kernels fast`.
#   3. NCU=1: one new fast decode step under Nsight Compute (ncu-fast).
# Usage: bash tools/gpu/kernels-ab.sh   (OUT: where logs go)
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4-cuda-cache}
OUT=${OUT:-/tmp/ds4-out}; mkdir -p "$OUT"
export SHAPE=${SHAPE:-tools/gpu/deepseek_v4_full_32_layers.json}
for round in $(seq "${ROUNDS:-2}"); do
  for side in old synth; do
    OUT="$OUT/ds4-$side-$round" bash ".gpu-$side/run.sh" q2fast > /dev/null 2>&1
    echo "== round $round ${side/synth/new}: $(grep -hE 'decode_tok_s|verify_rows|decode_digest' "$OUT/ds4-$side-$round/q2fast.log" | tr '\n' ' ')" | tee -a "$OUT/ab.log"
  done
done
if [ "${SMOL:-1}" = 1 ]; then
  gguf=/tmp/smollm2-shaped.gguf
  (cd .gpu-synth && DS4_SMOLLM2_GGUF=$gguf timeout 150 ./cuda --ignored --exact \
    bench::cuda_bench_smollm2_shaped_decode --nocapture 2>&1 | grep -E "REPORT|test result" > "$OUT/smollm2-single-test.log")
  for round in 1 2; do
    for side in old synth; do
      echo "== round $round ${side/synth/new}: bench -m smollm2-shaped --device cuda --kernels fast --prompts 128 --gen 128" | tee -a "$OUT/ab.log"
      timeout 120 ".gpu-$side/ds4server" bench -m "$gguf" --device cuda --kernels fast --prompts 128 --gen 128 2>&1 | grep -vi "^info\|^warn" | tail -3 | tee -a "$OUT/ab.log"
    done
  done
fi
if [ "${NCU:-0}" = 1 ]; then
  NCU_S=${NCU_S:-170} NCU_METRICS=gpu__time_duration.sum,launch__grid_size,launch__block_size bash .gpu-synth/run.sh ncu-fast > /dev/null 2>&1
  head -40 "$OUT/ncu-fast-rows1.table"
fi
