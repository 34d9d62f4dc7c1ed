#!/usr/bin/env bash
# The stored-type tests, the stored GEMV bench and the rest of the CUDA
# suite, each in a process of its own (a kernel fault stays in its step).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
OUT=${OUT:-/tmp/ds4-out}; mkdir -p "$OUT"
root=$PWD
for built in /work/main; do
  if [ "$root" != "$built" ] && [ ! -d "$built/tests/fixtures" ]; then
    mkdir -p "$built/crates/engine"; ln -sfn "$root/tests" "$built/tests"
  fi
done
cd .gpu && gunzip -f cuda.gz && chmod +x cuda
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
echo "== stored tests"
./cuda --ignored --test-threads=1 --nocapture ops::stored 2>&1 | tee "$OUT/stored-tests.log"
st=$?
if [ $st -ne 0 ]; then
  echo "== compute-sanitizer on the table and matmul tests"
  timeout 200 /usr/local/cuda/bin/compute-sanitizer --print-limit 20 ./cuda --ignored --test-threads=1 cuda_stored_tables cuda_stored_matmul 2>&1 | tail -80 | tee "$OUT/sanitizer.log"
fi
echo "== stored bench"
./cuda --ignored --nocapture cuda_bench_stored_gemv 2>&1 | tee "$OUT/stored-bench.log"
echo "== the rest of the suite (benches skipped)"
./cuda --ignored --test-threads=1 --skip stored --skip bench 2>&1 | tee "$OUT/rest-tests.log"
