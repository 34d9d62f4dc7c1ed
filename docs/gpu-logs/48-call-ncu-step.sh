#!/usr/bin/env bash
# Run 48's second call (prepared, not yet run): one fast DeepSeek-V4
# 32-layer step under ncu for HEAD's binary (.gpu-synth/ds4server.xz), at
# WH window heads (default 8: give the winner of 48-call-ab.sh), summed per
# kernel by ncu_table.py; then the same step with the base kernels
# (DS4_CUDA_KERNELS=.gpu-synth/k-base) for the before / after table of the
# F16 products, HC fn and window attention. Run 47's was
# 47-c2-ncu-fast-step-32-layers-h200.table (token 516: the CSA entries and
# the tails' trims fall in it; the profiled step here is the same token).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
S=$PWD/.gpu-synth; O=${OUT:-/tmp/out}; mkdir -p "$O"
(cd "$S" && python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('ds4server.xz'),open('ds4server','wb'))" && chmod +x ds4server)
ncu=$(ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
step() { # name, extra environment...
  local name=$1; shift
  env "$@" DS4_PROFILE_STEP=1 timeout 120 "$ncu" --clock-control none --cache-control none \
    --profile-from-start off --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
    "$S/ds4server" bench --synthetic deepseek_v4 --shape "$PWD/tools/gpu/deepseek_v4_full_32_layers.json" \
    --device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 2 > "$O/ncu-$name.csv" 2>/tmp/e
  tail -2 /tmp/e
  python3 tools/gpu/ncu_table.py "$O/ncu-$name.csv" > "$O/ncu-$name.table" 2>&1
  gzip "$O/ncu-$name.csv"
}
step new DS4_CUDA_WINDOW_HEADS=${WH:-8}
step base DS4_CUDA_KERNELS="$S/k-base"
