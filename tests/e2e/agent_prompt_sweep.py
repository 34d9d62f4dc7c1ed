#!/usr/bin/env python3
"""Check that the coding-agent e2e turns end the same way whatever the date.

Claude Code and Codex write the date (and Claude Code the kernel's version)
into their prompts. The e2e servers decode greedily, so each day's prompt
has one reply; a 135M model can loop on some of them until the output
limit, which the agent reports as a failed turn. This tool records the
requests an agent test sends, then replays each with the date (and OS
version) replaced, and fails if any replay stops for length or runs past
--max-tokens. Run it after changing a pinned client, the default model or
the tests' prompts; it is not part of the suite (a two-year sweep is
~1,500 turns).

  tests/e2e/agent_prompt_sweep.py --client codex --base URL [--days 760]
  tests/e2e/agent_prompt_sweep.py --client claude --base URL --os "Linux 6.1.0-28-amd64"

BASE is a server started as tests/e2e/run.sh starts the agent's
(`--temperature 0 --seed 1`); the client binaries come from
$DS4_E2E_CLIENTS (default target/e2e-clients)."""

import argparse
import datetime
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTES = ("/v1/responses", "/v1/messages")


def recording_proxy(upstream, recorded):
    """A loopback proxy in front of `upstream` that keeps the body of every
    generation request the server answered with 200 (responses are passed
    through whole, streams included)."""

    class Proxy(http.server.BaseHTTPRequestHandler):
        def forward(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            req = urllib.request.Request(upstream + self.path, data=body or None, method=self.command, headers=headers)
            try:
                r = urllib.request.urlopen(req, timeout=1800)
                code, rh, data = r.status, r.headers, r.read()
            except urllib.error.HTTPError as e:
                code, rh, data = e.code, e.headers, e.read()
            # Only turns the server ran: a refused one (the context
            # error Claude Code's test provokes) has no reply to vary.
            if code == 200 and self.command == "POST" and self.path.split("?")[0] in ROUTES:
                recorded.append((self.path.split("?")[0], body))
            self.send_response(code)
            for k, v in rh.items():
                if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(k, v)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = forward

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def record(client, base):
    """Run the client's e2e test through the proxy; return the recorded
    generation requests."""
    recorded = []
    proxy = recording_proxy(base, recorded)
    url = f"http://127.0.0.1:{proxy.server_address[1]}"
    bins = os.path.join(os.environ.get("DS4_E2E_CLIENTS", "target/e2e-clients"), "node_modules", ".bin")
    env = dict(os.environ)
    name = {"codex": "CODEX", "claude": "CLAUDE"}[client]
    env[f"DS4_E2E_{name}_BASE"] = url
    binary = os.path.realpath(os.path.join(bins, client))
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: install the pinned clients as .ci/run does, or set DS4_E2E_CLIENTS")
    env[f"DS4_E2E_{name}"] = binary
    script = {"codex": "test_codex.py", "claude": "test_claude_code.py"}[client]
    r = subprocess.run([sys.executable, os.path.join(HERE, script)], env=env, cwd=HERE, capture_output=True, text=True)
    print(r.stdout[-2000:], file=sys.stderr)
    proxy.shutdown()
    return recorded


def vary(body, date, os_version):
    text = body.decode()
    text = re.sub(r"<current_date>[0-9-]+</current_date>", f"<current_date>{date}</current_date>", text)
    text = re.sub(r"Today's date is [0-9-]+", f"Today's date is {date}", text)
    if os_version:
        text = re.sub(r"OS Version: [^\\\\\"]+", f"OS Version: {os_version}", text)
    req = json.loads(text)
    req["stream"] = False
    return json.dumps(req).encode()


def replay(base, route, body):
    req = urllib.request.Request(
        base + route,
        data=body,
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
    )
    try:
        r = json.load(urllib.request.urlopen(req, timeout=1800))
    except urllib.error.HTTPError as e:
        return e.code, 0, e.read().decode()[:70]
    if route == "/v1/messages":
        text = "".join(c.get("text", "") for c in r["content"] if c["type"] == "text")
        return r["stop_reason"], r["usage"]["output_tokens"], text
    text = "".join(c.get("text", "") for o in r["output"] if o["type"] == "message" for c in o["content"])
    return r["status"], r["usage"]["output_tokens"], text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=("codex", "claude"), required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--days", type=int, default=760, help="dates from --start on")
    ap.add_argument("--start", default=datetime.date.today().isoformat())
    ap.add_argument("--os", action="append", default=[], help="OS version strings to try (Claude Code)")
    ap.add_argument("--max-tokens", type=int, default=1024, help="a longer reply counts as a failure")
    a = ap.parse_args()
    recorded = [(route, body) for route, body in record(a.client, a.base) if b"<current_date>" in body or b"Today's date is" in body]
    if not recorded:
        sys.exit("recorded no dated generation request")
    start = datetime.date.fromisoformat(a.start)
    bad = 0
    for i, (route, body) in enumerate(recorded):
        for os_version in a.os or [None]:
            replies = {}
            for d in range(a.days):
                date = (start + datetime.timedelta(days=d)).isoformat()
                stop, tokens, text = replay(a.base, route, vary(body, date, os_version))
                ok = stop in ("completed", "end_turn") and tokens <= a.max_tokens
                bad += not ok
                replies.setdefault((stop, tokens, text[:60]), []).append(date)
                if not ok:
                    print(f"FAIL request {i} {os_version or ''} {date}: {stop} after {tokens} tokens: {text[:70]!r}")
            for (stop, tokens, text), dates in sorted(replies.items(), key=lambda kv: -len(kv[1])):
                print(f"request {i} {os_version or ''}: {len(dates)} dates -> {stop}, {tokens} tokens, {text!r}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
