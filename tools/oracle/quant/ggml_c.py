"""llama.cpp's ggml-quants.c as a ctypes library, for the quantizer oracle.

`generate.py` builds the same file for the dequantizer fixtures; this module
takes its pins (sdist version and sha256, `fetch_sdist`) from there so both
oracles compile the same source, and differs in two ways the quantizers need:

- the shim gives `ggml_row_size` / `ggml_type_size` real values (the
  `quantize_*` entry points compute row strides with them; the dequantizers
  never call them, so `generate.py` stubs them with abort());
- `-DNDEBUG`, as in llama.cpp's release builds (what `llama-quantize` runs):
  `nearest_int`'s `assert(fabsf(fval) <= 4194303.f)` and the `_ref`
  functions' asserts are compiled out there, so an input whose search meets
  an infinite or NaN intermediate gives that build's bytes instead of an
  abort. GGML_ASSERT stays (it is not an assert()).

Flags otherwise as `generate.py`: `-O2 -ffp-contract=off -fno-fast-math`, no
target flags (no FMA, no F16C, no SIMD kernels: ggml-quants.c's reference
code is plain C).
"""

import ctypes
import hashlib
import os
import subprocess
import sys
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from generate import LLAMA_CPP_PYTHON, SDIST_SHA256, fetch_sdist  # noqa: E402,F401

CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-DNDEBUG", "-fPIC", "-shared"]

SHIM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include "ggml-impl.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
/* ggml.c's definitions of the symbols ggml-quants.c links against, for the
   types the quantizer oracle calls. */
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt); abort();
}
static void shape(enum ggml_type t, size_t * size, int64_t * blck) {
    switch (t) {
        case GGML_TYPE_Q4_0:    *size = sizeof(block_q4_0);    *blck = QK4_0; return;
        case GGML_TYPE_Q4_1:    *size = sizeof(block_q4_1);    *blck = QK4_1; return;
        case GGML_TYPE_Q5_0:    *size = sizeof(block_q5_0);    *blck = QK5_0; return;
        case GGML_TYPE_Q5_1:    *size = sizeof(block_q5_1);    *blck = QK5_1; return;
        case GGML_TYPE_Q8_0:    *size = sizeof(block_q8_0);    *blck = QK8_0; return;
        case GGML_TYPE_MXFP4:   *size = sizeof(block_mxfp4);   *blck = QK_MXFP4; return;
        case GGML_TYPE_Q2_K:    *size = sizeof(block_q2_K);    *blck = QK_K; return;
        case GGML_TYPE_Q3_K:    *size = sizeof(block_q3_K);    *blck = QK_K; return;
        case GGML_TYPE_Q4_K:    *size = sizeof(block_q4_K);    *blck = QK_K; return;
        case GGML_TYPE_Q5_K:    *size = sizeof(block_q5_K);    *blck = QK_K; return;
        case GGML_TYPE_Q6_K:    *size = sizeof(block_q6_K);    *blck = QK_K; return;
        case GGML_TYPE_Q8_K:    *size = sizeof(block_q8_K);    *blck = QK_K; return;
        case GGML_TYPE_IQ2_XXS: *size = sizeof(block_iq2_xxs); *blck = QK_K; return;
        default: fprintf(stderr, "shim: type %d\n", (int) t); abort();
    }
}
size_t ggml_type_size(enum ggml_type t) { size_t s; int64_t b; shape(t, &s, &b); return s; }
size_t ggml_row_size(enum ggml_type t, int64_t ne) {
    size_t s; int64_t b; shape(t, &s, &b);
    if (ne % b) { fprintf(stderr, "shim: row of %lld\n", (long long) ne); abort(); }
    return s * (size_t) (ne / b);
}
const char * ggml_type_name(enum ggml_type t) { (void) t; return "?"; }
"""


def build(sdist, work):
    """libggml-quantize.so from the sdist's vendor/llama.cpp/ggml (sha256
    checked against generate.py's pin)."""
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
    shim = os.path.join(work, "shim_quantize.c")
    with open(shim, "w") as f:
        f.write(SHIM_C)
    lib = os.path.join(work, "libggml-quantize.so")
    subprocess.run(["gcc", *CFLAGS, "-I", os.path.join(ggml, "src"),
                    "-I", os.path.join(ggml, "include"),
                    os.path.join(ggml, "src", "ggml-quants.c"), shim, "-o", lib, "-lm"],
                   check=True)
    return ctypes.CDLL(lib)
