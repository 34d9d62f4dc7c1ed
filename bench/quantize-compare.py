#!/usr/bin/env python3
"""Compare two GGUFs tensor by tensor (stdlib only): for each tensor in
both, its GGML type in each and whether its data bytes are identical.
Prints one summary line per pair and the differing tensors.

    python3 bench/quantize-compare.py OURS.gguf THEIRS.gguf
"""
import struct
import sys

TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
         10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
         16: "IQ2_XXS", 20: "IQ4_NL", 30: "BF16", 39: "MXFP4"}
# (block values, block bytes)
BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
         8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
         14: (256, 210), 15: (256, 292), 16: (256, 66), 20: (32, 18), 30: (1, 2),
         39: (32, 17)}
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read(path):
    f = open(path, "rb")
    data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t in SCALAR:
            return take(SCALAR[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"{path}: metadata type {t}")

    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF")
    pos = 4
    take("I")
    n_t, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    tensors = {}
    for _ in range(n_t):
        name = string()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        ty, off = take("I"), take("Q")
        tensors[name] = (ty, dims, off)
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    out = {}
    for name, (ty, dims, off) in tensors.items():
        n = 1
        for d in dims:
            n *= d
        bv, bb = BLOCK[ty]
        size = n // bv * bb
        out[name] = (ty, data[base + off: base + off + size])
    return out


def main():
    a_path, b_path = sys.argv[1], sys.argv[2]
    a, b = read(a_path), read(b_path)
    same, diff, typed = 0, [], {}
    for name, (ta, da) in a.items():
        if name not in b:
            diff.append(f"  {name}: only in {a_path}")
            continue
        tb, db = b[name]
        key = (TYPES.get(ta, ta), TYPES.get(tb, tb))
        typed.setdefault(key, [0, 0])
        if ta == tb and da == db:
            same += 1
            typed[key][0] += 1
        else:
            typed[key][1] += 1
            if ta != tb:
                diff.append(f"  {name}: {TYPES.get(ta, ta)} vs {TYPES.get(tb, tb)}")
            else:
                nb = sum(x != y for x, y in zip(da, db))
                diff.append(f"  {name}: {TYPES.get(ta, ta)}, {nb} of {len(da)} bytes differ")
    for name in b:
        if name not in a:
            diff.append(f"  {name}: only in {b_path}")
    print(f"{a_path} vs {b_path}: {same} of {len(a)} tensors byte-identical")
    for (ta, tb), (s, d) in sorted(typed.items()):
        print(f"  types {ta} / {tb}: {s} identical, {d} differ")
    for line in diff[:40]:
        print(line)
    if len(diff) > 40:
        print(f"  ... {len(diff) - 40} more")


if __name__ == "__main__":
    main()
