#!/usr/bin/env bash
# Run 44, call 3: the batches' shared attention rows (b9f3f9e, 63090b7,
# 7de43c5) old (08a2729) vs new (HEAD + cp.async staging + f8 pipelining),
# qwen4_exp 24 layers and DeepSeek-V4 32 layers, then the new binary's step.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=/tmp/ds4-cuda-cache
O=${OUT:-/tmp/out}; mkdir -p "$O"; R=$PWD; S=$R/.gpu-synth
unpack() { python3 -c "import lzma,shutil;shutil.copyfileobj(lzma.open('$1.xz'),open('$1','wb'))" && chmod +x "$1"; }
(cd "$S" && unpack ds4server) && (cd "$R/.gpu-old" && unpack ds4server)
Q="--synthetic qwen4_exp --shape $R/tools/gpu/qwen4_exp_full_24_layers.json --device cuda --kernels fast --streams 1,64 --prompts 128 --gen 32"
D="--synthetic deepseek_v4 --shape $R/tools/gpu/deepseek_v4_full_32_layers.json --device cuda --kernels fast --weights ds4-q2"
for who in old new; do
  bin=$S/ds4server; [ $who = old ] && bin=$R/.gpu-old/ds4server
  echo "== $who qwen4_exp 24 layers --streams 1,64 $(date +%T)" >> "$O/qwen4.log"
  timeout 150 $bin bench $Q 2>&1 | grep -v "^REPORT stream " >> "$O/qwen4.log"
done
for who in old new; do
  bin=$S/ds4server; [ $who = old ] && bin=$R/.gpu-old/ds4server
  echo "== $who deepseek_v4 32 layers --streams ${STREAMS:-1,16,64} $(date +%T)" >> "$O/ds4-streams.log"
  timeout 200 $bin bench $D --streams ${STREAMS:-1,16,64} --prompts 128 --gen 32 2>&1 | grep -v "^REPORT stream \|^REPORT weights" >> "$O/ds4-streams.log"
done
echo "== new step $(date +%T)" >> "$O/ds4.log"
timeout 150 $S/ds4server bench $D --prompts 512 --gen 32 2>&1 | grep -E "^REPORT|rror|panic" >> "$O/ds4.log"
echo "total s=$SECONDS" >> "$O/ds4.log"
