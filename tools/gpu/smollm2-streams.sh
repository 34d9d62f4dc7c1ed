#!/usr/bin/env bash
# Issue 47's GPU rows for the SmolLM2 shape: the `cuda` test binary writes a
# SmolLM2-135M-shaped Q4_1 GGUF (random weights, `DS4_SMOLLM2_GGUF`) and
# times one stream eager and as graphs and batched steps of 1..64 sessions
# on both kernel sets, then `ds4server bench --streams` runs STREAMS
# (default 1,8,32,64) batched greedy streams of 128-token prompts on it
# for each set of KERNELS (default "reference fast"), each checked against
# its turn alone (OLD=1: against a baseline binary, below). Carried with
# `.gpu-synth/ds4server.xz` and `.gpu-tests/cuda.xz` (docs/GPU.md).
# Usage: bash tools/gpu/smollm2-streams.sh
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4-cuda-cache}
OUT=${OUT:-/tmp/ds4-out}; mkdir -p "$OUT"
bin=/tmp/ds4-bin; mkdir -p "$bin"
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu-synth/ds4server.xz'),open('$bin/ds4server','wb'))"
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu-tests/cuda.xz'),open('$bin/cuda','wb'))"
chmod +x "$bin/ds4server" "$bin/cuda"
gguf=/tmp/smollm2-shaped.gguf
# SINGLE=0 skips the one-stream timing (the batched test writes the GGUF).
if [ "${SINGLE:-1}" != 0 ]; then
  DS4_SMOLLM2_GGUF=$gguf timeout "${SMOL_TEST_S:-150}" "$bin/cuda" --ignored --exact \
    bench::cuda_bench_smollm2_shaped_decode --nocapture 2>&1 | grep -E "REPORT|test result|panicked" | tee "$OUT/smollm2-single.log"
fi
# Batched decode steps of 1..64 sessions on both kernel sets, the host's
# share split out (tests/cuda/bench_batched.rs).
DS4_SMOLLM2_GGUF=$gguf DS4_CUDA_HOST_PROFILE=${HOST_PROFILE:-0} timeout "${BATCHED_S:-150}" "$bin/cuda" --ignored --exact \
  bench_batched::cuda_bench_smollm2_shaped_batched_steps --nocapture 2>&1 | grep -E "REPORT|test result|panicked" | tee "$OUT/smollm2-batched.log"
# NCU=1: the batched test again under Nsight Compute, only its one
# profiled 64-session step per kernel set (`profiler_range`), per kernel.
if [ "${NCU:-0}" = 1 ]; then
  ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
  DS4_SMOLLM2_GGUF=$gguf timeout "${NCU_S:-200}" "$ncu" --profile-from-start off --csv \
    --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size "$bin/cuda" --ignored --exact \
    bench_batched::cuda_bench_smollm2_shaped_batched_steps > "$OUT/smollm2-batched-ncu.csv" 2>&1
  python3 tools/gpu/ncu_table.py "$OUT/smollm2-batched-ncu.csv" > "$OUT/smollm2-batched-ncu.table" 2>&1
  head -30 "$OUT/smollm2-batched-ncu.table"
fi
: > "$OUT/smollm2-streams.log"
# OLD=1: also the binary in .gpu-old/ds4server.xz (a baseline), old and
# new alternating ROUNDS times (default 2) on the same file and GPU.
if [ "${OLD:-0}" = 1 ]; then
  python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('.gpu-old/ds4server.xz'),open('$bin/old','wb'))"
  chmod +x "$bin/old"
fi
for set in ${KERNELS:-reference fast}; do
  if [ "${OLD:-0}" = 1 ]; then
    for round in $(seq "${ROUNDS:-2}"); do
      for b in old ds4server; do
        echo "== round $round: $b bench --kernels $set --streams ${STREAMS:-1,8,32,64}" | tee -a "$OUT/smollm2-streams.log"
        timeout "${STREAMS_S:-200}" "$bin/$b" bench -m "$gguf" --device cuda --kernels "$set" --streams "${STREAMS:-1,8,32,64}" \
          --prompts 128 --gen 32 2>&1 | grep -v "^REPORT host_gap" | tee -a "$OUT/smollm2-streams.log"
      done
    done
    continue
  fi
  echo "== ds4server bench -m smollm2-shaped.gguf --device cuda --kernels $set --streams ${STREAMS:-1,8,32,64} --prompts 128 --gen 32" | tee -a "$OUT/smollm2-streams.log"
  DS4_CUDA_HOST_PROFILE=${HOST_PROFILE:-0} timeout "${STREAMS_S:-200}" "$bin/ds4server" bench -m "$gguf" --device cuda --kernels "$set" --streams "${STREAMS:-1,8,32,64}" \
    --prompts 128 --gen 32 2>&1 | tee -a "$OUT/smollm2-streams.log"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/smollm2-streams.log"
done
