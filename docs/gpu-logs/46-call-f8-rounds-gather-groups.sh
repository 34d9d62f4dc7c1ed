#!/usr/bin/env bash
# Run 46, call 3 (from the repo root, binaries of call 1): kernel variants
# by override (DS4_CUDA_KERNELS), their own tests, then DeepSeek-V4 32
# layers and GLM-5 20 layers: var-f8h4 (the one-row Q8_0 / Q4_1 product
# with 32 blocks a round instead of 16: more loads in flight a warp), var-gq0 (routed gathers: a group of eight lanes
# per output, four outputs a warp, the activation block shared by the
# four); GLM-5 also on new2 (routed products of fewer pairs than an
# eighth of the experts by the gather: its K = 3 verify); QWEN=1: then
# qwen4_exp 24 layers. Cut to what 272 s of device
# time left could hold.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && { [ -x ds4server ] || unpack ds4server; } && { [ -x cuda ] || unpack cuda; } && unpack new2/ds4server) || exit 1
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
nvidia-smi --query-gpu=name,memory.total --format=csv > "$O/machine.log" 2>&1
t0=$SECONDS
for v in ${VAR_TESTS:-var-f8h4:cuda_fast_block_products var-gq0:cuda_fast_kq8_experts}; do
  (cd "$S" && DS4_CUDA_KERNELS=$S/${v%%:*} timeout 60 ./cuda --ignored --test-threads=1 ${v#*:} > "$O/tests-${v%%:*}.log" 2>&1
   echo "rc=$?" >> "$O/tests-${v%%:*}.log")
done
echo "tests s=$((SECONDS-t0))" >> "$O/ds4.log"
B="--device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 32"
run() { local log=$1 name=$2 fam=$3 shape=$4 bin=$S/ds4server; shift 4; echo "== $name $(date +%T)" >> "$O/$log"
  [ "$1" = NEW2=1 ] && bin=$S/new2/ds4server
  timeout 90 env "$@" "$bin" bench --synthetic $fam --shape "$R/tools/gpu/$shape" $B 2>&1 |
    grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|rror|panic" >> "$O/$log"; }
run ds4.log new deepseek_v4 deepseek_v4_full_32_layers.json X=0
for v in var-f8h4 var-gq0; do run ds4.log "new-$v" deepseek_v4 deepseek_v4_full_32_layers.json DS4_CUDA_KERNELS=$S/$v; done
echo "ds4 s=$((SECONDS-t0))" >> "$O/ds4.log"
run glm.log new glm5_next glm5_next_full_20_layers.json X=0
run glm.log new2-sparse-pairs-gather glm5_next glm5_next_full_20_layers.json NEW2=1
run glm.log new-var-f8h4 glm5_next glm5_next_full_20_layers.json DS4_CUDA_KERNELS=$S/var-f8h4
[ -n "${QWEN:-}" ] && { echo "== qwen4_exp 24 layers $(date +%T)" >> "$O/qwen4.log"
timeout 90 "$S/ds4server" bench --synthetic qwen4_exp --shape "$R/tools/gpu/qwen4_exp_full_24_layers.json" --device cuda \
  --kernels fast --prompts 512 --gen 32 2>&1 | grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|rror|panic" >> "$O/qwen4.log"; }
echo "total s=$((SECONDS-t0))" >> "$O/ds4.log"
