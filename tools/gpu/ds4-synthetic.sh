#!/usr/bin/env bash
# Full-size synthetic DeepSeek-V4-Flash in ds4's stored types on the H200
# (docs/GPU.md, runs 28 and 30), and the CUDA tests of the stored and fast
# products first. Carried in .gpu-synth/ with `ds4server.xz` (xz -9e of the
# stripped `--features cuda` binary) and `cuda.gz` or `cuda.xz` (the
# compressed `cuda` test binary). Usage: bash .gpu-synth/run.sh [tests] [q2] [q2fast] [q4] [streams] [group] [ncu] [ncu-fast] [ncu-detail] [variants]
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4-cuda-cache}
OUT=${OUT:-/tmp/ds4-out}; mkdir -p "$OUT"
root=$PWD
# SHAPE: full (default), or a config.json relative to the checkout, e.g.
# tools/gpu/deepseek_v4_full_32_layers.json (the full shape with 32 of its
# 43 layers: 60.5 GiB of q2 weights, which fit an H100's 78 GiB).
shape=${SHAPE:-full}
case "$shape" in /*|full|tiny) ;; *) shape="$root/$shape" ;; esac
cd "$(dirname "$0")" || exit 1
python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('ds4server.xz'),open('ds4server','wb'))" && chmod +x ds4server
[ -e cuda.gz ] && gunzip -f cuda.gz && chmod +x cuda
[ -e cuda.xz ] && python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('cuda.xz'),open('cuda','wb'))" && chmod +x cuda
# Test binaries find the fixtures under the checkout they were built in.
if [ "$root" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then
  mkdir -p /work/main/crates/engine && ln -sfn "$root/tests" /work/main/tests
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; echo "cores $(nproc)"; free -g; } 2>&1 | tee "$OUT/machine.log"
bench() {  # NAME TIMEOUT_S BENCH_ARGS...
  local name=$1 t=$2; shift 2
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader -lms 500 > "$OUT/mem-$name.csv" 2>&1 &
  local mp=$! s0=$SECONDS
  local dev=${DEVICES:+--devices $DEVICES}; dev=${dev:---device cuda}
  echo "== ds4server bench --synthetic deepseek_v4 --shape $shape $dev $*" | tee "$OUT/$name.log"
  timeout "$t" ./ds4server bench --synthetic deepseek_v4 --shape "$shape" $dev "$@" 2>&1 | tee -a "$OUT/$name.log"
  echo "rc=${PIPESTATUS[0]} wall_s=$((SECONDS - s0))" | tee -a "$OUT/$name.log"
  kill "$mp"; wait "$mp" 2>/dev/null
  echo "device memory used, peak MiB: $(cut -d, -f2 "$OUT/mem-$name.csv" | tr -dc '0-9\n' | sort -n | tail -1) (sampled every 0.5 s)" | tee -a "$OUT/$name.log"
}
[ $# -gt 0 ] || set -- tests q2 q2fast
for what in "$@"; do
  case "$what" in
    tests) timeout "${TESTS_S:-150}" ./cuda --ignored --test-threads=1 --nocapture ${TESTS_FILTER:-ops::} 2>&1 | tee "$OUT/tests.log" | grep -E "REPORT|test result|panicked|^test " ;;
    q2) bench q2 "${Q2_S:-240}" --kernels reference --weights ds4-q2 --prompts "${PROMPTS:-512}" --gen 32 ;;
    q2fast) bench q2fast "${Q2_S:-240}" --kernels fast --weights ds4-q2 --prompts "${PROMPTS:-512}" --gen 32 ;;
    # One decode step (after a 512-token prefill) under Nsight Compute,
    # only it profiled (DS4_PROFILE_STEP, --profile-from-start off); sum it
    # with tools/gpu/ncu_table.py. ncu-fast: the same under --kernels fast.
    # NCU_ROWS=N (default 1) profiles one forward of N rows instead: a
    # prefill chunk's kernels.
    ncu|ncu-fast)
      ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      set_=reference; [ "$what" = ncu-fast ] && set_=fast
      s0=$SECONDS
      DS4_PROFILE_STEP=${NCU_ROWS:-1} timeout "${NCU_S:-300}" "$ncu" --clock-control none --cache-control none \
        --profile-from-start off --csv \
        --metrics "${NCU_METRICS:-gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size}" \
        ./ds4server bench --synthetic deepseek_v4 --shape "$shape" --device cuda --kernels $set_ \
        --weights ds4-q2 --prompts "${NCU_PROMPT:-512}" --gen 2 > "$OUT/$what-rows${NCU_ROWS:-1}.csv" 2> "$OUT/$what-rows${NCU_ROWS:-1}.err"
      echo "$what rc=$? wall_s=$((SECONDS - s0))" | tee -a "$OUT/$what-rows${NCU_ROWS:-1}.err"
      grep "^REPORT" "$OUT/$what-rows${NCU_ROWS:-1}.csv" | tee "$OUT/$what-rows${NCU_ROWS:-1}.report"
      python3 "$root/tools/gpu/ncu_table.py" "$OUT/$what-rows${NCU_ROWS:-1}.csv" > "$OUT/$what-rows${NCU_ROWS:-1}.table" 2>&1
      gzip -f "$OUT/$what-rows${NCU_ROWS:-1}.csv" ;;
    # Why the slow kernels of one fast-set step are slow: Nsight Compute's
    # occupancy, warp-state (stall reasons), launch and speed-of-light
    # sections for the first NCU_COUNT (default 80) launches whose names
    # match NCU_KERNELS; details page as CSV (`ncu-detail.csv.gz`).
    # NCU_ROWS=N: those of an N-row forward (a prefill chunk) instead.
    ncu-detail)
      ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      s0=$SECONDS
      DS4_PROFILE_STEP=${NCU_ROWS:-1} timeout "${NCU_S:-300}" "$ncu" --profile-from-start off --csv --page details \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis \
        -k "regex:${NCU_KERNELS:-st_matmul|kq8_gather|route_scored|attention_window|rms_norm_wide|matmul_q8_0}" \
        -c "${NCU_COUNT:-80}" \
        ./ds4server bench --synthetic deepseek_v4 --shape "$shape" --device cuda --kernels fast \
        --weights ds4-q2 --prompts "${NCU_PROMPT:-512}" --gen 2 > "$OUT/ncu-detail.csv" 2> "$OUT/ncu-detail.err"
      echo "ncu-detail rc=$? wall_s=$((SECONDS - s0))" | tee -a "$OUT/ncu-detail.err"
      gzip -f "$OUT/ncu-detail.csv" ;;
    # Continuous batching's aggregate decode rate (issue 47's GPU rows):
    # STREAMS (default 1,8,32) greedy streams of 128-token prompts at once,
    # each checked against its turn served alone.
    streams) bench streams "${STREAMS_S:-300}" --kernels fast --weights ds4-q2 --streams "${STREAMS:-1,8,32}" --prompts 128 --gen 32 ;;
    # The expert-parallel group on one GPU (issue 49): two logical shards
    # of device 0, rows and slot outputs through the host, against q2fast.
    group) DEVICES=cuda:0,cuda:0 bench group "${Q2_S:-240}" --kernels fast --weights ds4-q2 --prompts "${PROMPTS:-512}" --gen 16 ;;
    q4) bench q4 "${Q4_S:-120}" --weights ds4-q4 --prompts 512 --gen 8 ;;
    # Kernel variants side by side on one machine: q2fast once per
    # directory in VARIANTS (relative to the checkout), each holding
    # replacement kernel sources (`DS4_CUDA_KERNELS`, `cuda/nvrtc.rs`); the
    # embedded kernels run first as `q2fast-embedded`.
    variants)
      bench q2fast-embedded "${Q2_S:-240}" --kernels fast --weights ds4-q2 --prompts "${PROMPTS:-512}" --gen 32
      for v in ${VARIANTS:-}; do
        DS4_CUDA_KERNELS="$root/$v" bench "q2fast-$(basename "$v")" "${Q2_S:-240}" --kernels fast --weights ds4-q2 --prompts "${PROMPTS:-512}" --gen 32
      done ;;
  esac
done
