#!/usr/bin/env bash
# Build the CUDA test binary and ds4server here (no GPU, no CUDA toolkit
# needed) and pack them, stripped and gzipped, with run.sh into .gpu/ for
# the GPU machine (see docs/GPU.md). Usage: tools/gpu/package.sh [DEST]
# (DEST defaults to .gpu in the repository root; it must be ignored by git).
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-.gpu}
# The binary's path as cargo reports it. target/release/ds4server is a hard
# link cargo refreshes only when it rebuilds: a build of another checkout
# into the same target dir leaves that checkout's binary there (run 22
# carried one), so remove it and let cargo link this checkout's again.
rm -f target/release/ds4server
bin=$(cargo build --release --locked -p ds4server --features cuda --message-format=json |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "ds4server" and m.get("executable"):
        print(m["executable"])' | tail -1)
[ -n "$bin" ] || { echo "ds4server did not build" >&2; exit 1; }
# The test executable's path is printed by cargo; take the `cuda` target's.
exe=$(cargo test --release --locked -p ds4-engine --features cuda --test cuda --no-run \
  --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda" and m.get("executable"):
        print(m["executable"])' | tail -1)
[ -n "$exe" ] || { echo "the cuda test binary did not build" >&2; exit 1; }
rm -rf "$dest" && mkdir -p "$dest"
cp "$exe" "$dest/cuda"
cp "$bin" "$dest/ds4server"
strip "$dest/cuda" "$dest/ds4server"
gzip -9 "$dest/cuda" "$dest/ds4server"
cp tools/gpu/run.sh tools/gpu/ab.sh "$dest/"
# Optional, for the `llamacpp` and `compare` steps: llama.cpp's sources and
# the default model's tokenizer metadata (tools/gpu/vocab_gguf.py).
[ -n "${LLAMA_SRC_TGZ:-}" ] && cp "$LLAMA_SRC_TGZ" "$dest/llama-src.tgz"
[ -n "${VOCAB_GGUF:-}" ] && cp "$VOCAB_GGUF" "$dest/vocab.gguf"
ls -la "$dest"
