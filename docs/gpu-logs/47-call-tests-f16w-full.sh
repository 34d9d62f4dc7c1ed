#!/usr/bin/env bash
# Run 47 call 1, from the repo root, with .gpu-synth/ds4server.xz of 93d1d59
# ("base": run 46's next call, not yet run), .gpu-synth/new/ds4server.xz of
# c486253 ("new": the fast set's 16-bit float products
# kernels/f16w.cu, copy8_f32, DeepSeek's wq_a + wkv in one launch) and
# .gpu-synth/cuda.xz (HEAD's CUDA tests).
# 1. every CUDA test; 2. GLM-5 20 layers new vs base; 3. DeepSeek-V4 32
# layers base / new alternated twice;
# 4. qwen4_exp 24 layers new vs base; 5. with time left, on a card of
# > 100 GB: DeepSeek-V4 full (43 layers) q2, new, prefill 2,048; 6. with
# time left, GLM-5 new --streams 1,4 (LIMIT: the call's seconds). At most 8 files come back from $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server && unpack cuda && unpack new/ds4server) || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$O/machine.log" 2>&1
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
t0=$SECONDS
(cd "$S" && timeout 150 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1)
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
B="--device cuda --kernels fast --weights ds4-q2"
G="--synthetic glm5_next --shape $R/tools/gpu/glm5_next_full_20_layers.json $B"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json $B --prompts 512 --gen 32"
Q="--synthetic qwen4_exp --shape $R/tools/gpu/qwen4_exp_full_24_layers.json --device cuda --kernels fast --prompts 512 --gen 32"
keep="^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|^[0-9]+,|rror|panic"
L=$O/bench.log
bin() { case $1 in new*) echo "$S/new/ds4server" ;; *) echo "$S/ds4server" ;; esac; }
for who in new base; do
  echo "== glm $who $(date +%T)" >> "$L"
  timeout 90 "$(bin $who)" bench $G --prompts 512 --gen 32 2>&1 | grep -E "$keep" >> "$L"
done
for rep in 1 2; do
  for v in base new; do
    echo "== ds4 32 $v rep $rep $(date +%T)" >> "$L"
    timeout 90 "$(bin $v)" bench $D 2>&1 | grep -E "$keep" >> "$L"
  done
done
for who in new base; do
  echo "== qwen4_exp 24 $who $(date +%T)" >> "$L"
  timeout 90 "$(bin $who)" bench $Q 2>&1 | grep -E "$keep" >> "$L"
done
echo "bench s=$((SECONDS-t0))" >> "$L"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ $((SECONDS-t0)) -lt ${FULL_BEFORE:-360} ] && [ "${mem:-0}" -gt 100000 ]; then
  F=$O/full.log
  echo "== ds4 full 43 layers new $(date +%T)" >> "$F"
  timeout $((${LIMIT:-540}-SECONDS+t0)) "$S/new/ds4server" bench --synthetic deepseek_v4 --shape full $B --prompts 2048 --gen 32 2>&1 | grep -E "$keep|REPORT" >> "$F"
fi
if [ $((SECONDS-t0)) -lt $((${LIMIT:-540}-100)) ]; then
  echo "== glm new --streams 1,4 $(date +%T)" >> "$L"
  timeout 100 "$(bin new)" bench $G --streams 1,4 --prompts 128 --gen 32 2>&1 | grep -E "$keep" >> "$L"
fi
echo "total s=$((SECONDS-t0))" >> "$L"
