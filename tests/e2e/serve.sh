# Sourced by tests/e2e/run.sh and tests/browser/run.sh: start `ds4server
# serve` instances on free loopback ports and stop them all on exit.
# Needs $bin (the binary) set before sourcing.
#
# `start` runs inside `$(...)`, a subshell, so it records each server's pid
# in a file (a variable set there would be lost and the trap would stop
# nothing).
work="$(mktemp -d)"
trap 'for f in "$work"/*.pid; do [ -e "$f" ] || continue; p="$(cat "$f")"; kill "$p" 2>/dev/null || true; while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done; rm -rf "$work"' EXIT

# start NAME ARGS...: serve on a free port; prints the base URL.
start() {
  local name="$1"
  shift
  local port
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$bin" serve --port "$port" "$@" >"$work/$name.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$work/$name.pid"
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
