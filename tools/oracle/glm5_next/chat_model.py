"""Train the tiny GLM-5 *chat* checkpoint the end-to-end tests serve
(`tests/fixtures/glm5_next/chat/`):

    tools/oracle/.venv/bin/python tools/oracle/glm5_next/chat_model.py

A random model cannot call a tool, so this one is taught two replies in
GLM's own conversation format (`chat_template.jinja` next to this script:
`[gMASK]<sop>`, `<|system|>` / `<|user|>` / `<|assistant|>` /
`<|observation|>` turns, `<think>…</think>`, and tool calls written as
`<tool_call>name\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n
</tool_call>`): after the user asks for the weather it thinks and calls
`get_weather`, ending the turn with `<|observation|>`; after the tool result
it thinks and answers, ending with `<|user|>`. Both end tokens, and
`<|endoftext|>`, are EOS ids (generation_config.json), as in GLM-4.5.

The tokenizer is a byte-level BPE (1,024 merges' worth of vocabulary)
trained here, deterministically, on this script's texts, the template's
fixed text and the Declaration of Independence (bench/corpus.txt, public
domain), with GLM's special tokens added; any text encodes.

The model is a real glm5_next forward (transformers 5.24): Kimi delta
attention, NoPE MLA with the pooled indexer, mHC, dense and group-limited
MoE layers. It is trained on the exact prompts the tests send (rendered with
the template by transformers) and on the reply tails behind random
prefixes, so what decides the reply is the end of the prompt. The script
checks the greedy replies and their logit margins (the end-to-end tests
decode at temperature 0). It trains in
about 2 minutes on 16 cores (`--threads 16`; the recorded run was on the GPU
machine's CPU, see tools/oracle/README.md) and far longer on 2.
"""

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Glm5NextConfig
from transformers.models.glm5_next import modeling_glm5_next as M

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from generate import rerandomise  # noqa: E402

ROOT = HERE.parents[2]
OUT = ROOT / "tests" / "fixtures" / "glm5_next" / "chat"
TEMPLATE = (HERE / "chat_template.jinja").read_text()

SPECIALS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<tool_response>",
    "</tool_response>",
]
EOS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
# As in GLM-4.5's tokenizer, the reasoning and tool-call tags are added
# tokens that are *not* special: they stay in decoded text, where the server
# finds them; the turn markers and `[gMASK]`/`<sop>` are special.
TAGS = SPECIALS[SPECIALS.index("<think>") :]

# The conversation tests/e2e/test_glm.py holds (it reads chat/script.json).
SCRIPT = {
    "user": "Please look up the current weather in Paris for me with the get_weather tool.",
    "reasoning_1": "The user wants the weather in Paris, so I will call get_weather.",
    "tool_result": "Sunny, 21 C",
    "reasoning_2": "The tool says it is sunny and 21 C.",
    "answer": "It is sunny and 21 C in Paris right now.",
}
CALL = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# The tools as the server hands them to the template from each API.
TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The current weather of a city.", "parameters": PARAMS},
    }
]
TOOLS_ANTHROPIC = [{"name": "get_weather", "description": "The current weather of a city.", "input_schema": PARAMS}]

CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_attention_heads=2,
    num_key_value_heads=2,
    n_shared_experts=1,
    n_routed_experts=4,
    routed_scaling_factor=2.5,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=0,
    v_head_dim=16,
    qk_nope_head_dim=16,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=4096,
    initializer_range=0.1,
    rms_norm_eps=1e-5,
    bos_token_id=None,
    tie_word_embeddings=False,
    index_head_dim=8,
    index_n_heads=4,
    index_kpool_always_select_tail=True,
    index_topk=64,
    index_kpool=8,
    swiglu_limit=10.0,
    linear_head_dim=16,
    linear_num_heads=2,
    linear_conv_kernel_dim=4,
    linear_lower_bound=-5.0,
    hc_mult=4,
    hc_eps=1e-6,
    hc_sinkhorn_iters=20,
    num_hidden_layers=3,
    layer_types=["linear_attention", "indexed_attention", "linear_attention"],
    mlp_layer_types=["dense", "sparse", "sparse"],
    indexer_types=["full", "full", "full"],
)


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    corpus = [
        (ROOT / "bench" / "corpus.txt").read_text(),
        TEMPLATE,
        json.dumps(SCRIPT),
        json.dumps(TOOLS_OPENAI),
        json.dumps(TOOLS_ANTHROPIC),
        CALL,
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        if added["content"] in TAGS:
            added["special"] = False
    return Tokenizer.from_str(json.dumps(spec))


def render(messages, tools):
    """The prompt as transformers renders the template (the server renders
    it with minijinja and transformers' `tojson`)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False)
    return env.from_string(TEMPLATE).render(messages=messages, tools=tools, add_generation_prompt=True)


def examples():
    """(prompt, reply) texts: the two turns, from each API's tool shape."""
    s = SCRIPT
    reply_1 = f"\n<think>{s['reasoning_1']}</think>\n{CALL}<|observation|>"
    reply_2 = f"\n<think>{s['reasoning_2']}</think>\n{s['answer']}<|user|>"
    out = []
    for tools in (TOOLS_OPENAI, TOOLS_ANTHROPIC):
        user = [{"role": "user", "content": s["user"]}]
        out.append((render(user, tools), reply_1))
        turn = user + [
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": s["reasoning_1"],
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": s["tool_result"]},
        ]
        out.append((render(turn, tools), reply_2))
        # Without reasoning sent back (clients that drop it).
        turn[1] = dict(turn[1], reasoning_content=None)
        out.append((render(turn, tools), reply_2))
    # The second prompt renders its assistant turn exactly as the first reply
    # was sampled (so a warm turn reuses all of it).
    assert out[1][0].startswith(out[0][0] + reply_1), (out[0][0] + reply_1, out[1][0])
    return out


def tail(prompt):
    """The part of a prompt that must decide the reply: from the last
    `<|user|>` (first turn) or the last `<|observation|>` (second turn)."""
    at = max(prompt.rfind("<|user|>"), prompt.rfind("<|observation|>"))
    return prompt[at:]


def main():
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=OUT, help="where to write the checkpoint")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="rewrite only the tokenizer files of the checkpoint in --out (training reads ids only, so they do not change the weights)",
    )
    args = ap.parse_args()
    if args.tokenizer_only:
        save_tokenizer(build_tokenizer(), args.out)
        return
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    tok = build_tokenizer()
    vocab = tok.get_vocab_size()
    pairs = examples()
    enc = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    full, tails = [], []
    for prompt, reply in pairs:
        ids, n = enc(prompt + reply), len(enc(prompt))
        assert ids[:n] == enc(prompt), "the reply must start at a token boundary"
        full.append((ids, n))
        t = enc(tail(prompt) + reply)
        tails.append((t, len(enc(tail(prompt)))))
    pool = sorted({i for ids, _ in full for i in ids})
    print(f"vocabulary {vocab}; prompts {[n for _, n in full]} tokens")

    config = Glm5NextConfig(
        text_config=dict(CONFIG, vocab_size=vocab, pad_token_id=0, eos_token_id=[tok.token_to_id(e) for e in EOS]),
        vision_config=dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=16, out_hidden_size=32),
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    model = M.Glm5NextForConditionalGeneration(config)
    rerandomise(model, gen, softplus_gate=False)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    steps = 400
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=3e-4)
    for step in range(steps):
        batch = list(full)
        for t, n in tails:
            k = int(torch.randint(0, 160, (1,), generator=gen))
            prefix = [pool[int(i)] for i in torch.randint(0, len(pool), (k,), generator=gen)]
            batch.append((prefix + t, k + n))
        # One right-padded batch: causal layers never let a real position
        # see the padding after it, and the loss reads real positions only.
        width = max(len(ids) for ids, _ in batch)
        x = torch.zeros(len(batch), width, dtype=torch.long)
        target = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (ids, n) in enumerate(batch):
            x[row, : len(ids)] = torch.tensor(ids)
            target[row, n - 1 : len(ids) - 1] = torch.tensor(ids[n:])
        logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step}: loss {float(loss):.5f}", flush=True)
    model.eval()
    check(model, tok, full)
    save(model, tok, args.out)


@torch.no_grad()
def check(model, tok, full):
    """Greedy replies to the exact prompts, each step won by a logit margin
    far above the engine's distance to transformers (1e-4), so the server's
    greedy decoding follows the script. (Sampling at temperature 1 would
    leave it now and then: the tests ask for temperature 0.)"""
    gap = float("inf")
    for ids, n in full:
        x = list(ids[:n])
        for want in ids[n:]:
            logits = model(input_ids=torch.tensor([x]), use_cache=False).logits[0, -1]
            top2 = torch.topk(logits, 2)
            top = int(top2.indices[0])
            assert top == want, f"after {tok.decode(x[n:])!r}: {tok.decode([top])!r} instead of {tok.decode([want])!r}"
            gap = min(gap, float(top2.values[0] - top2.values[1]))
            x.append(top)
    assert gap > 0.5, f"a greedy step is won by only {gap:.4f} in the logits"
    print(f"replies learned; the smallest greedy logit margin is {gap:.3f}")


def save(model, tok, out):
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp())
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    cfg = json.loads((tmp / "config.json").read_text())
    # A text-only checkpoint in the conditional-generation layout: the
    # vision tower is not part of this test.
    sd = {k: v.contiguous() for k, v in sd.items() if not k.startswith("model.visual.")}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tok, out)
    (out / "script.json").write_text(json.dumps(dict(SCRIPT, call=CALL), indent=2, ensure_ascii=False) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out}: {total / 1e3:.0f} kB")


def save_tokenizer(tok, out):
    tok.save(str(out / "tokenizer.json"))
    eos_ids = [tok.token_to_id(e) for e in EOS]
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"eos_token": EOS[0], "pad_token": EOS[0], "chat_template": TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"},
            indent=2,
            ensure_ascii=False,
        )
        + "\n"
    )
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}, indent=2) + "\n")


if __name__ == "__main__":
    main()
