#!/usr/bin/env bash
# Run 46, call 1 (from the repo root): every CUDA test on HEAD's binary
# (first run of the grouped f32 product and GLM-5's grouped absorption),
# then old (106874b, run 45's measured kernels) against new (grouped
# absorption, the one-row Q8_0 launch of a quarter of the warps, GLM-5's
# one-group router on the block kernel) on
# DeepSeek-V4 32 layers and GLM-5 20 layers, alternated; then one fast
# GLM-5 step under ncu (DS4_NCU=1: also one DeepSeek-V4 step), and the
# stall reasons of DeepSeek-V4's slow kernels; on an H200 also the whole
# DeepSeek-V4 (43 layers).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server && unpack cuda && unpack old/ds4server) || exit 1
# The test binary finds its fixtures under the path it was built at.
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "cores $(nproc)"; } > "$O/machine.log" 2>&1
t0=$SECONDS
(cd "$S" && timeout 150 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1)
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
# (As run, the benches had --gen 32 inside B and the ncu steps added
# --gen 2, which the CLI refused; call 2, 46-call-ncu.sh, ran them.)
B="--device cuda --kernels fast --weights ds4-q2 --prompts 512"
ds() { local name=$1; shift; echo "== $name $(date +%T)" >> "$O/ds4.log"
  timeout 100 "$@" bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_32_layers.json" $B --gen 32 2>&1 |
    grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|rror|panic" >> "$O/ds4.log"; }
glm() { echo "== $1 $(date +%T)" >> "$O/glm.log"
  timeout 100 "$2" bench --synthetic glm5_next --shape "$R/tools/gpu/glm5_next_full_20_layers.json" $B --gen 32 2>&1 |
    grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|rror|panic" >> "$O/glm.log"; }
glm new "$S/ds4server"; glm old "$S/old/ds4server"
ds old "$S/old/ds4server"; ds new "$S/ds4server"
glm new-again "$S/ds4server"; ds old-again "$S/old/ds4server"; ds new-again "$S/ds4server"
# Routed-gather variants (kernel overrides, same binary): persistent blocks
# (KQ_GATHER_BLOCKS in all) with the next row asked of L2 while one is summed;
# var-gq: a group of eight lanes per output, four a warp, blocks in order.
for v in ${VARIANTS:-var-gp528 var-gp1056 var-gp2112 var-gq}; do
  [ "$v" = var-gp528 ] || [ "$v" = var-gp2112 ] ||  # var-gp1056's code, another cap
  (cd "$S" && DS4_CUDA_KERNELS=$S/$v timeout 60 ./cuda --ignored --test-threads=1 cuda_fast_kq8 > "$O/tests-$v.log" 2>&1; echo "rc=$?" >> "$O/tests-$v.log")
  ds "new-$v" env DS4_CUDA_KERNELS="$S/$v" "$S/ds4server"
done
echo "benches done s=$((SECONDS-t0))" >> "$O/ds4.log"
# The whole model (43 layers, about 81 GB of q2 weights) where it fits.
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mem:-0}" -gt 100000 ]; then
  echo "== new full 43 layers $(date +%T)" >> "$O/ds4.log"
  timeout 150 "$S/ds4server" bench --synthetic deepseek_v4 --shape full $B --gen 32 2>&1 |
    grep -E "^REPORT (prefill|verify|decode_digest|hbm|step_host_ms|weights_total)|rror|panic" >> "$O/ds4.log"
fi
ncu=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
M=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size
step() { # NAME FAMILY SHAPE
  DS4_PROFILE_STEP=1 timeout 150 "$ncu" --clock-control none --cache-control none --profile-from-start off --csv \
    --metrics $M "$S/ds4server" bench --synthetic "$2" --shape "$R/tools/gpu/$3" $B --gen 2 > "$O/ncu-$1.csv" 2> "$O/ncu-$1.err"
  python3 "$R/tools/gpu/ncu_table.py" "$O/ncu-$1.csv" > "$O/ncu-$1.table" 2>&1; gzip -f "$O/ncu-$1.csv"; }
# Stall reasons of the step's slow kernels (4-layer shape: ncu's replay
# saves and restores less memory), one decode step, details page.
DS4_PROFILE_STEP=1 timeout 150 "$ncu" --profile-from-start off --csv --page details \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis -k "regex:${DETAIL:-kq8_gather|f8_one|st_matmul_deep|hc_fn}" -c 16 \
  "$S/ds4server" bench --synthetic deepseek_v4 --shape "$R/tools/gpu/deepseek_v4_full_4_layers.json" $B --gen 2 \
  > "$O/ncu-detail.csv" 2> "$O/ncu-detail.err"; gzip -f "$O/ncu-detail.csv"
echo "detail done s=$((SECONDS-t0))" >> "$O/ds4.log"
step glm5-next-20-layers glm5_next glm5_next_full_20_layers.json
[ -n "${DS4_NCU:-}" ] && step ds4-32-layers deepseek_v4 deepseek_v4_full_32_layers.json
echo "total s=$((SECONDS-t0))" >> "$O/ds4.log"
