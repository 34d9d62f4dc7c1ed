#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root there, over binaries
# built on the CPU machine and carried in .gpu/ (see docs/GPU.md). Writes
# logs to $OUT. Usage: bash .gpu/run.sh [tests|server|synthetic|ncu|ncu-windows|ncu-kernel:NAME:SKIP|llamacpp|compare]...
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
# A fresh machine has no cache: every run pays one NVRTC compile, timed.
export DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4-cuda-cache}
OUT=${OUT:-/tmp/ds4-out}
mkdir -p "$OUT"
root=$PWD
echo "repo: $root ($(git log -1 --format='%h %s' 2>/dev/null | cut -c1-60))"
# Test binaries find the fixtures under the checkout they were built in
# (/work/wt-cuda or /work/main so far): link this checkout's there.
for built in /work/wt-cuda /work/main; do
  if [ "$root" != "$built" ] && [ ! -d "$built/tests/fixtures" ]; then
    mkdir -p "$built/crates/engine"
    ln -sfn "$root/tests" "$built/tests"
  fi
done
cd "$root/.gpu" || exit 1
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x cuda ds4server 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
for what in "${@:-tests}"; do
  case "$what" in
    tests)
      ./cuda --ignored --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.log"
      ;;
    tests:*)
      ./cuda --ignored --test-threads=1 --nocapture "${what#tests:}" 2>&1 | tee "$OUT/tests.log"
      ;;
    server)
      # The CLI on the GPU: --device cuda, and auto choosing the GPU (no
      # fallback line), on a tiny fixture with an MTP head.
      for dev in cuda auto cpu; do
        echo "== ds4server run --device $dev"
        ./ds4server run -m "$root/tests/fixtures/qwen4_exp/tiny_a" --device "$dev" \
          --prompt-tokens 5,6,7,8,9,10 --max-tokens 16 --temperature 0 2>&1
      done | tee "$OUT/server.log"
      ;;
    synthetic|synthetic:*)
      # Full-size synthetic qwen4_exp (random 4-bit weights made on the
      # device): prefill, decode, verify rows and the roofline fraction.
      # `synthetic:ARGS` passes extra bench arguments (commas for spaces).
      extra=""; [ "$what" != synthetic ] && extra=$(echo "${what#synthetic:}" | tr ',' ' ')
      for graphs in 1; do
        echo "== bench --synthetic qwen4_exp --shape full $extra"
        # shellcheck disable=SC2086
        DS4_CUDA_GRAPHS=$graphs ./ds4server bench --synthetic qwen4_exp --shape full \
          --device cuda --ctx-start 512 --gen 64 $extra 2>&1
        nvidia-smi --query-gpu=memory.used --format=csv
      done | tee -a "$OUT/synthetic.log"
      ;;
    ncu)
      # One eager decode step's kernels under Nsight Compute (graphs off:
      # ncu runs each kernel alone, caches as the step leaves them), summed
      # by tools/gpu/ncu_table.py. The skip covers the load and prefill
      # launches of a 512-token prompt and two steps (docs/GPU.md, run 18).
      ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      DS4_CUDA_GRAPHS=0 "$ncu" --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
        --launch-skip "${NCU_SKIP:-3227}" --launch-count "${NCU_COUNT:-1203}" \
        ./ds4server bench --synthetic qwen4_exp --shape full --device cuda --ctx-start 512 --gen 4 \
        > "$OUT/ncu-decode-step.csv" 2> "$OUT/ncu.err"
      gzip -f "$OUT/ncu-decode-step.csv"
      ;;
    ncu-windows)
      # Eager forwards of 1 and 2 rows (a decode step and a K = 1 verify
      # window) from a 512-token prefill, only they profiled
      # (`DS4_PROFILE_WINDOWS`, --profile-from-start off); the bench prints
      # each window's launch count (`REPORT eager_windows`), which splits
      # the CSV: python3 tools/gpu/ncu_table.py FILE --ids A:B.
      ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      DS4_PROFILE_WINDOWS=${NCU_WINDOWS:-1,2} "$ncu" --clock-control none --cache-control none \
        --profile-from-start off --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size \
        ./ds4server bench --synthetic qwen4_exp --shape full --device cuda --ctx-start 512 --gen 4 \
        > "$OUT/ncu-windows.csv" 2> "$OUT/ncu-windows.err"
      grep "^REPORT" "$OUT/ncu-windows.csv" | tee "$OUT/ncu-windows.report"
      gzip -f "$OUT/ncu-windows.csv"
      ;;
    ncu-kernel:*)
      # One decode launch of one kernel under ncu's detailed sections
      # (speed of light, warp states, scheduler, occupancy, memory):
      # `ncu-kernel:NAME:SKIP` skips SKIP launches of NAME first (past the
      # prefill's). Appends to $OUT/ncu-kernel.log.
      spec=${what#ncu-kernel:}; name=${spec%%:*}; skip=${spec##*:}
      [ "$skip" = "$spec" ] && skip=100
      ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
      echo "=== $name skip $skip" | tee -a "$OUT/ncu-kernel.log"
      DS4_CUDA_GRAPHS=0 timeout 150 "$ncu" --clock-control none --cache-control none \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis -k "regex:^$name\$" --launch-skip "$skip" \
        --launch-count 1 ./ds4server bench --synthetic qwen4_exp --shape full --device cuda \
        --ctx-start 512 --gen 8 2>&1 | grep -v "^REPORT\|^==PROF==" >> "$OUT/ncu-kernel.log"
      grep -A0 "Duration" "$OUT/ncu-kernel.log" | tail -1
      ;;
    llamacpp)
      # llama.cpp's CUDA build, from a source tarball carried in .gpu
      # (llama-src.tgz), for sm_90 only and without flash-attention kernels
      # (they dominate the compile time); CUDA graphs stay on.
      export PATH=/usr/local/cuda/bin:$PATH
      mkdir -p /tmp/llama && tar xzf llama-src.tgz -C /tmp/llama
      start=$(date +%s)
      (cd /tmp/llama &&
        cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
          -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF \
          -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
          -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
          > "$OUT/llama-configure.log" 2>&1 &&
        timeout "${LLAMA_BUILD_S:-420}" cmake --build build --target llama-bench -j 16 \
          > "$OUT/llama-build.log" 2>&1)
      echo "llama.cpp build rc=$? in $(( $(date +%s) - start ))s"
      ;;
    compare)
      # The same SmolLM2-shaped GGUF (random weights, the real tokenizer)
      # through our engine bench, our CLI bench and llama-bench.
      export DS4_VOCAB_GGUF=$PWD/vocab.gguf DS4_SMOLLM2_GGUF=/tmp/smollm2.gguf
      ./cuda --ignored --test-threads=1 --nocapture smollm2 2>&1 | tee "$OUT/compare.log"
      for dev in cuda cuda-eager cpu; do
        echo "== ds4server bench --device $dev" | tee -a "$OUT/compare.log"
        graphs=1; [ "$dev" = cuda-eager ] && graphs=0
        DS4_CUDA_GRAPHS=$graphs ./ds4server bench --device "${dev%-eager}" -m /tmp/smollm2.gguf \
          --ctx-start 512 --ctx-max 2048 --step 1536 --gen 128 2>&1 | tee -a "$OUT/compare.log"
      done
      if [ -x /tmp/llama/build/bin/llama-bench ]; then
        echo "== llama-bench (CUDA, all layers on the GPU)" | tee -a "$OUT/compare.log"
        /tmp/llama/build/bin/llama-bench -m /tmp/smollm2.gguf -ngl 99 -p 512 -n 128 \
          -d 0,2048 -r 3 2>&1 | tee -a "$OUT/compare.log"
      fi
      ;;
    *)
      echo "unknown step $what"
      ;;
  esac
done
