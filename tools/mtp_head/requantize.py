"""Rewrite a head file's block-quantized weights in another block format.

    python requantize.py IN.gguf OUT.gguf --q4-1 NAME[,NAME...]|all [--keep NAME,...]

Every named 2-D weight (or every block-quantized one for `all`, minus
`--keep`) is dequantized exactly as ggml does and quantized again with
ggml's reference Q4_1; everything else is copied byte for byte. Why: a
draft reads the whole head once per token; README, "Tried: the head in
Q4_1", has what that measured (not adopted: acceptance fell more than the
draft's cost). Quantizing from the Q8_0 file instead of the f32
weights adds Q8_0's error (1/254 of a block's largest value) to Q4_1's
(1/30 of a block's range).
"""

import argparse

import gguf_io as G


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--q4-1", required=True,
                    help="comma-separated tensor names, or `all`")
    ap.add_argument("--keep", default="", help="names `all` leaves as they are")
    a = ap.parse_args()
    g = G.Gguf(a.src)
    keep = {k for k in a.keep.split(",") if k}
    if a.q4_1 == "all":
        names = {n for n, (t, _, _) in g.tensors.items() if t in G.BLOCK} - keep
    else:
        names = {n for n in a.q4_1.split(",") if n}
    missing = names - g.tensors.keys()
    if missing:
        raise SystemExit(f"no such tensors: {sorted(missing)}")
    meta = G.meta_items(g)
    tensors = []
    for name, (t, shape, raw) in g.tensors.items():
        if name in names:
            if len(shape) != 2 or shape[-1] % 32:
                raise SystemExit(f"{name}: {shape} is not a matrix of 32-wide blocks")
            x = G.dequantize(t, raw, shape)
            tensors.append((name, G.T_Q4_1, shape, G.quantize_q4_1(x)))
            print(f"{name}: {shape} -> Q4_1")
        else:
            tensors.append((name, t, shape, bytes(raw)))
    G.write(a.dst, meta, tensors)


if __name__ == "__main__":
    main()
