#!/usr/bin/env bash
# The next call after run 46 (not yet run), from the repo root, with
# .gpu-synth/{ds4server,cuda}.xz of HEAD and .gpu-synth/old/ds4server.xz of
# bd3392a (run 46's measured binary). Variant dirs made here first:
#   for v in f8h4:fast8.cu gq0:kq8.cu; do mkdir -p .gpu-synth/var-${v%%:*}
#     git show bd3392a:crates/engine/src/backend/cuda/kernels/${v#*:} > .gpu-synth/var-${v%%:*}/${v#*:}
#     patch .gpu-synth/var-${v%%:*}/${v#*:} < docs/gpu-logs/46-variant-${v%%:*}.patch; done
#   mkdir -p .gpu-synth/var-shfl0
#   git show bd3392a:crates/engine/src/backend/cuda/kernels/kq8.cu > .gpu-synth/var-shfl0/kq8.cu
# (var-shfl0: the gathers before the shuffles of constant zeros were
# dropped, to time that change in the same binary.)
# 1. every CUDA test (GLM-5's batches now run the units; sparse routed
#    pairs by the gather); 2. GLM-5 20 layers old vs new (K = 3's verify
#    row) and --streams 1,4,8; 3. DeepSeek-V4 32 layers: the baseline and
#    the three variants alternated three times. At most 8 files in $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server && unpack cuda && unpack old/ds4server) || exit 1
if [ "$R" != /work/main ] && [ ! -d /work/main/tests/fixtures ]; then mkdir -p /work/main/crates/engine && ln -sfn "$R/tests" /work/main/tests; fi
t0=$SECONDS
(cd "$S" && timeout 150 ./cuda --ignored --test-threads=1 --skip bench > "$O/tests.log" 2>&1)
echo "tests rc=$? s=$((SECONDS-t0))" >> "$O/tests.log"
B="--device cuda --kernels fast --weights ds4-q2"
G="--synthetic glm5_next --shape $R/tools/gpu/glm5_next_full_20_layers.json $B"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json $B --prompts 512 --gen 32"
keep="^REPORT (prefill|verify|decode_digest|hbm|step_host_ms)|^[0-9]+,|rror|panic"
for who in new old; do
  bin=$S/ds4server; [ $who = old ] && bin=$S/old/ds4server
  echo "== glm $who $(date +%T)" >> "$O/glm.log"
  timeout 90 "$bin" bench $G --prompts 512 --gen 32 2>&1 | grep -E "$keep" >> "$O/glm.log"
  echo "== glm $who --streams 1,4,8 $(date +%T)" >> "$O/glm.log"
  timeout 120 "$bin" bench $G --streams 1,4,8 --prompts 128 --gen 32 2>&1 | grep -E "$keep" >> "$O/glm.log"
done
for rep in 1 2 3; do
  for v in base var-shfl0 var-f8h4 var-gq0; do
    echo "== ds4 $v rep $rep $(date +%T)" >> "$O/ds4.log"
    over=(); [ $v = base ] || over=(env "DS4_CUDA_KERNELS=$S/$v")
    timeout 90 "${over[@]}" "$S/ds4server" bench $D 2>&1 | grep -E "$keep" >> "$O/ds4.log"
  done
done
echo "total s=$((SECONDS-t0))" >> "$O/ds4.log"
