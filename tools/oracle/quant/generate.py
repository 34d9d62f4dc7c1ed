#!/usr/bin/env python3
"""Regenerate tests/fixtures/quant/ (deterministic; see README.md).

One safetensors file per stored type, each with a U8 tensor `blocks` (the
stored bytes, one row per block or code) and an F32 tensor `values` (what the
reference decodes them to):

  GGUF block types   gguf-py 0.19.0 `gguf.quants.dequantize` (NumPy); Q8_K,
                     which gguf-py lacks, from llama.cpp's C
                     `dequantize_row_q8_K`. Every GGUF type is also run
                     through llama.cpp's C dequantizers (built from the
                     llama-cpp-python sdist with -O2 -ffp-contract=off) and
                     must agree bit for bit, or nothing is written.
  f8_e4m3, e8m0      all 256 codes decoded by torch (float8_e4m3fn,
                     float8_e8m0fnu).
  fp4_e2m1           all 256 bytes as E2M1 pairs (low nibble first) from the
                     OCP MX table below: torch 2.15 cannot convert
                     float4_e2m1fn_x2 to another dtype.

Usage: tools/oracle/.venv/bin/python tools/oracle/quant/generate.py
           [--sdist llama_cpp_python-0.3.36.tar.gz]
Without --sdist the pinned sdist is fetched with pip (its sha256 is checked).
"""

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from functools import partial
from importlib import metadata

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
OUT = os.path.join(ROOT, "tests", "fixtures", "quant")

LLAMA_CPP_PYTHON = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
GGUF_VERSION = "0.19.0"
SEED = 20_260_101

# Scale-field bit patterns every type is tried with: the largest finite
# f16 (both signs), subnormals (smallest, largest, negative), the smallest
# normal, +0 and -0. NaN/Inf scales are left out: the value of a block with
# one is NaN/Inf in every implementation and says nothing about the order of
# operations.
EXTREME_F16 = [0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x0400, 0x0000, 0x8000]
# Q8_K's f32 scale: FLT_MAX (products overflow to +-inf, as in C), f32
# subnormals (products round in the subnormal range), the smallest normal, zeros.
EXTREME_F32 = [0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x80000001, 0x007FFFFF,
               0x00800000, 0x00000000, 0x80000000]
# MXFP4's E8M0 byte: the subnormal halves (0, 1), 1.0, the largest. 255 is
# NaN in OCP MX but not in ggml's GGML_E8M0_TO_FP32_HALF, so it is not used.
EXTREME_E8M0 = [0, 1, 2, 127, 253, 254]

# (name, type, scale fields as (kind, byte offset), random blocks).
BLOCK_TYPES = [
    ("q4_0", T.Q4_0, [("f16", 0)], 40),
    ("q4_1", T.Q4_1, [("f16", 0), ("f16", 2)], 40),
    ("q5_0", T.Q5_0, [("f16", 0)], 40),
    ("q5_1", T.Q5_1, [("f16", 0), ("f16", 2)], 40),
    ("q8_0", T.Q8_0, [("f16", 0)], 40),
    ("mxfp4", T.MXFP4, [("e8m0", 0)], 40),
    ("q2_k", T.Q2_K, [("f16", 80), ("f16", 82)], 6),
    ("q3_k", T.Q3_K, [("f16", 108)], 6),
    ("q4_k", T.Q4_K, [("f16", 0), ("f16", 2)], 6),
    ("q5_k", T.Q5_K, [("f16", 0), ("f16", 2)], 6),
    ("q6_k", T.Q6_K, [("f16", 208)], 6),
    ("q8_k", T.Q8_K, [("f32", 0)], 6),
    ("iq2_xxs", T.IQ2_XXS, [("f16", 0)], 6),
    ("iq4_nl", T.IQ4_NL, [("f16", 0)], 40),
]

# OCP MX v1.0 E2M1: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def random_f16_bits(rng):
    """A finite f16: half the time a typical weight scale (2^-14 .. 2^-4),
    otherwise any finite bit pattern (every exponent, subnormals included)."""
    if rng.random() < 0.5:
        v = np.float16(rng.uniform(2.0**-14, 2.0**-4))
        bits = int(np.array(v).view(np.uint16))
    else:
        bits = int(rng.integers(0, 0x7C00))
    return bits | (0x8000 if rng.random() < 0.25 else 0)


def random_f32_bits(rng):
    if rng.random() < 0.5:
        return int(np.array(np.float32(rng.normal() * 1e-2)).view(np.uint32))
    return int(rng.integers(0, 0x7F800000)) | (0x80000000 if rng.random() < 0.5 else 0)


