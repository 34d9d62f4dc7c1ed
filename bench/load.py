#!/usr/bin/env python3
"""Concurrent load on a running `ds4server serve` (issue 47's scenario).

CLIENTS threads each send REQUESTS streaming /v1/completions requests one
after another: a distinct prompt of about PROMPT_WORDS words cut from
bench/corpus.txt, MAX_TOKENS tokens out, greedy. Reported: requests
refused (503), time to first token (p50 / p90 / max over accepted
requests), tokens received (a request ending on its length counts
MAX_TOKENS; else its deltas with text), wall time, aggregate tokens per
second.

    python3 bench/load.py --url http://127.0.0.1:8080 --clients 32 --requests 2

Standard library only.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def one(url, prompt, max_tokens):
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    start = time.monotonic()
    first = None
    tokens = 0
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[5:])["choices"][0]
                if choice.get("text"):
                    tokens += 1
                    if first is None:
                        first = time.monotonic() - start
                if choice.get("finish_reason") == "length":
                    # Every token counted (some deltas carry no text).
                    tokens = max_tokens
    except urllib.error.HTTPError as e:
        return {"status": e.code}
    return {"status": 200, "ttft": first, "tokens": tokens}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--prompt-words", type=int, default=150)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    words = (Path(__file__).parent / "corpus.txt").read_text().split()
    results = []
    lock = threading.Lock()

    def client(c):
        for r in range(args.requests):
            at = (c * 97 + r * 31) % (len(words) - args.prompt_words)
            prompt = " ".join(words[at : at + args.prompt_words])
            out = one(args.url, prompt, args.max_tokens)
            with lock:
                results.append(out)

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    ok = [r for r in results if r["status"] == 200]
    refused = sum(1 for r in results if r["status"] == 503)
    other = len(results) - len(ok) - refused
    ttfts = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
    tokens = sum(r["tokens"] for r in ok)

    def pct(p):
        return ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else float("nan")

    print(
        f"clients={args.clients} requests={len(results)} accepted={len(ok)} "
        f"refused_503={refused} other_errors={other}"
    )
    print(
        f"ttft_s p50={pct(0.5):.2f} p90={pct(0.9):.2f} max={ttfts[-1] if ttfts else float('nan'):.2f}"
    )
    print(f"tokens={tokens} wall_s={wall:.1f} aggregate_tok_s={tokens / wall:.1f}")


if __name__ == "__main__":
    main()
