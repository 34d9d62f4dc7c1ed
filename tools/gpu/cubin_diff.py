#!/usr/bin/env python3
"""Which CUDA kernels' machine code a change alters, without a GPU.

Compiles the embedded kernel sources (`crates/engine/src/backend/cuda/
nvrtc.rs`'s SOURCES, joined in order as `nvrtc.rs` joins them) with NVRTC
for sm_90a and the backend's options, once at a git revision (default
HEAD) and once from the working tree, and lists the kernels whose `.text`
sections differ. An empty list means the cubins run the same instructions,
so a refactor that lists nothing keeps every output's bits (docs/GPU.md,
run 37). NVRTC comes from PyPI without a toolkit:

    pip download --no-deps nvidia-cuda-nvrtc==13.0.88 -d /tmp/nvrtc
    (cd /tmp/nvrtc && unzip -oq nvidia_cuda_nvrtc-*.whl)
    NVRTC_LIB=/tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13 \\
        python3 tools/gpu/cubin_diff.py [REV]
"""
import ctypes
import os
import re
import struct
import subprocess
import sys

ROOT = subprocess.check_output(["git", "rev-parse", "--show-toplevel"]).decode().strip()
CUDA = "crates/engine/src/backend/cuda/"
# The options `nvrtc.rs` compiles with (the architecture of an H100/H200).
OPTIONS = [b"--gpu-architecture=sm_90a", b"--fmad=false"]


def read(rev, path):
    if rev is None:
        with open(os.path.join(ROOT, path)) as f:
            return f.read()
    return subprocess.check_output(["git", "show", f"{rev}:{path}"], cwd=ROOT).decode()


def sources(rev):
    names = re.findall(r'\("([a-z0-9_]+\.cuh?)", include_str', read(rev, CUDA + "nvrtc.rs"))
    return "".join(f"// ---- {n}\n{read(rev, CUDA + 'kernels/' + n)}\n" for n in names)


def cubin(lib, text):
    prog = ctypes.c_void_p()
    lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"all.cu", 0, None, None)
    opts = (ctypes.c_char_p * len(OPTIONS))(*OPTIONS)
    if lib.nvrtcCompileProgram(prog, len(OPTIONS), opts) != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(log.value.decode(errors="replace"))
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, out)
    return out.raw


def text_sections(elf):
    """Name -> bytes of every `.text.*` section of an ELF64 cubin."""
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    entsize, count, names_at = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    strtab = headers[names_at][4]
    out = {}
    for h in headers:
        name = elf[strtab + h[0] : elf.index(b"\0", strtab + h[0])].decode()
        if name.startswith(".text."):
            out[name[len(".text.") :]] = elf[h[4] : h[4] + h[5]]
    return out


def main():
    rev = sys.argv[1] if len(sys.argv) > 1 else "HEAD"
    path = os.environ.get("NVRTC_LIB", "libnvrtc.so.13")
    # NVRTC opens its builtins library by name: load the one beside it
    # first, so no LD_LIBRARY_PATH is needed.
    builtins = os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.13.0")
    if os.path.exists(builtins):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    before = text_sections(cubin(lib, sources(rev)))
    after = text_sections(cubin(lib, sources(None)))
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    print(f"{len(after)} functions; changed against {rev}: {len(changed)}")
    for k in changed:
        print(f"  changed {k}")
    for k in sorted(before.keys() - after.keys()):
        print(f"  removed {k}")
    for k in sorted(after.keys() - before.keys()):
        print(f"  added {k}")


if __name__ == "__main__":
    main()
