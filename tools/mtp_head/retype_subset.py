"""Rewrite a head file's `mtp.vocab_subset` from I32 to F32 (token ids are
exact in f32 below 2^24). The engine reads GGUF through candle, which has no
I32 tensor type; train.py writes F32 since, and the committed head went
through this once (README).

    python retype_subset.py IN.gguf OUT.gguf
"""

import sys

import numpy as np

import gguf_io as G


def main():
    src, dst = sys.argv[1], sys.argv[2]
    g = G.Gguf(src)
    meta = G.meta_items(g)
    tensors = []
    for name, (t, shape, raw) in g.tensors.items():
        if name == "mtp.vocab_subset" and t == G.T_I32:
            ids = np.frombuffer(raw, dtype="<i4").astype("<f4")
            tensors.append((name, G.T_F32, shape, ids.tobytes()))
        else:
            tensors.append((name, t, shape, bytes(raw)))
    G.write(dst, meta, tensors)


if __name__ == "__main__":
    main()
