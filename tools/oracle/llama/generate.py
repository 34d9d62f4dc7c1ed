"""Regenerate every llama-family fixture under tests/fixtures/llama/.

    tools/oracle/.venv/bin/python tools/oracle/llama/generate.py [--gguf PATH]

Two parts:

1. The default GGUF (SmolLM2-135M-Instruct Q4_1). transformers dequantizes
   every tensor to f32 on load and runs the reference in f32. Per prompt and
   position we keep the argmax, the log-sum-exp, the top-32 ids with their
   logits and the logits of a fixed random subset of 256 ids (full rows are
   49152 floats each: far too large to commit). Greedy continuations of 64
   tokens come from a plain argmax loop over the KV cache: `generate()` would
   apply the GGUF's generation config (eos stopping, repetition penalty),
   which is a sampling concern, not the model's.

2. Tiny random Hugging Face llama checkpoints (safetensors) covering the
   layouts the loader must accept: f32 single file with separate lm_head,
   tied embeddings, sharded with an index, bf16, llama3 and linear RoPE
   scaling. Full reference logits (the vocab is 96) for two prompts each.
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "llama"
DEFAULT_GGUF = Path.home() / ".cache" / "ds4server" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

TOP_K = 32
SUBSET = 256
GREEDY_STEPS = 64

LOGIT_PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 5, 8, 13, 21, 34,",
    # ~200 tokens: exercises chunked prefill and longer positions.
    (
        "Once upon a time, in a small village at the edge of a great forest, there lived an old "
        "clockmaker named Elias. Every morning he opened the shutters of his shop, wound the "
        "hundred clocks that lined its walls, and listened as they began to tick together like a "
        "single heart. The villagers said his clocks were never wrong, not by a second, not in "
        "forty years. Children pressed their noses against the window to watch the tiny brass "
        "birds that sprang out on the hour. One winter evening a stranger in a grey coat came in "
        "from the snow, carrying a clock that had stopped at exactly midnight. He set it on the "
        "counter and asked whether Elias could make it run again. The old man turned it over in "
        "his hands, opened the back, and found that there was no mechanism inside at all, only a "
        "folded letter addressed to him in his own handwriting. He unfolded it slowly and began "
        "to read"
    ),
]

GREEDY_PROMPTS = LOGIT_PROMPTS[:4] + [
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "Here is a list of fruits: apple, banana,",
    "The quick brown fox",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "Explain recursion in one paragraph.<|im_end|>\n<|im_start|>assistant\n",
]


def gguf_fixtures(gguf_path: Path) -> None:
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    model.eval()
    vocab = model.config.vocab_size
    rng = np.random.default_rng(1234)
    subset = np.sort(rng.choice(vocab, size=SUBSET, replace=False)).astype(np.int64)

    tensors = {"subset_ids": torch.from_numpy(subset)}
    summary = []
    with torch.no_grad():
        for i, text in enumerate(LOGIT_PROMPTS):
            ids = tok(text, add_special_tokens=False)["input_ids"]
            logits = model(torch.tensor([ids])).logits[0].float()  # [n, vocab]
            top = torch.topk(logits, TOP_K, dim=-1)
            tensors[f"p{i}.tokens"] = torch.tensor(ids, dtype=torch.int64)
            tensors[f"p{i}.argmax"] = logits.argmax(-1).to(torch.int64)
            tensors[f"p{i}.lse"] = torch.logsumexp(logits, -1).contiguous()
            tensors[f"p{i}.top_ids"] = top.indices.to(torch.int64).contiguous()
            tensors[f"p{i}.top_logits"] = top.values.contiguous()
            tensors[f"p{i}.subset_logits"] = logits[:, torch.from_numpy(subset)].contiguous()
            margin = (top.values[:, 0] - top.values[:, 1]).min().item()
            summary.append((len(ids), margin))
    save_file(tensors, str(OUT / "gguf_logits.safetensors"))
    for i, (n, m) in enumerate(summary):
        print(f"gguf prompt {i}: {n} tokens, smallest top1-top2 margin {m:.4f}")

    greedy = []
    with torch.no_grad():
        for text in GREEDY_PROMPTS:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            out = model(torch.tensor([ids]), use_cache=True)
            past = out.past_key_values
            row = out.logits[0, -1]
            cont, margins = [], []
            for _ in range(GREEDY_STEPS):
                top2 = torch.topk(row, 2)
                nxt = int(top2.indices[0])
                cont.append(nxt)
                margins.append(round(float(top2.values[0] - top2.values[1]), 5))
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                row = out.logits[0, -1]
            greedy.append({"prompt": ids, "continuation": cont, "margins": margins})
    (OUT / "gguf_greedy.json").write_text(json.dumps(greedy) + "\n")
    print(f"greedy: {len(greedy)} prompts x {GREEDY_STEPS} tokens")


TINY_BASE = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=1,
    eos_token_id=2,
)

# rope_theta 10000 with head_dim 8 gives wavelengths 6.3, 63, 628, 6283:
# with original_max_position_embeddings 64 and factors 1 / 4 the llama3 rule
# keeps the first, smooths the second and divides the last two, so all three
# branches of the rule are exercised.
TINY_VARIANTS = {
    "f32_untied": dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "f32_tied": dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "f32_sharded": dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "bf16": dict(tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "rope_llama3": dict(
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "rope_linear": dict(
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    ),
}

TINY_PROMPTS = [
    [1, 17, 42, 5, 88, 23, 9],
    [int(x) for x in np.random.default_rng(7).integers(3, 96, size=100)],
]


def randomise(model: torch.nn.Module, seed: int) -> None:
    """HF init leaves norms at exactly 1; re-randomise everything so that a
    mis-bound norm or a swapped projection changes the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=g))


