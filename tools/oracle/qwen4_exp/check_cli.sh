#!/usr/bin/env bash
# `ds4server debug logits` on the qwen4_exp fixtures (one forward, chunks of
# 7, prefill 30 + 10 steps) against transformers' full-forward logits.
#   tools/oracle/qwen4_exp/check_cli.sh [path/to/ds4server]
# Fails when any row differs by more than 1e-4 (the engine tests' bound).
set -euo pipefail
cd "$(dirname "$0")/../../.."
BIN=${1:-target/debug/ds4server}
PY=tools/oracle/.venv/bin/python
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for f in tiny_a tiny_b tiny_bf16; do
  fx=tests/fixtures/qwen4_exp
  ids=$($PY -c "from safetensors.torch import load_file; r=load_file('$fx/$f.ref.safetensors'); print(','.join(str(int(x)) for x in r['input_ids']))")
  "$BIN" debug logits --model "$fx/$f" --tokens "$ids" --out "$TMP/one.st" 2>/dev/null
  "$BIN" debug logits --model "$fx/$f" --tokens "$ids" --chunk 7 --out "$TMP/chunk.st" 2>/dev/null
  "$BIN" debug logits --model "$fx/$f" --tokens "$ids" --prefill 30 --steps 10 --out "$TMP/steps.st" 2>/dev/null
  $PY - "$fx/$f.ref.safetensors" "$TMP" "$f" <<'PY'
import sys
from safetensors.torch import load_file
ref = load_file(sys.argv[1])["logits_full"]
for mode in ["one", "chunk", "steps"]:
    d = float((load_file(f"{sys.argv[2]}/{mode}.st")["logits"] - ref).abs().max())
    print(f"{sys.argv[3]} {mode}: max |Δ| vs transformers = {d:.3g}")
    assert d <= 1e-4, d
PY
done
