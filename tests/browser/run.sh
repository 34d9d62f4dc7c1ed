#!/usr/bin/env bash
# Browser: start `ds4server serve` on free loopback ports — the default model
# as is, and again with --api-key (and a small --ctx and no queue, for the
# key prompt and the too-long and busy messages) — and drive the page in
# Debian's headless Chromium with Playwright (tests/browser/test_page.py).
# Screenshots go to $DS4_BROWSER_SCREENSHOTS (default: a new temp dir; the
# path is printed).
# Usage: tests/browser/run.sh [path/to/ds4server]   (default: target/release/ds4server)
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

DS4_BROWSER_KEY="browser-test-key"
DS4_BROWSER_BASE="$(start open --model-id smollm2)"
DS4_BROWSER_KEY_BASE="$(start keyed --model-id smollm2 --api-key "$DS4_BROWSER_KEY" --ctx 2048 --max-queue 0)"
export DS4_BROWSER_BASE DS4_BROWSER_KEY_BASE DS4_BROWSER_KEY
python3 tests/browser/test_page.py
