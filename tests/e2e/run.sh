#!/usr/bin/env bash
# End-to-end: start `ds4server serve` on free loopback ports — the default
# model, and a tiny DeepSeek-V4 checkpoint with the real tokenizer — run the
# official openai and anthropic clients against them, stop them.
# Usage: tests/e2e/run.sh [path/to/ds4server]   (default: target/release/ds4server)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/ds4server}"
work="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

# start NAME ARGS...: serve on a free port; prints the base URL.
start() {
  local name="$1"
  shift
  local port
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$bin" serve --port "$port" "$@" >"$work/$name.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 1 600); do
    if python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
      echo "http://127.0.0.1:$port"
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "the $name server exited:" >&2
      cat "$work/$name.log" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "the $name server did not come up" >&2
  return 1
}

python3 tests/e2e/dsv4_chat_model.py "$work/dsv4_chat" >/dev/null
DS4_E2E_BASE="$(start default --model-id smollm2)"
DS4_E2E_DSV4_BASE="$(start deepseek_v4 --model "$work/dsv4_chat" --model-id deepseek-v4-flash)"
export DS4_E2E_BASE DS4_E2E_DSV4_BASE
status=0
python3 tests/e2e/test_openai.py || status=1
python3 tests/e2e/test_anthropic.py || status=1
python3 tests/e2e/test_deepseek.py || status=1
exit "$status"