def tiny_fixtures() -> None:
    tiny = OUT / "tiny"
    if tiny.exists():
        shutil.rmtree(tiny)
    tiny.mkdir(parents=True)
    for seed, (name, extra) in enumerate(TINY_VARIANTS.items()):
        cfg = LlamaConfig(**TINY_BASE, **extra)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).to(torch.float32)
        randomise(model, 100 + seed)
        if name == "bf16":
            # The reference is the f32 forward of the bf16-rounded weights:
            # that is exactly what our loader computes (it upcasts on load).
            model = model.to(torch.bfloat16)
        d = tiny / name
        kwargs = {"max_shard_size": "40KB"} if name == "f32_sharded" else {}
        model.save_pretrained(str(d), safe_serialization=True, **kwargs)
        gen = d / "generation_config.json"
        if gen.exists():
            gen.unlink()
        if name == "rope_linear":
            # Older checkpoints spell RoPE as top-level `rope_theta` plus
            # `rope_scaling` with `type`; keep one fixture in that form and
            # check transformers still reads it the same way.
            cfg_path = d / "config.json"
            raw = json.loads(cfg_path.read_text())
            params = raw.pop("rope_parameters")
            raw["rope_theta"] = params["rope_theta"]
            raw["rope_scaling"] = {"type": "linear", "factor": params["factor"]}
            cfg_path.write_text(json.dumps(raw, indent=2) + "\n")
            reloaded = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
            with torch.no_grad():
                ids = torch.tensor([TINY_PROMPTS[1]])
                diff = (reloaded(ids).logits - model.to(torch.float32)(ids).logits).abs().max().item()
            assert diff == 0.0, f"legacy rope_scaling form read differently: {diff}"
        # The reference is the checkpoint as transformers reads it back in
        # f32: for bf16 that is the f32 forward of the bf16-rounded weights
        # (what our loader computes), with RoPE inverse frequencies freshly
        # computed in f32 (casting the in-memory model would leave them
        # bf16-rounded).
        model = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
        ref = {}
        with torch.no_grad():
            for i, ids in enumerate(TINY_PROMPTS):
                logits = model(torch.tensor([ids])).logits[0].float().contiguous()
                ref[f"p{i}.tokens"] = torch.tensor(ids, dtype=torch.int64)
                ref[f"p{i}.logits"] = logits
        save_file(ref, str(tiny / f"{name}.logits.safetensors"))
        files = sorted(p.name for p in d.iterdir())
        print(f"tiny {name}: {files}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--skip-gguf", action="store_true")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    tiny_fixtures()
    if not args.skip_gguf:
        if not args.gguf.exists():
            sys.exit(f"{args.gguf}: not found (run `ds4server pull` or pass --gguf)")
        gguf_fixtures(args.gguf)


if __name__ == "__main__":
    main()
