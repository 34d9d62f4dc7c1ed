#!/usr/bin/env bash
# Run 44, call 1: CUDA tests (the batches' shared rows on every family), the
# same-bit kernel variants' own tests, then DeepSeek-V4 32-layer q2 fast
# with each variant (digest must stay da1cdf28ab486128), qwen4 streams.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
cd "$S" || exit 1
for b in ds4server cuda; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$b.xz'),open('$b','wb'))" && chmod +x $b; done
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "cores $(nproc)"; } > "$O/machine.log" 2>&1
t0=$SECONDS
timeout 200 ./cuda --ignored --test-threads=1 --nocapture --skip bench > "$O/tests.log" 2>&1
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
for v in ${VAR_TESTS:-}; do
  name=${v%%:*}; filt=${v#*:}
  DS4_CUDA_KERNELS=$S/$name timeout 120 ./cuda --ignored --test-threads=1 ${filt//,/ } > "$O/tests-$name.log" 2>&1
  echo "rc=$?" >> "$O/tests-$name.log"
done
ds() {  # NAME [env...]
  local name=$1; shift
  echo "== $name $(date +%T)" >> "$O/ds4.log"
  env "$@" timeout 150 ./ds4server bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_32_layers.json" \
    --device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 32 2>&1 | grep -E "^REPORT|rror|panic" >> "$O/ds4.log"
}
ds embedded
for v in ${VARIANTS:-}; do ds "$v" DS4_CUDA_KERNELS=$S/$v; done
[ -n "${REPEAT_EMBEDDED:-}" ] && ds embedded-again
if [ -n "${QWEN:-}" ]; then
  echo "== qwen4_exp 24 layers --streams 1,64" >> "$O/qwen4.log"
  timeout 200 ./ds4server bench --synthetic qwen4_exp --shape "$R/tools/gpu/qwen4_exp_full_24_layers.json" --device cuda --kernels fast \
    --streams 1,64 --prompts 128 --gen 32 2>&1 | grep -v "^REPORT stream " >> "$O/qwen4.log"
fi
echo "total s=$SECONDS" >> "$O/ds4.log"
