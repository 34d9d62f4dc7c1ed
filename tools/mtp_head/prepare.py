"""Step 1 (CPU, here): token ids of every prompt and of the public-domain
text, written to one JSON file the GPU step reads (the GPU machine needs no
tokenizer then).

The tokenizer is the GGUF's own vocabulary and merges as a byte-level BPE
with GPT-2's split (what ds4server builds for `tokenizer.ggml.pre =
smollm`); control tokens (`<|im_start|>`, ...) are matched as text first.
Prompts use the GGUF's chat template, which for a conversation without a
system message is the fixed string below.

    python prepare.py MODEL.gguf OUT.json [--instructions N]
"""

import argparse
import json
import re

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

import gguf_io
import instructions

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_prompt(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


class Tok:
    def __init__(self, g):
        tokens = list(g.meta["tokenizer.ggml.tokens"])
        types = list(g.meta["tokenizer.ggml.token_type"])
        merges = [tuple(m.split(" ", 1)) for m in g.meta["tokenizer.ggml.merges"]]
        self.tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.tok.decoder = decoders.ByteLevel()
        # token_type 3 = control
        self.special = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3}
        self.split = re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True)) + ")")

    def encode(self, text):
        ids = []
        for piece in self.split.split(text):
            if not piece:
                continue
            if piece in self.special:
                ids.append(self.special[piece])
            else:
                ids.extend(self.tok.encode(piece, add_special_tokens=False).ids)
        return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--instructions", type=int, default=6000)
    ap.add_argument("--corpus", default="bench/corpus.txt")
    a = ap.parse_args()
    tok = Tok(gguf_io.Gguf(a.model))
    prompts = [
        {"kind": k, "text": t, "split": s, "ids": tok.encode(chat_prompt(t))}
        for k, t, s in instructions.instructions(a.instructions)
    ]
    # Public-domain text (bench/corpus.txt: the Declaration of Independence,
    # the Gettysburg Address, Lincoln's Second Inaugural): paragraphs in
    # turn, the last fifth held out for evaluation.
    paras = [p for p in open(a.corpus, encoding="utf-8").read().split("\n\n") if p.strip()]
    cut = len(paras) * 4 // 5
    text = [{"split": "train" if i < cut else "eval", "ids": tok.encode(p)} for i, p in enumerate(paras)]
    json.dump({"prompts": prompts, "text": text}, open(a.out, "w"))
    n = sum(len(p["ids"]) for p in prompts)
    print(f"{len(prompts)} prompts ({n} tokens), {len(text)} text paragraphs "
          f"({sum(len(t['ids']) for t in text)} tokens)")


if __name__ == "__main__":
    main()
