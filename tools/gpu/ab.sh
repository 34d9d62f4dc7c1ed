#!/usr/bin/env bash
# A/B of full-size synthetic qwen4_exp decode: variants alternated within one
# device call (calls differ by up to 3%), from the repository root there.
# usage: bash .gpu/ab.sh "NAME:ENV=..;ENV=.." ...   (REPS rounds, default 2)
# BIN=./ds4server-old in a variant's list runs another binary.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}
export DS4_CUDA_CACHE=${DS4_CUDA_CACHE:-/tmp/ds4-cuda-cache}
cd .gpu
for f in *.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x cuda ds4server* 2>/dev/null
reps=${REPS:-2}
for r in $(seq 1 $reps); do
  for spec in "$@"; do
    name=${spec%%:*}; envs=${spec#*:}
    echo "== $name $r ($envs)"
    env $(echo "$envs" | tr ';' ' ') bash -c '"${BIN:-./ds4server}" bench --synthetic qwen4_exp --shape full --device cuda --ctx-start 512 --gen 64 ${BENCH_ARGS:-}' 2>&1 | grep -E "REPORT (prefill|verify|decode_digest|hbm|step_host|eager_windows)|rror"
  done
done 2>&1 | tee -a "$OUT/ab.log"
