#!/usr/bin/env bash
# Run 49's call. Two binaries: .gpu-synth/ds4server-48.xz ("base": run 48's
# code, db0bb24) and .gpu-synth/ds4server.xz ("new": HEAD), and the CUDA test
# binary of HEAD (.gpu-synth/cuda.xz).
# 1. every CUDA test; 2. DeepSeek-V4 32 layers base / new / new8 (new with
# DS4_CUDA_F8_LANES=8: the one-row products' four blocks a lane without the
# wider groups) alternated twice (digests must all equal); 3. GLM-5 20
# layers base / new; 4. on a card of > 100 GB with time left: the full 43
# layers, new then base, prefill 2,048. At most 8 files come back.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server && unpack ds4server-48 && unpack cuda) || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$O/machine.log" 2>&1
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
t0=$SECONDS
(cd "$S" && timeout 200 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1)
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
B="--device cuda --kernels fast --weights ds4-q2"
G="--synthetic glm5_next --shape $R/tools/gpu/glm5_next_full_20_layers.json $B --prompts 512 --gen 32"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json $B --prompts 512 --gen 32"
keep="^REPORT (prefill|verify|decode_digest|hbm|step_host_ms|step_bytes)|^[0-9]+,|rror|panic"
L=$O/bench.log
run() { # variant, bench args...
  local v=$1; shift
  case $v in
    base) "$S/ds4server-48" bench "$@" ;;
    new) "$S/ds4server" bench "$@" ;;
    new8) DS4_CUDA_F8_LANES=8 "$S/ds4server" bench "$@" ;;
  esac
}
for rep in 1 2; do
  for v in base new new8; do
    echo "== ds4 32 $v rep $rep $(date +%T)" >> "$L"
    timeout 100 bash -c "$(declare -f run); S=$S; run $v $D" 2>&1 | grep -E "$keep" >> "$L"
  done
done
for v in base new; do
  echo "== glm 20 $v $(date +%T)" >> "$L"
  timeout 100 bash -c "$(declare -f run); S=$S; run $v $G" 2>&1 | grep -E "$keep" >> "$L"
done
echo "bench s=$((SECONDS-t0))" >> "$L"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
F=$O/full.log
for v in new base; do
  left=$((${LIMIT:-570}-SECONDS+t0))
  if [ "${mem:-0}" -gt 100000 ] && [ $left -gt 100 ]; then
    echo "== ds4 full 43 layers $v $(date +%T)" >> "$F"
    timeout $((left-5)) bash -c "$(declare -f run); S=$S; run $v --synthetic deepseek_v4 --shape full $B --prompts 2048 --gen 32" 2>&1 | grep -E "^REPORT|rror|panic" | grep -v "REPORT weights type" >> "$F"
  fi
done
echo "total s=$((SECONDS-t0))" >> "$L"
