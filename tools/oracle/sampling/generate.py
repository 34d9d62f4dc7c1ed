#!/usr/bin/env python3
"""Regenerate every sampling fixture (deterministic; see README.md).

Writes tests/fixtures/sampling/:
  pcg64_random.json      first 1000 Generator.random() of default_rng(seed)
  xorshift64star.json    first 1000 outputs / uniforms of the C reference
  nucleus_cases.jsonl    nucleus-law replay inputs
  nucleus_expected.jsonl expected replay output (NumPy + nucleus_ref.py)
  ds4_cases.jsonl        ds4-law replay inputs
  ds4_expected.jsonl     expected replay output (ds4_ref.c)
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "sampling")
sys.path.insert(0, HERE)
import nucleus_ref  # noqa: E402

STREAM_SEEDS = [0, 1, 42, 2**31 - 2, 2**40 + 7]
XOR_SEEDS = [0, 1, 42, 12345, 2**31 - 2, 2**40 + 7, 2**64 - 1]
CASE_SEEDS = [0, 1, 42, 2**31 - 2, 2**40 + 7]
N_CASES = {"nucleus": 2400, "ds4": 2400}


def f32(x):
    return float(np.float32(x))


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64_bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def logit_json(x):
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def make_row(g, v):
    """A logits row (list of f32-valued floats) of one of several shapes."""
    shape = g.integers(0, 12)
    if shape == 0:  # smooth, realistic
        row = g.normal(0, 3, v)
    elif shape == 1:  # heavy ties
        row = g.integers(-3, 4, v) * 0.5
    elif shape == 2:  # all equal
        row = np.full(v, g.normal())
    elif shape == 3:  # partial -inf mask
        row = g.normal(0, 2, v)
        row[g.random(v) < 0.5] = -np.inf
        if np.all(np.isneginf(row)):
            row[g.integers(0, v)] = 1.0
    elif shape == 4:  # single finite entry
        row = np.full(v, -np.inf)
        row[g.integers(0, v)] = g.normal()
    elif shape == 5:  # peaked: one or two dominant tokens
        row = g.normal(0, 1, v)
        row[g.integers(0, v)] += 12
        row[g.integers(0, v)] += g.choice([0.0, 12.0])
    elif shape == 6:  # large magnitudes
        row = g.normal(0, 1e4, v)
    elif shape == 7:  # tiny spread
        row = 3.0 + g.random(v) * 1e-6
    elif shape == 8:  # signed zeros and a few positives
        row = np.where(g.random(v) < 0.5, -0.0, 0.0)
        row[g.integers(0, v)] = 0.5
    elif shape == 9:  # non-finite entries (invalid for the nucleus law)
        row = g.normal(0, 2, v)
        kind = g.integers(0, 4)
        if kind == 0:
            row[g.integers(0, v)] = np.nan
        elif kind == 1:
            row[g.integers(0, v)] = np.inf
        elif kind == 2:
            row[:] = -np.inf
        else:
            row[:] = np.nan
    elif shape == 10:  # ties at the top
        row = g.normal(0, 1, v)
        top = row.max() + 1
        row[g.choice(v, size=min(v, 3), replace=False)] = top
    else:  # uniform wide
        row = g.uniform(-20, 20, v)
    row = row.astype(np.float32)
    if shape not in (6, 7):
        # Most rows are bf16-valued, like real model logits (and their JSON
        # is shorter); large-magnitude and tiny-spread rows keep f32 detail.
        row = to_bf16(row)
    return [f32(x) for x in row]


def to_bf16(row):
    """Round f32 values to bf16 (nearest-even), keeping non-finite values."""
    bits = row.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(row), out, row).astype(np.float32)


def pick(g, options):
    return options[int(g.integers(0, len(options)))]


def make_case(g, law, idx):
    v = int(pick(g, [1, 2, 3, 4, 5, 8, 16, 20, 21, 32, 50, 64, 100, 257]))
    if law == "ds4" and g.random() < 0.01:
        v = 1100  # above ds4's 1024 top-k cap
    if law == "nucleus" and g.random() < 0.015:
        v = 600  # top_k = V-1 takes the partial-selection path (k > 256)
    row = make_row(g, v)
    temps = [0.0, 0.6, 0.6, 1.0, 1.0, 0.7, 1e-3, 1e-8, 5.0, 100.0, 1e6]
    temps += [1e-300, 1e-320] if law == "nucleus" else [1e-30, 1e30]
    case = {
        "id": f"{law}-{idx}",
        "logits": [logit_json(x) for x in row],
        "seed": int(pick(g, CASE_SEEDS + [int(g.integers(0, 2**63))])),
        "draws": int(pick(g, [1, 1, 2, 3, 5, 8, 20])),
        "temperature": float(pick(g, temps + [float(g.uniform(0.05, 3))])),
        "top_p": float(pick(g, [0.0, 0.3, 0.5, 0.95, 1.0, float(g.uniform(0.05, 1.0))])),
        "top_k": int(pick(g, [0, -1, 1, 2, 20, v - 1, v, v + 5, 1024, 2000])),
        "min_p": float(pick(g, [0.0, 0.05, 0.05, 0.1, 0.5, 1.0, float(g.uniform(0, 0.3))])),
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    if g.random() < 0.35:
        case["presence_penalty"] = float(pick(g, [0.5, -0.5, 1.5, 3.0, -3.0, float(g.uniform(-2, 2))]))
        case["frequency_penalty"] = float(pick(g, [0.0, 0.3, -1.0, 2.5, float(g.uniform(-2, 2))]))
        n = int(g.integers(1, 6))
        counts = {}
        for _ in range(n):
            tok = int(g.integers(0, v + 3))  # a few ids outside the row
            counts[str(tok)] = int(g.integers(0, 5))
        case["counts"] = counts
    return case


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def build_c():
    exe = os.path.join(tempfile.mkdtemp(), "ds4_ref")
    subprocess.run(
        ["gcc", "-O2", "-ffp-contract=off", "-std=c11", "-Wall", "-Wextra", "-Werror",
         os.path.join(HERE, "ds4_ref.c"), "-lm", "-o", exe],
        check=True,
    )
    return exe


def run_c(exe, text):
    return subprocess.run([exe], input=text, capture_output=True, text=True, check=True).stdout


def ds4_expected(exe, cases):
    lines = []
    for c in cases:
        row = [nucleus_ref.parse_logit(x) for x in c["logits"]]
        bits = " ".join(f"{f32_bits(np.float32(x)):x}" for x in row)
        lines.append(
            f"case {len(row)} {c['temperature']!r} {c['top_k']} {c['top_p']!r} {c['min_p']!r} "
            f"{c['seed']} {c['draws']} {bits}"
        )
    out = run_c(exe, "\n".join(lines) + "\n").splitlines()
    assert len(out) == len(cases)
    expected = []
    for c, line in zip(cases, out):
        toks, tail = line.split(";")
        draws, fallback = tail.split()
        e = {"id": c["id"], "tokens": [int(t) for t in toks.split()], "draws": int(draws)}
        if fallback == "1":
            e["argmax_fallback"] = True
        expected.append(e)
    return expected


def main():
    os.makedirs(OUT, exist_ok=True)
    # 1. PCG64 stream parity: Generator.random() as exact bit patterns.
    pcg = []
    for seed in STREAM_SEEDS:
        rng = np.random.default_rng(seed)
        pcg.append({"seed": seed, "random_bits": [f"{f64_bits(x):016x}" for x in rng.random(1000)]})
    with open(os.path.join(OUT, "pcg64_random.json"), "w") as f:
        json.dump(pcg, f, separators=(",", ":"))
        f.write("\n")

    exe = build_c()
    # 2. xorshift64* stream parity against the C reference.
    xs = []
    for seed in XOR_SEEDS:
        out = run_c(exe, f"stream {seed} 1000\n").split()
        xs.append({"seed": seed, "next_u64": out[0::2], "uniform_f32_bits": out[1::2]})
    with open(os.path.join(OUT, "xorshift64star.json"), "w") as f:
        json.dump(xs, f, separators=(",", ":"))
        f.write("\n")

    # 3. Law cases. One generator per law so each fixture set is stable on
    # its own (family isolation extends to the fixtures' provenance).
    for law, seed in (("nucleus", 20260101), ("ds4", 20260102)):
        g = np.random.default_rng(seed)
        cases = [make_case(g, law, i) for i in range(N_CASES[law])]
        if law == "nucleus":
            expected = [nucleus_ref.run_case(c) for c in cases]
        else:
            expected = ds4_expected(exe, cases)
        write_jsonl(os.path.join(OUT, f"{law}_cases.jsonl"), cases)
        write_jsonl(os.path.join(OUT, f"{law}_expected.jsonl"), expected)
        errors = sum(1 for e in expected if "error" in e)
        fallbacks = sum(1 for e in expected if e.get("argmax_fallback"))
        draws = sum(e.get("draws", 0) for e in expected)
        print(f"{law}: {len(cases)} cases, {errors} errors, {fallbacks} fallbacks, {draws} draws")


if __name__ == "__main__":
    main()
