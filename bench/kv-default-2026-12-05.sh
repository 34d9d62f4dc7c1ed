#!/usr/bin/env bash
# The KV cache default (issue 46/47, rule 6 (d)): f32 against f16 on the
# fast kernel set, side by side in one run, two interleaved pairs each:
# cold prompts of 128 and 4096 tokens with 64 generated at that depth, then
# 1 and 8 batched streams. Usage: bench/kv-default-2026-12-05.sh [BINARY]
set -euo pipefail
B=${1:-target/release/ds4server}
for pair in 1 2; do
  for kv in f32 f16; do
    echo "== pair $pair, --kv-cache $kv: bench --prompts 128,4096 --gen 64"
    "$B" bench --prompts 128,4096 --gen 64 --kv-cache "$kv" 2>/dev/null
  done
done
for pair in 1 2; do
  for kv in f32 f16; do
    echo "== pair $pair, --kv-cache $kv: bench --streams 1,8 --prompts 128 --gen 64"
    "$B" bench --streams 1,8 --prompts 128 --gen 64 --kv-cache "$kv" 2>/dev/null
  done
done
