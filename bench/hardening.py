#!/usr/bin/env python3
"""Transport and safety measurements of `ds4server serve` (a benchmark, not
a test: it prints numbers, it asserts nothing).

  bench/hardening.py [--bin target/release/ds4server] [--model F]
                     [--clients 32] [--disconnect 0.3] [--max-tokens 64]
                     [--body-mib 7] [--max-queue N] [--only load,shutdown,body]

- load: N streaming clients at once, each sending one chat request; a
  fraction (chosen with a fixed seed) disconnects after its first token.
  Reports completed, 503s, other errors, p50/p95 time to first token and
  total latency of the completed ones, and the server's peak RSS (VmHWM).
- shutdown: one long stream in flight, then SIGTERM; seconds until the
  process has exited.
- body: a chat body of --body-mib MiB (over the context); the server's RSS
  before, its peak (VmHWM) after, and its RSS once answered, plus how long
  the 400 took.

Every server is started fresh on a free loopback port with the default
model (or --model) and stopped at the end. Only the standard library.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Server:
    def __init__(self, binary, model, extra=()):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        args = [binary, "serve", "--port", str(self.port), "--model-id", "m"]
        if model:
            args += ["--model", model]
        self.proc = subprocess.Popen(args + list(extra), stdout=self.log, stderr=self.log)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                sys.exit("server exited:\n" + self.log.read().decode(errors="replace"))
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        sys.exit("server did not come up")

    def status_kib(self, key):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def chat_body(text, max_tokens, stream=True):
    return json.dumps({
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": stream,
    }).encode()


def first_text(line):
    try:
        chunk = json.loads(line[5:])
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") for c in chunk.get("choices", []))


def one_client(port, body, disconnect, out):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            r.read()
            out.append(("status", r.status, None, None))
            return
        ttft = None
        while True:
            line = r.fp.readline()
            # The connection is kept alive after the stream: stop at its end.
            if not line or line.startswith(b"data: [DONE]"):
                break
            if line.startswith(b"data:"):
                # The first token: the first chunk with text in it (the
                # opening chunk carries only the role and an empty string).
                if ttft is None and first_text(line):
                    ttft = time.perf_counter() - t0
                    if disconnect:
                        out.append(("disconnected", 200, ttft, None))
                        return
        out.append(("completed", 200, ttft, time.perf_counter() - t0))
    except OSError as e:
        out.append(("error", str(e), None, None))
    finally:
        c.close()


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def load(args):
    extra = ["--max-queue", str(args.max_queue)] if args.max_queue is not None else []
    s = Server(args.bin, args.model, extra)
    try:
        rng = random.Random(1)
        results = []
        threads = []
        prompts = [f"Write a short note number {i} about the sea." for i in range(args.clients)]
        for i in range(args.clients):
            drop = rng.random() < args.disconnect
            t = threading.Thread(
                target=one_client,
                args=(s.port, chat_body(prompts[i], args.max_tokens), drop, results),
            )
            threads.append(t)
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        time.sleep(0.5)
        peak = s.status_kib("VmHWM") / 1024
        done = [r for r in results if r[0] == "completed"]
        kinds = {}
        for r in results:
            key = r[0] if r[0] != "status" else f"http {r[1]}"
            kinds[key] = kinds.get(key, 0) + 1
        ttft = [r[2] for r in done if r[2] is not None]
        lat = [r[3] for r in done]
        queue = args.max_queue if args.max_queue is not None else "default"
        print(f"load: {args.clients} clients, {args.disconnect:.0%} disconnect after the first token, "
              f"max_tokens {args.max_tokens}, --max-queue {queue}, wall {wall:.1f} s")
        print(f"  outcomes: {json.dumps(kinds, sort_keys=True)}")
        print(f"  completed TTFT p50 {pct(ttft, 50):.2f} s, p95 {pct(ttft, 95):.2f} s; "
              f"latency p50 {pct(lat, 50):.2f} s, p95 {pct(lat, 95):.2f} s")
        print(f"  server peak RSS {peak:.0f} MiB")
    finally:
        s.stop()


def shutdown(args):
    s = Server(args.bin, args.model)
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=600)
    body = json.dumps({"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 2000,
                       "temperature": 0, "stream": True}).encode()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    seen = 0
    while seen < 5:
        if r.fp.readline().startswith(b"data:"):
            seen += 1
    t0 = time.perf_counter()
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait()
    took = time.perf_counter() - t0
    print(f"shutdown: SIGTERM with a 2000-token stream in flight -> exited in {took:.2f} s")
    c.close()


def body(args):
    s = Server(args.bin, args.model, ["--body-limit", str((args.body_mib + 1) << 20)])
    try:
        text = "All work and no play makes Jack a dull boy. " * (args.body_mib * 1024 * 1024 // 44)
        payload = chat_body(text, 1, stream=False)
        before = s.status_kib("VmRSS") / 1024
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=600)
        c.request("POST", "/v1/chat/completions", payload, {"Content-Type": "application/json"})
        r = c.getresponse()
        answer = r.read()
        took = time.perf_counter() - t0
        time.sleep(0.5)
        peak = s.status_kib("VmHWM") / 1024
        after = s.status_kib("VmRSS") / 1024
        message = json.loads(answer).get("error", {}).get("message", "")[:90]
        print(f"body: {len(payload) / 2**20:.1f} MiB chat body -> {r.status} in {took:.2f} s ({message})")
        print(f"  server RSS before {before:.0f} MiB, peak {peak:.0f} MiB, after {after:.0f} MiB")
    finally:
        s.stop()


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default="target/release/ds4server")
    p.add_argument("--model", default=None)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--disconnect", type=float, default=0.3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--body-mib", type=int, default=7)
    # The server's queue (default 16: a 32-client burst gets 503s by design).
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--only", default="load,shutdown,body")
    args = p.parse_args()
    print(f"binary: {os.path.abspath(args.bin)}")
    # The numbers depend on what else the machine runs: say how busy it was.
    print(f"load average before: {loadavg()}")
    for part in args.only.split(","):
        {"load": load, "shutdown": shutdown, "body": body}[part](args)
        print(f"  load average after {part}: {loadavg()}")


if __name__ == "__main__":
    main()
