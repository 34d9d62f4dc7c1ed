"""Held-out prompts for the Rust side: `bench/mtp_prompts.txt` (instructions
from the eval split, one a line, read by `ds4server bench --mtp`) and
`tests/fixtures/llama/mtp_prompts.txt` (the first six with the chat
template applied, as comma-separated token ids, one prompt a line, for the
engine's exactness tests).

    python heldout.py MODEL.gguf        (from the repository root)
"""

import random
import sys

import gguf_io
import instructions
import prepare


def main():
    tok = prepare.Tok(gguf_io.Gguf(sys.argv[1]))
    ev = [t for _, t, s in instructions.instructions(6000) if s == "eval"]
    random.Random(7).shuffle(ev)
    ev = ev[:16]
    with open("bench/mtp_prompts.txt", "w") as f:
        f.write("\n".join(ev) + "\n")
    with open("tests/fixtures/llama/mtp_prompts.txt", "w") as f:
        for t in ev[:6]:
            f.write(",".join(map(str, tok.encode(prepare.chat_prompt(t)))) + "\n")


if __name__ == "__main__":
    main()
