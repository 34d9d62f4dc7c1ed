#!/usr/bin/env bash
# Run 47 call 1, from the repo root, with .gpu-synth/ds4server.xz of 93d1d59
# ("base": run 46's next call, not yet run), .gpu-synth/f16w/ds4server.xz of
# the same tree plus the fast set's 16-bit float products (kernels/f16w.cu)
# and .gpu-synth/cuda.xz (the CUDA tests of that tree: f16w's tests too).
# var-shfl0 = bd3392a's kq8.cu (the gathers before the constant-zero
# shuffles were dropped), timed in the base binary.
# 1. every CUDA test; 2. GLM-5 20 layers base vs f16w, --streams 1,4,8;
# 3. DeepSeek-V4 32 layers base / f16w / var-shfl0 / f16w-pf (var-pf:
# fast8.cu's one-row kernel loads its first weights before dep_entry)
# alternated twice;
# 4. qwen4_exp 24 layers base vs f16w; 5. with FULL=1, on a card of > 100 GB:
# DeepSeek-V4 full (43 layers) q2, f16w, prefill 2,048.
# At most 8 files come back from $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server && unpack cuda && unpack f16w/ds4server) || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$O/machine.log" 2>&1
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
t0=$SECONDS
(cd "$S" && timeout 170 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1)
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
(cd "$S" && DS4_CUDA_KERNELS=$S/var-pf timeout 60 ./cuda --ignored --test-threads=1 fast > "$O/tests-pf.log" 2>&1)
echo "tests var-pf rc=$? s=$((SECONDS-t0))" >> "$O/tests-pf.log"
B="--device cuda --kernels fast --weights ds4-q2"
G="--synthetic glm5_next --shape $R/tools/gpu/glm5_next_full_20_layers.json $B"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json $B --prompts 512 --gen 32"
Q="--synthetic qwen4_exp --shape $R/tools/gpu/qwen4_exp_full_24_layers.json --device cuda --kernels fast --prompts 512 --gen 32"
keep="^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|^[0-9]+,|rror|panic"
L=$O/bench.log
bin() { if [ "${1%-pf}" = f16w ]; then echo "$S/f16w/ds4server"; else echo "$S/ds4server"; fi; }
for who in f16w base; do
  echo "== glm $who $(date +%T)" >> "$L"
  timeout 90 "$(bin $who)" bench $G --prompts 512 --gen 32 2>&1 | grep -E "$keep" >> "$L"
  echo "== glm $who --streams 1,4,8 $(date +%T)" >> "$L"
  timeout 120 "$(bin $who)" bench $G --streams 1,4,8 --prompts 128 --gen 32 2>&1 | grep -E "$keep" >> "$L"
done
for rep in 1 2; do
  for v in base f16w var-shfl0 f16w-pf; do
    echo "== ds4 32 $v rep $rep $(date +%T)" >> "$L"
    over=(); [ $v = var-shfl0 ] && over=(env "DS4_CUDA_KERNELS=$S/$v")
    [ $v = f16w-pf ] && over=(env "DS4_CUDA_KERNELS=$S/var-pf")
    timeout 90 "${over[@]}" "$(bin $v)" bench $D 2>&1 | grep -E "$keep" >> "$L"
  done
done
for who in f16w base; do
  echo "== qwen4_exp 24 $who $(date +%T)" >> "$L"
  timeout 90 "$(bin $who)" bench $Q 2>&1 | grep -E "$keep" >> "$L"
done
echo "bench s=$((SECONDS-t0))" >> "$L"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${FULL:-0}" = 1 ] && [ "${mem:-0}" -gt 100000 ]; then
  F=$O/full.log
  echo "== ds4 full 43 layers f16w $(date +%T)" >> "$F"
  timeout 200 "$S/f16w/ds4server" bench --synthetic deepseek_v4 --shape full $B --prompts 2048 --gen 32 2>&1 | grep -E "$keep|REPORT" >> "$F"
fi
echo "total s=$((SECONDS-t0))" >> "$L"
