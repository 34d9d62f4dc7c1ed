#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root there, over binaries
# built on the CPU machine and carried in .gpu/ (see docs/GPU.md). Writes
# logs to $OUT. Usage: bash .gpu/run.sh [tests|server|bench]...
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
# A fresh machine has no cache: every run pays one NVRTC compile, timed.
export DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4-cuda-cache}
OUT=${OUT:-/tmp/ds4-out}
mkdir -p "$OUT"
root=$PWD
echo "repo: $root ($(git log -1 --format='%h %s' 2>/dev/null | cut -c1-60))"
# The test binary was built at /work/wt-cuda: it finds the fixtures there.
if [ ! -d /work/wt-cuda/tests/fixtures ]; then
  mkdir -p /work/wt-cuda/crates/engine
  ln -sfn "$root/tests" /work/wt-cuda/tests
fi
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
    *)
      echo "unknown step $what"
      ;;
  esac
done
