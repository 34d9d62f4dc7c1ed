#!/usr/bin/env bash
# Run 45, call 1: every CUDA test (GLM-5's pure units and DeepSeek-V4's
# wider units first run), the same-bit variants' own tests, DeepSeek-V4
# 32-layer q2 fast: old binary (e19bd9b) against new, and per variant
# (the digest must stay da1cdf28ab486128).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
cd "$S" || exit 1
[ -x old/ds4server ] || { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('old/ds4server.xz'),open('old/ds4server','wb'))" && chmod +x old/ds4server; }
for b in ds4server cuda; do [ -x $b ] || { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$b.xz'),open('$b','wb'))" && chmod +x $b; }; done
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "cores $(nproc)"; } > "$O/machine.log" 2>&1
t0=$SECONDS
if [ -z "${NO_TESTS:-}" ]; then
timeout 200 ./cuda --ignored --test-threads=1 --nocapture --skip bench > "$O/tests.log" 2>&1
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
fi
for v in ${VAR_TESTS:-}; do
  name=${v%%:*}; filt=${v#*:}
  DS4_CUDA_KERNELS=$S/$name timeout 120 ./cuda --ignored --test-threads=1 ${filt//,/ } > "$O/tests-$name.log" 2>&1
  echo "rc=$?" >> "$O/tests-$name.log"
done
ds() {  # NAME BINARY [env...]
  local name=$1 bin=$2; shift 2
  echo "== $name $(date +%T)" >> "$O/ds4.log"
  env "$@" timeout 150 $bin bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_32_layers.json" \
    --device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 32 2>&1 | grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host)|rror|panic" >> "$O/ds4.log"
}
[ -n "${OLD:-}" ] && ds old-embedded ./old/ds4server
ds new-embedded ./ds4server
for v in ${VARIANTS:-}; do ds "new-$v" ./ds4server DS4_CUDA_KERNELS=$S/$v; done
[ -n "${OLD_AGAIN:-}" ] && ds old-embedded-again ./old/ds4server
glm() {  # NAME BINARY [env...]: GLM-5.3-Flash 20 of 45 layers, ds4 q2 mix
  local name=$1 bin=$2; shift 2
  echo "== $name $(date +%T)" >> "$O/glm.log"
  env "$@" timeout 150 $bin bench --synthetic glm5_next --shape "$R/tools/gpu/glm5_next_full_20_layers.json" \
    --device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 32 2>&1 | grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host)|rror|panic" >> "$O/glm.log"
}
if [ -n "${GLM:-}" ]; then glm new ./ds4server; glm old ./old/ds4server; fi
echo "total s=$SECONDS" >> "$O/ds4.log"
