#!/usr/bin/env python3
"""Copy the `tokenizer.*` metadata of a GGUF file into a GGUF of metadata
only (no tensors), byte for byte. The GPU benchmark writes a synthetic
SmolLM2-shaped model with it, so that llama.cpp (which needs a vocabulary)
and ds4server run the same file. Usage: vocab_gguf.py IN.gguf OUT.gguf"""
import struct
import sys

# Sizes of GGUF scalar value types (the type ids of the GGUF spec).
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def skip_value(b, at, ty):
    if ty in SCALAR:
        return at + SCALAR[ty]
    if ty == STRING:
        (n,) = struct.unpack_from("<Q", b, at)
        return at + 8 + n
    if ty == ARRAY:
        (ety, n) = struct.unpack_from("<IQ", b, at)
        at += 12
        if ety in SCALAR:
            return at + n * SCALAR[ety]
        for _ in range(n):
            at = skip_value(b, at, ety)
        return at
    raise ValueError(f"unknown GGUF value type {ty}")


def main(src, dst):
    b = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", b, 0)
    assert magic == 0x46554747, "not a GGUF file"
    at, kept = 24, []
    for _ in range(n_kv):
        start = at
        (n,) = struct.unpack_from("<Q", b, at)
        key = b[at + 8 : at + 8 + n].decode()
        at += 8 + n
        (ty,) = struct.unpack_from("<I", b, at)
        at = skip_value(b, at + 4, ty)
        if key.startswith("tokenizer."):
            kept.append(b[start:at])
    with open(dst, "wb") as f:
        f.write(struct.pack("<IIQQ", magic, version, 0, len(kept)))
        for kv in kept:
            f.write(kv)
    print(f"{dst}: {len(kept)} tokenizer keys")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
