#!/usr/bin/env bash
# Run 46, call 2: call 1's ncu part (its bench arguments had --gen twice):
# the stall reasons of DeepSeek-V4's slow kernels (4-layer shape), one
# fast GLM-5 step and one fast DeepSeek-V4 32-layer step under ncu.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
[ -x "$S/ds4server" ] || (cd "$S" && python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('ds4server.xz'),open('ds4server','wb'))" && chmod +x ds4server)
t0=$SECONDS
B="--device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 2"
ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
DS4_PROFILE_STEP=1 timeout 150 "$ncu" --profile-from-start off --csv --page details \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -k "regex:${DETAIL:-kq8_gather|f8_one|st_matmul_deep|hc_fn}" -c 16 \
  "$S/ds4server" bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_4_layers.json" $B \
  > "$O/ncu-detail.csv" 2> "$O/ncu-detail.err"; gzip -f "$O/ncu-detail.csv"
echo "detail done s=$((SECONDS-t0))" >> "$O/ncu.log"
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size
step() { # NAME FAMILY SHAPE
  DS4_PROFILE_STEP=1 timeout 200 "$ncu" --clock-control none --cache-control none --profile-from-start off --csv \
    --metrics $M "$S/ds4server" bench --synthetic "$2" --shape "$R/tools/gpu/$3" $B > "$O/ncu-$1.csv" 2> "$O/ncu-$1.err"
  python3 "$R/tools/gpu/ncu_table.py" "$O/ncu-$1.csv" > "$O/ncu-$1.table" 2>&1; gzip -f "$O/ncu-$1.csv"
  echo "$1 done s=$((SECONDS-t0))" >> "$O/ncu.log"; }
step glm5-next-20-layers glm5_next glm5_next_full_20_layers.json
step ds4-32-layers deepseek_v4 deepseek_v4_full_32_layers.json
