"""A tiny random llama GGUF (2 layers, hidden 64, vocab 512) and prompts
for it, to run train.py end to end in seconds before the real run.

    python smoke.py OUTDIR && python train.py OUTDIR/tiny.gguf OUTDIR/prompts.json OUTDIR/out --steps 20 ...
"""

import json
import os
import sys

import numpy as np

import gguf_io as G


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    H, F, L, V, heads, kvh = 64, 128, 2, 512, 4, 2
    hd = H // heads

    def f(*shape, s=0.1):
        return (rng.standard_normal(shape) * s).astype("<f4")

    meta = [
        ("general.architecture", G.STR, "llama"),
        ("llama.block_count", G.U32, L), ("llama.context_length", G.U32, 1024),
        ("llama.embedding_length", G.U32, H), ("llama.feed_forward_length", G.U32, F),
        ("llama.attention.head_count", G.U32, heads), ("llama.attention.head_count_kv", G.U32, kvh),
        ("llama.rope.freq_base", G.F32, 10000.0),
        ("llama.attention.layer_norm_rms_epsilon", G.F32, 1e-5), ("llama.vocab_size", G.U32, V),
    ]
    ts = [("token_embd.weight", G.T_Q8_0, (V, H), G.quantize_q8_0(f(V, H, s=0.5))),
          ("output_norm.weight", G.T_F32, (H,), np.ones(H, "<f4").tobytes())]
    for i in range(L):
        for n, shape in [("attn_q", (H, H)), ("attn_k", (kvh * hd, H)), ("attn_v", (kvh * hd, H)),
                         ("attn_output", (H, H)), ("ffn_gate", (F, H)), ("ffn_up", (F, H)),
                         ("ffn_down", (H, F))]:
            ts.append((f"blk.{i}.{n}.weight", G.T_F32, shape, f(*shape).tobytes()))
        for n in ["attn_norm", "ffn_norm"]:
            ts.append((f"blk.{i}.{n}.weight", G.T_F32, (H,), np.ones(H, "<f4").tobytes()))
    G.write(os.path.join(out, "tiny.gguf"), meta, ts)
    prompts = [{"kind": "k", "text": str(i), "split": "eval" if i % 10 == 0 else "train",
                "ids": [1] + rng.integers(3, V, size=rng.integers(5, 30)).tolist()} for i in range(200)]
    text = [{"split": "train", "ids": rng.integers(3, V, size=100).tolist()}]
    json.dump({"prompts": prompts, "text": text}, open(os.path.join(out, "prompts.json"), "w"))


if __name__ == "__main__":
    main()