def put(block, kind, at, bits):
    if kind == "f16":
        block[at:at + 2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
    elif kind == "f32":
        block[at:at + 4] = np.frombuffer(np.uint32(bits).tobytes(), np.uint8)
    else:
        block[at] = bits


def make_blocks(rng, *, qtype, fields, n_random):
    """Random bodies; random scales in the first n_random blocks, then one
    block per extreme value (each scale field of a block takes a different
    extreme, so every field meets every extreme)."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    kind = fields[0][0]
    extremes = {"f16": EXTREME_F16, "f32": EXTREME_F32, "e8m0": EXTREME_E8M0}[kind]
    n = n_random + len(extremes)
    blocks = rng.integers(0, 256, size=(n, type_size), dtype=np.uint8)
    for i in range(n):
        for k, (kind, at) in enumerate(fields):
            if i < n_random:
                bits = {"f16": random_f16_bits, "f32": random_f32_bits,
                        "e8m0": lambda r: int(r.integers(0, 255))}[kind](rng)
            else:
                bits = extremes[(i - n_random + 3 * k) % len(extremes)]
            put(blocks[i], kind, at, bits)
    return blocks


def f16_codes(rng):
    """Every sign and exponent with edge mantissas (zeros, subnormals,
    infinities, NaNs included), then random codes."""
    codes = [(s << 15) | (e << 10) | m
             for s in (0, 1) for e in range(32)
             for m in (0, 1, 2, 0x155, 0x200, 0x2AA, 0x3FE, 0x3FF)]
    codes += [int(c) for c in rng.integers(0, 1 << 16, size=512)]
    return np.array(codes, dtype="<u2").view(np.uint8).reshape(-1, 2)


def bf16_codes(rng):
    codes = [(s << 15) | (e << 7) | m
             for s in (0, 1) for e in range(256) for m in (0, 1, 0x40, 0x7F)]
    codes += [int(c) for c in rng.integers(0, 1 << 16, size=512)]
    return np.array(codes, dtype="<u2").view(np.uint8).reshape(-1, 2)


# ---------------------------------------------------------------- llama.cpp C

SHIM_C = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "ggml-impl.h"
/* ggml.c's definitions of the four symbols ggml-quants.c links against;
   the dequantizers never reach them. */
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort();
}
size_t ggml_row_size(enum ggml_type t, int64_t ne) { (void) t; (void) ne; abort(); }
size_t ggml_type_size(enum ggml_type t) { (void) t; abort(); }
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
/* The conversions ggml.c's ggml_fp16_to_fp32_row / ggml_bf16_to_fp32_row use. */
void shim_f16(const uint16_t * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = GGML_FP16_TO_FP32(x[i]);
}
void shim_bf16(const uint16_t * x, float * y, int64_t n) {
    for (int64_t i = 0; i < n; i++) { ggml_bf16_t b = { x[i] }; y[i] = GGML_BF16_TO_FP32(b); }
}
"""

C_FUNCS = {T.F16: "shim_f16", T.BF16: "shim_bf16", T.Q4_0: "dequantize_row_q4_0",
           T.Q4_1: "dequantize_row_q4_1", T.Q5_0: "dequantize_row_q5_0",
           T.Q5_1: "dequantize_row_q5_1", T.Q8_0: "dequantize_row_q8_0",
           T.MXFP4: "dequantize_row_mxfp4", T.Q2_K: "dequantize_row_q2_K",
           T.Q3_K: "dequantize_row_q3_K", T.Q4_K: "dequantize_row_q4_K",
           T.Q5_K: "dequantize_row_q5_K", T.Q6_K: "dequantize_row_q6_K",
           T.Q8_K: "dequantize_row_q8_K", T.IQ2_XXS: "dequantize_row_iq2_xxs",
           T.IQ4_NL: "dequantize_row_iq4_nl"}


def fetch_sdist(work):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                    "--no-binary", "llama-cpp-python", "-d", work,
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], check=True)
    return os.path.join(work, f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz")


def build_ggml(sdist, work):
    """libggml-quants.so from the sdist's vendor/llama.cpp/ggml: the
    reference dequantizers, no fp contraction, no target-specific code."""
    with open(sdist, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SDIST_SHA256:
        sys.exit(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256}")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/ggml/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and (m.name.endswith(".h") or m.name.endswith("ggml-quants.c"))]
        tar.extractall(work, members=members, filter="data")
    ggml = os.path.join(work, prefix)
    shim = os.path.join(work, "shim.c")
    with open(shim, "w") as f:
        f.write(SHIM_C)
    lib = os.path.join(work, "libggml-quants.so")
    subprocess.run(["gcc", "-O2", "-ffp-contract=off", "-fno-fast-math", "-fPIC",
                    "-shared", "-I", os.path.join(ggml, "src"),
                    "-I", os.path.join(ggml, "include"),
                    os.path.join(ggml, "src", "ggml-quants.c"), shim, "-o", lib, "-lm"],
                   check=True)
    return ctypes.CDLL(lib)


def c_dequantize(lib, qtype, blocks):
    block_len, _ = GGML_QUANT_SIZES[qtype]
    src = np.ascontiguousarray(blocks)
    n = src.shape[0] * block_len
    out = np.empty(n, dtype=np.float32)
    fn = getattr(lib, C_FUNCS[qtype])
    fn.restype = None
    fn(src.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
       ctypes.c_int64(n))
    return out.reshape(src.shape[0], block_len)


def mismatches(a, b):
    """Indices where the bits differ, any NaN matching any NaN."""
    same = (np.isnan(a) & np.isnan(b)) | (a.view(np.uint32) == b.view(np.uint32))
    return np.argwhere(~same)


# ---------------------------------------------------------------------- main

def write(name, blocks, values, meta):
    """One metadata key: safetensors writes a map's keys in hash order, which
    would make reruns differ byte-wise."""
    path = os.path.join(OUT, f"{name}.safetensors")
    save_file({"blocks": np.ascontiguousarray(blocks, dtype=np.uint8),
               "values": np.ascontiguousarray(values, dtype=np.float32)},
              path, metadata={"fixture": json.dumps(meta, sort_keys=True)})
    print(f"{path}: {blocks.shape[0]} rows")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", help=f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz")
    args = ap.parse_args()
    assert metadata.version("gguf") == GGUF_VERSION, metadata.version("gguf")
    assert torch.__version__.startswith("2.15."), torch.__version__
    os.makedirs(OUT, exist_ok=True)

    c_name = f"llama.cpp C via llama-cpp-python {LLAMA_CPP_PYTHON} sdist, gcc -O2 -ffp-contract=off"
    py_name = f"gguf-py {GGUF_VERSION} gguf.quants.dequantize"
    with tempfile.TemporaryDirectory() as work:
        lib = build_ggml(args.sdist or fetch_sdist(work), work)
        cases = [("f16", T.F16, f16_codes), ("bf16", T.BF16, bf16_codes)]
        cases += [(n, t, partial(make_blocks, qtype=t, fields=f, n_random=k))
                  for n, t, f, k in BLOCK_TYPES]
        results = []
        for i, (name, qtype, make) in enumerate(cases):
            rng = np.random.default_rng([SEED, i])
            blocks = make(rng)
            from_c = c_dequantize(lib, qtype, blocks)
            if qtype == T.Q8_K:  # not in gguf-py
                values, oracle, check = from_c, c_name, "none (gguf-py has no Q8_K)"
            else:
                with np.errstate(all="ignore"):
                    values = dequantize(blocks, qtype).reshape(from_c.shape)
                oracle, check = py_name, c_name
                bad = mismatches(values, from_c)
                if len(bad):
                    sys.exit(f"{name}: gguf-py and llama.cpp C differ at [block, value] "
                             f"{bad[:8].tolist()}; nothing written")
            results.append((name, blocks, values, {"type": qtype.name, "oracle": oracle,
                                                   "checked_against": check,
                                                   "seed": f"[{SEED}, {i}]"}))
    for result in results:
        write(*result)

    codes = np.arange(256, dtype=np.uint8)
    torch_codes = torch.from_numpy(codes.copy())
    e4m3 = torch_codes.view(torch.float8_e4m3fn).float().numpy()
    write("f8_e4m3", codes.reshape(-1, 1), e4m3,
          {"type": "F8_E4M3", "oracle": f"torch {torch.__version__} float8_e4m3fn -> float32"})
    e8m0 = torch_codes.view(torch.float8_e8m0fnu).float().numpy()
    write("e8m0", codes.reshape(-1, 1), e8m0,
          {"type": "E8M0", "oracle": f"torch {torch.__version__} float8_e8m0fnu -> float32"})
    pairs = np.array([[E2M1[c & 0xF], E2M1[c >> 4]] for c in range(256)], dtype=np.float32)
    write("fp4_e2m1", codes.reshape(-1, 1), pairs,
          {"type": "FP4_E2M1 pairs (low nibble first)",
           "oracle": "OCP MX v1.0 E2M1 table (torch cannot convert float4_e2m1fn_x2)"})
    manifest = sorted(f for f in os.listdir(OUT) if f.endswith(".safetensors"))
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
