#!/usr/bin/env bash
# Run 45, call 4: every CUDA test (the grouped f32 product, the one-row
# Q8_0 launcher of a quarter of the warps), then GLM-5.3-Flash 20 layers
# with MLA's absorption as grouped products.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
cd "$S" || exit 1
for b in ds4server cuda; do python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$b.xz'),open('$b','wb'))" && chmod +x $b; done
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
timeout 60 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1
echo "tests rc=$?" >> "$O/tests.log"
echo "== glm new $(date +%T)" >> "$O/glm.log"
timeout 55 ./ds4server bench --synthetic glm5_next --shape "$R/tools/gpu/glm5_next_full_20_layers.json" \
  --device cuda --kernels fast --weights ds4-q2 --prompts 512 --gen 32 2>&1 | grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host)|rror|panic" >> "$O/glm.log"
