#!/usr/bin/env bash
# Run 47 call 2 (as run, on the warm H200 after call 1, the binary unpacked
# again): one fast DeepSeek-V4 32-layer step of the new binary under ncu
# (the profiled step kept, no snapshot), summed per kernel by ncu_table.py.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
S=$PWD/.gpu-synth
(cd $S/new && python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('ds4server.xz'),open('ds4server','wb'))" && chmod +x ds4server)
ncu=$(ls /opt/nvidia/nsight-compute/*/ncu | tail -1)
DS4_PROFILE_STEP=1 timeout 120 $ncu --clock-control none --cache-control none --profile-from-start off --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size \
  $S/new/ds4server bench --synthetic deepseek_v4 --shape $PWD/tools/gpu/deepseek_v4_full_32_layers.json \
  --device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 2 > $OUT/ncu-ds4-32.csv 2>/tmp/e
tail -2 /tmp/e; python3 tools/gpu/ncu_table.py $OUT/ncu-ds4-32.csv > $OUT/ncu-ds4-32.table 2>&1; gzip $OUT/ncu-ds4-32.csv
