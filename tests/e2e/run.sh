#!/usr/bin/env bash
# End-to-end: start `ds4server serve` (default model) on a free loopback
# port, run the official openai and anthropic clients against it, stop it.
# Usage: tests/e2e/run.sh [path/to/ds4server]   (default: target/release/ds4server)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/ds4server}"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
"$bin" serve --port "$port" --model-id smollm2 >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
  if python3 -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    echo "the server exited:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.5
done
export DS4_E2E_BASE="http://127.0.0.1:$port"
status=0
python3 tests/e2e/test_openai.py || status=1
python3 tests/e2e/test_anthropic.py || status=1
exit "$status"
