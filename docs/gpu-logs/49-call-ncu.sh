#!/usr/bin/env bash
# Run 49, call 2: HEAD's binary (.gpu-synth/ds4server.xz) under ncu: the
# stall reasons of DeepSeek-V4's slow kernels (4-layer shape, details
# page: the window attention, the routed gathers, the one-row products at
# each group width, HC fn, the norms), then one fast 32-layer step summed
# per kernel (ncu_table.py), against run 47's
# 47-c2-ncu-fast-step-32-layers-h200.table (the same token, 516).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
[ -x "$S/ds4server" ] || (cd "$S" && python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('ds4server.xz'),open('ds4server','wb'))" && chmod +x ds4server)
t0=$SECONDS
B="--device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 2"
ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
DS4_PROFILE_STEP=1 timeout 200 "$ncu" --profile-from-start off --csv --page details \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -k "regex:${DETAIL:-attention_window_staged|kq8_gather|f8_one|hc_fn|rms_norm|hc_sinkhorn}" -c 40 \
  "$S/ds4server" bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_4_layers.json" $B \
  > "$O/ncu-detail.csv" 2> "$O/ncu-detail.err"
python3 "$R/tools/gpu/ncu_detail_table.py" "$O/ncu-detail.csv" > "$O/ncu-detail.table" 2>&1; gzip -f "$O/ncu-detail.csv"
echo "detail done s=$((SECONDS-t0))" >> "$O/ncu.log"
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size
DS4_PROFILE_STEP=1 timeout 200 "$ncu" --clock-control none --cache-control none --profile-from-start off --csv \
  --metrics $M "$S/ds4server" bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_32_layers.json" $B \
  > "$O/ncu-step.csv" 2> "$O/ncu-step.err"
python3 "$R/tools/gpu/ncu_table.py" "$O/ncu-step.csv" > "$O/ncu-step.table" 2>&1; gzip -f "$O/ncu-step.csv"
echo "step done s=$((SECONDS-t0))" >> "$O/ncu.log"
tail -3 "$O/ncu-detail.err" "$O/ncu-step.err" >> "$O/ncu.log"
