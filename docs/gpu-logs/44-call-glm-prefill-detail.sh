#!/usr/bin/env bash
# Run 44, call 5: GLM-5.3-Flash (20 of 45 layers, ds4 q2 types) decode and
# streams; DeepSeek-V4 prefill of a 2,048-token prompt; the slow kernels'
# stall reasons under ncu (details page).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
(cd "$S" && python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('ds4server.xz'),open('ds4server','wb'))" && chmod +x ds4server)
G="--synthetic glm5_next --shape $R/tools/gpu/glm5_next_full_20_layers.json --device cuda --kernels fast --weights ds4-q2"
echo "== glm5_next 20 layers q2 fast $(date +%T)" >> "$O/glm5.log"
timeout 200 $S/ds4server bench $G --prompts 512 --gen 32 >> "$O/glm5.log" 2>&1; echo "rc=$?" >> "$O/glm5.log"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json --device cuda --kernels fast --weights ds4-q2"
if [ -n "${PREFILL2K:-}" ]; then
  echo "== deepseek_v4 32 layers prefill 2048 $(date +%T)" >> "$O/ds4-prefill.log"
  timeout 150 $S/ds4server bench $D --prompts 2048 --gen 8 2>&1 | grep -E "^REPORT|rror|panic" >> "$O/ds4-prefill.log"
fi
if [ -n "${QWEN_STEP:-}" ]; then
  echo "== qwen4_exp 24 layers one stream $(date +%T)" >> "$O/qwen4-step.log"
  timeout 150 $S/ds4server bench --synthetic qwen4_exp --shape "$R/tools/gpu/qwen4_exp_full_24_layers.json" --device cuda --kernels fast \
    --prompts 512 --gen 32 2>&1 | grep -E "^REPORT|rror|panic" >> "$O/qwen4-step.log"
fi
if [ -n "${GLM_STREAMS:-}" ]; then
  echo "== glm5_next 20 layers --streams $GLM_STREAMS $(date +%T)" >> "$O/glm5.log"
  timeout 150 $S/ds4server bench $G --streams $GLM_STREAMS --prompts 128 --gen 32 2>&1 | grep -v "^REPORT stream \|^REPORT weights" >> "$O/glm5.log"; echo "rc=$?" >> "$O/glm5.log"
fi
if [ -n "${DETAIL:-}" ]; then
  cp "$R/tools/gpu/ds4-synthetic.sh" "$S/run.sh"
  SHAPE=tools/gpu/deepseek_v4_full_32_layers.json NCU_KERNELS="$DETAIL" NCU_COUNT=${NCU_COUNT:-12} OUT=$O bash "$S/run.sh" ncu-detail > "$O/ncu-detail.log" 2>&1
fi
echo "total s=$SECONDS" >> "$O/glm5.log"
