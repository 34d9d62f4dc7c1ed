#!/usr/bin/env python3
"""Regenerate tests/fixtures/quant/quantize/ (deterministic; see README.md).

llama.cpp's own C quantizers (ggml-quants.c of the llama-cpp-python 0.3.36
sdist, built by ggml_c.py) on fixed rows, one safetensors file per type and
path:

  <type>.safetensors          `quantize_<type>(..., quant_weights = NULL)`,
                              which is `quantize_row_<type>_ref` (checked
                              here: both must give the same bytes); Q8_K,
                              which has no `quantize_q8_K`, from
                              `quantize_row_q8_K_ref`.
  <type>_imatrix.safetensors  `quantize_<type>(..., quant_weights)`: the
                              importance-weighted search llama-quantize runs
                              with --imatrix (the only path for IQ2_XXS).
  iq4_nl.safetensors          `quantize_iq4_nl(..., NULL)` (no `_ref`
                              check: the `_ref` differs, see PLAIN).

Each file: F32 `values` [rows, row_len], U8 `blocks` [rows, row bytes], and
in the _imatrix files F32 `importance` [row_len] (one weight per column, as
an imatrix entry), plus one metadata key `fixture`.

Usage: tools/oracle/.venv/bin/python tools/oracle/quant/quantize.py
           [--sdist llama_cpp_python-0.3.36.tar.gz]
Without --sdist the pinned sdist is fetched with pip (its sha256 is checked).
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys
import tempfile

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ggml_c  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "quant", "quantize")
SEED = 20_260_148
ROW_LEN = 512  # two K super-blocks, sixteen 32-value blocks

# (name, ggml type id, block values, block bytes, C entry, has an imatrix path)
TYPES = [
    ("q4_0", 2, 32, 18, "quantize_q4_0", True),
    ("q4_1", 3, 32, 20, "quantize_q4_1", True),
    ("q5_0", 6, 32, 22, "quantize_q5_0", True),
    ("q5_1", 7, 32, 24, "quantize_q5_1", True),
    ("q8_0", 8, 32, 34, "quantize_q8_0", False),
    ("mxfp4", 39, 32, 17, "quantize_mxfp4", False),
    ("q2_k", 10, 256, 84, "quantize_q2_K", True),
    ("q3_k", 11, 256, 110, "quantize_q3_K", True),
    ("q4_k", 12, 256, 144, "quantize_q4_K", True),
    ("q5_k", 13, 256, 176, "quantize_q5_K", True),
    ("q6_k", 14, 256, 210, "quantize_q6_K", True),
    ("q8_k", 15, 256, 292, None, False),
    ("iq2_xxs", 16, 256, 66, "quantize_iq2_xxs", True),
    ("iq4_nl", 20, 32, 18, "quantize_iq4_nl", True),
]
# Types whose no-importance file is `quantize_<type>(..., NULL)` itself, not
# a `_ref`: `quantize_iq4_nl` searches 15 scales (ntry = 7) where
# `quantize_row_iq4_nl_ref` passes ntry = -1, and llama-quantize calls the
# former. Their stress entry stores the sha256 under "plain".
PLAIN = {"iq4_nl"}
REF = {"q4_0": "quantize_row_q4_0_ref", "q4_1": "quantize_row_q4_1_ref",
       "q5_0": "quantize_row_q5_0_ref", "q5_1": "quantize_row_q5_1_ref",
       "q8_0": "quantize_row_q8_0_ref", "mxfp4": "quantize_row_mxfp4_ref",
       "q2_k": "quantize_row_q2_K_ref", "q3_k": "quantize_row_q3_K_ref",
       "q4_k": "quantize_row_q4_K_ref", "q5_k": "quantize_row_q5_K_ref",
       "q6_k": "quantize_row_q6_K_ref", "q8_k": "quantize_row_q8_K_ref"}
GGML_TYPE_IQ2_XXS = 16


def edge_rows(rng):
    """Rows that reach the searches' corner cases, then Gaussian rows."""
    n = ROW_LEN
    g = lambda s: rng.normal(0.0, s, n)  # noqa: E731
    rows = [
        np.zeros(n),                                      # every group all zero
        np.where(np.arange(n) == 77, 1e7, g(0.02)),       # one huge outlier (f16 scale overflow for Q8_0)
        np.where(np.arange(n) == 300, -3e3, g(1.0)),      # a negative outlier in the second super-block
        np.full(n, 0.375),                                # all equal, positive
        np.full(n, -1.25),                                # all equal, negative
        g(1.0) * 1e-40,                                   # f32 subnormals: 1/d overflows, scales flush to 0
        g(1.0) * 1e-9,                                    # normal but below f16's subnormals once scaled
        g(1.0) * 3e-6,                                    # scales in f16's subnormal range
        -np.abs(g(0.05)),                                 # negative only
        np.abs(g(0.05)),                                  # positive only
        rng.integers(-8, 9, n) * 0.25,                    # exact grid points: rounding ties everywhere
        np.where(rng.random(n) < 0.8, 0.0, g(0.1)),       # sparse
        # group magnitudes from zero to large within one row
        g(1.0) * np.repeat(np.array([0, 1e-3, 1, 0, 30, 1e-5, 0.02, 2] * 2), n // 16),
        rng.uniform(-1.0, 1.0, n),
        g(0.02),
        g(0.02) + 0.01,                                   # Gaussian with an offset (min != -max)
        # f32 overflow inside the searches (squares, sums, reciprocals):
        # inf/NaN intermediates, x86's float-to-int casts, f16 scales of inf
        g(1.0) * 1e19,
        g(1.0) * 1e30,
        np.where(np.arange(n) == 5, 3e38, g(1.0)),
    ]
    return np.stack(rows).astype(np.float32)


def importance_row(rng):
    """One weight per column, as an imatrix entry (mean squared activations):
    spread over decades, some zeros (a whole group of 16 among them), a few
    large."""
    w = rng.lognormal(0.0, 1.5, ROW_LEN)
    w[rng.random(ROW_LEN) < 0.05] = 0.0
    w[32:48] = 0.0
    w[rng.integers(0, ROW_LEN, 3)] *= 1e3
    return w.astype(np.float32)


# ------------------------------------------------------------ the stress set
#
# Many more rows than the fixtures could hold, made from an integer generator
# that the Rust test reproduces bit for bit (splitmix64, floats built from
# bits and combined by f32 operations in a fixed order), so only a sha256 of
# llama.cpp's blocks per type and path is stored (stress.json).

STRESS_ROWS = 1024
STRESS_DRAWS = 4 * ROW_LEN + 2  # u64 draws per row
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(seed, n):
    """Outputs 1..n of splitmix64 from state `seed`."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + GOLDEN * np.arange(1, n + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform(z):
    """[-1, 1): 23 random mantissa bits in [1, 2), then 2u - 3."""
    bits = (np.uint64(0x3F800000) | (z >> np.uint64(41))).astype(np.uint32)
    return bits.view(np.float32) * np.float32(2.0) - np.float32(3.0)


def stress_rows(seed):
    """STRESS_ROWS rows; row r's kind is r % 6 (uniform, sum of three
    uniforms, offset, 60 % zeros, product, one value ×64), scaled by 2^e,
    e in [-40, 12] (f16 scales from underflow to typical)."""
    z = splitmix64(seed, STRESS_ROWS * STRESS_DRAWS).reshape(STRESS_ROWS, STRESS_DRAWS)
    u = [uniform(z[:, k * ROW_LEN:(k + 1) * ROW_LEN]) for k in range(4)]
    e = (z[:, 4 * ROW_LEN] % np.uint64(53)).astype(np.int64) - 40
    s = ((127 + e).astype(np.uint32) << np.uint32(23)).view(np.float32)[:, None]
    g = (u[0] + u[1]) + u[2]
    kind = (np.arange(STRESS_ROWS) % 6)[:, None]
    rows = np.select(
        [kind == 0, kind == 1, kind == 2, kind == 3, kind == 4, kind == 5],
        [u[0] * s, g * s, (g + np.float32(0.5)) * s,
         np.where(u[3] > np.float32(0.2), np.float32(0.0), g * s),
         (g * u[3]) * s, g * s]).astype(np.float32)
    at = (z[:, 4 * ROW_LEN + 1] % np.uint64(ROW_LEN)).astype(np.int64)
    for r in np.flatnonzero(kind[:, 0] == 5):
        rows[r, at[r]] = rows[r, at[r]] * np.float32(64.0)
    return np.ascontiguousarray(rows)


def stress_importance(seed):
    """(u + 1)^4, zero where u < -0.8."""
    u = uniform(splitmix64(seed, ROW_LEN))
    t = u + np.float32(1.0)
    w = (t * t) * (t * t)
    return np.where(u < np.float32(-0.8), np.float32(0.0), w).astype(np.float32)


def ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def c_quantize(lib, entry, values, row_bytes, importance):
    rows = values.shape[0]
    out = np.zeros((rows, row_bytes), dtype=np.uint8)
    fn = getattr(lib, entry)
    fn.restype = ctypes.c_size_t
    wrote = fn(ptr(values), ptr(out), ctypes.c_int64(rows), ctypes.c_int64(ROW_LEN),
               None if importance is None else ptr(importance))
    assert wrote == out.size, (entry, wrote, out.size)
    return out


def c_ref(lib, entry, values, row_bytes):
    out = np.zeros((values.shape[0], row_bytes), dtype=np.uint8)
    fn = getattr(lib, entry)
    fn.restype = None
    fn(ptr(values), ptr(out), ctypes.c_int64(values.size))
    return out


def write(name, values, blocks, importance, meta):
    """One metadata key: safetensors writes a map's keys in hash order, which
    would make reruns differ byte-wise."""
    tensors = {"values": np.ascontiguousarray(values, dtype=np.float32),
               "blocks": np.ascontiguousarray(blocks, dtype=np.uint8)}
    if importance is not None:
        tensors["importance"] = np.ascontiguousarray(importance, dtype=np.float32)
    path = os.path.join(OUT, f"{name}.safetensors")
    save_file(tensors, path, metadata={"fixture": json.dumps(meta, sort_keys=True)})
    print(f"{path}: {values.shape[0]} rows of {values.shape[1]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", help=f"llama_cpp_python-{ggml_c.LLAMA_CPP_PYTHON}.tar.gz")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    oracle = (f"llama.cpp ggml-quants.c via llama-cpp-python {ggml_c.LLAMA_CPP_PYTHON} sdist, "
              f"gcc {' '.join(ggml_c.CFLAGS[:4])}")
    results = []
    stress = {"rows": STRESS_ROWS, "row_len": ROW_LEN, "oracle": None, "types": {}}
    with tempfile.TemporaryDirectory() as work:
        lib = ggml_c.build(args.sdist or ggml_c.fetch_sdist(work), work)
        lib.iq2xs_init_impl.restype = None
        lib.iq2xs_init_impl(ctypes.c_int(GGML_TYPE_IQ2_XXS))
        for i, (name, _, block_len, block_bytes, entry, imatrix) in enumerate(TYPES):
            rng = np.random.default_rng([SEED, i])
            values = edge_rows(rng)
            importance = importance_row(rng)
            row_bytes = ROW_LEN // block_len * block_bytes
            seed = f"[{SEED}, {i}]"
            if name in REF:
                ref = c_ref(lib, REF[name], values, row_bytes)
                if entry is not None:
                    plain = c_quantize(lib, entry, values, row_bytes, None)
                    if not np.array_equal(plain, ref):
                        sys.exit(f"{name}: {entry}(NULL) differs from {REF[name]}; nothing written")
                    if not imatrix:  # the entry ignores the importance
                        ignored = c_quantize(lib, entry, values, row_bytes, importance)
                        if not np.array_equal(ignored, ref):
                            sys.exit(f"{name}: {entry} uses quant_weights; nothing written")
                results.append((name, values, ref, None,
                                {"type": name.upper(), "oracle": oracle,
                                 "function": REF[name], "seed": seed}))
            if name in PLAIN:
                plain = c_quantize(lib, entry, values, row_bytes, None)
                results.append((name, values, plain, None,
                                {"type": name.upper(), "oracle": oracle,
                                 "function": f"{entry} with quant_weights = NULL",
                                 "seed": seed}))
            if imatrix:
                blocks = c_quantize(lib, entry, values, row_bytes, importance)
                results.append((f"{name}_imatrix", values, blocks, importance,
                                {"type": name.upper(), "oracle": oracle,
                                 "function": f"{entry} with quant_weights", "seed": seed}))
            # The stress set: rows from seed SEED·1000 + i, the importance
            # from SEED·1000 + 500 + i; the inputs' hashes tell a generator
            # mismatch from a quantizer one.
            entry_stress = {"seed": SEED * 1000 + i}
            rows = stress_rows(entry_stress["seed"])
            sha = {"values": hashlib.sha256(rows).hexdigest()}
            if name in REF:
                sha["ref"] = hashlib.sha256(c_ref(lib, REF[name], rows, row_bytes)).hexdigest()
            if name in PLAIN:
                sha["plain"] = hashlib.sha256(
                    c_quantize(lib, entry, rows, row_bytes, None)).hexdigest()
            if imatrix:
                entry_stress["importance_seed"] = SEED * 1000 + 500 + i
                w = stress_importance(entry_stress["importance_seed"])
                sha["importance"] = hashlib.sha256(w).hexdigest()
                sha["imatrix"] = hashlib.sha256(
                    c_quantize(lib, entry, rows, row_bytes, w)).hexdigest()
            entry_stress["sha256"] = sha
            stress["types"][name] = entry_stress
    for result in results:
        write(*result)
    stress["oracle"] = oracle
    with open(os.path.join(OUT, "stress.json"), "w") as f:
        json.dump(stress, f, indent=1, sort_keys=True)
        f.write("\n")
    manifest = sorted(f for f in os.listdir(OUT) if f.endswith(".safetensors"))
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in manifest)
    print(json.dumps(manifest), f"{total} bytes")


if __name__ == "__main__":
    main()
