#!/usr/bin/env bash
# Run 48's call (prepared in the session after run 47, when no device was
# lent; docs/GPU.md "Run 48"). From the repo root, with
# .gpu-synth/ds4server.xz and .gpu-synth/cuda.xz built from HEAD and
# .gpu-synth/k-base/{f16w,hc_fn,attention}.cu = run 47's kernels
# (`git show 58c9148:crates/engine/src/backend/cuda/kernels/NAME`), so one
# binary runs both: "base" = DS4_CUDA_KERNELS=k-base, "new" = the embedded
# set, "new4" / "new2" = new with DS4_CUDA_WINDOW_HEADS=4 / 2.
# 1. every CUDA test; 2. DeepSeek-V4 32 layers base / new / new4 / new2
# alternated twice (digests must all equal); 3. GLM-5 20 layers base / new;
# 4. with time left on a card of > 100 GB: DeepSeek-V4 full 43 layers, new at
# WH heads (default 8), prefill 2,048. LIMIT: the call's seconds. At most 8
# files come back from $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server && unpack cuda) || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$O/machine.log" 2>&1
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
t0=$SECONDS
(cd "$S" && timeout 170 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1)
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
B="--device cuda --kernels fast --weights ds4-q2"
G="--synthetic glm5_next --shape $R/tools/gpu/glm5_next_full_20_layers.json $B --prompts 512 --gen 32"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json $B --prompts 512 --gen 32"
keep="^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|^[0-9]+,|rror|panic"
L=$O/bench.log
run() { # variant, bench args...
  local v=$1; shift
  case $v in
    base) DS4_CUDA_KERNELS=$S/k-base "$S/ds4server" bench "$@" ;;
    new) "$S/ds4server" bench "$@" ;;
    new4) DS4_CUDA_WINDOW_HEADS=4 "$S/ds4server" bench "$@" ;;
    new2) DS4_CUDA_WINDOW_HEADS=2 "$S/ds4server" bench "$@" ;;
  esac
}
for rep in 1 2; do
  for v in base new new4 new2; do
    echo "== ds4 32 $v rep $rep $(date +%T)" >> "$L"
    timeout 90 bash -c "$(declare -f run); S=$S; run $v $D" 2>&1 | grep -E "$keep" >> "$L"
  done
done
for v in base new; do
  echo "== glm 20 $v $(date +%T)" >> "$L"
  timeout 90 bash -c "$(declare -f run); S=$S; run $v $G" 2>&1 | grep -E "$keep" >> "$L"
done
echo "bench s=$((SECONDS-t0))" >> "$L"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ $((SECONDS-t0)) -lt ${FULL_BEFORE:-380} ] && [ "${mem:-0}" -gt 100000 ]; then
  F=$O/full.log
  echo "== ds4 full 43 layers new heads ${WH:-8} $(date +%T)" >> "$F"
  DS4_CUDA_WINDOW_HEADS=${WH:-8} timeout $((${LIMIT:-560}-SECONDS+t0)) "$S/ds4server" bench --synthetic deepseek_v4 --shape full $B --prompts 2048 --gen 32 2>&1 | grep -E "$keep|REPORT" >> "$F"
fi
echo "total s=$((SECONDS-t0))" >> "$L"
