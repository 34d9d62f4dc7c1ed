"""Regenerate every deepseek_v4 fixture under tests/fixtures/deepseek_v4/.

    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/generate.py

Two tiny random checkpoints, each with a reference `<name>.ref.safetensors`:

* `tiny_a` — the digest's working tiny shape (D 64, 5 layers: sliding, CSA,
  HCA, CSA, HCA; hash MoE on layers 0-1; compress rates {4, 128}; window
  32; indexer 16 heads, top-16) over 300 tokens, so the CSA indexer prunes
  (75 entries, 16 kept) and HCA emits 2 entries; f32; explicit
  `layer_types` / `mlp_layer_types`; saved with transformers' hybrid names.
* `tiny_b` — the Flash schedule written in the legacy forms
  (`compress_ratios` [0, 0, 4, 128, 4, 128] with `compress_rate_hca` 16, `num_hash_layers` 3,
  `qk_rope_head_dim`), HCA ratio 16 so 96 tokens cross six HCA blocks,
  window 8, top-4; stored in bf16 (its reference is the f32 forward of the
  bf16-rounded weights), saved with fully upstream names (no `model.`
  prefix: `embed.weight`, `layers.L.…`, `hc_head_fn`).

Both carry `mtp.0.*` weights generated here (transformers ignores them); the
MTP reference (`MtpReference`) is composed from transformers' own
`DeepseekV4DecoderLayer` (one sliding layer with the learned top-k MoE),
`DeepseekV4HyperHead` and `DeepseekV4RMSNorm`, with the e/h projections of
the digest's Part D.

Constant-initialised tensors are re-randomised so every path fires (sinks,
ape, HC base/scale, norms, router bias, tid2eid). The script asserts that the
indexer prunes, that no pruning top-k sits on a near tie (min gap printed),
that every expert is routed, and that HCA emits entries.
"""

import copy
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DeepseekV4Config
from transformers.cache_utils import DynamicCache
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "deepseek_v4"

COMMON = dict(
    num_key_value_heads=1,
    routed_scaling_factor=1.5,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_parameters={
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    swiglu_limit=10.0,
    num_nextn_predict_layers=1,
    initializer_range=0.1,
    rms_norm_eps=1e-6,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
    n_shared_experts=1,
)

CONFIGS = {
    "tiny_a": dict(
        COMMON,
        vocab_size=256,
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=5,
        num_attention_heads=4,
        head_dim=32,
        q_lora_rank=32,
        partial_rotary_factor=0.25,
        num_experts_per_tok=2,
        n_routed_experts=8,
        layer_types=[
            "sliding_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
            "compressed_sparse_attention",
            "heavily_compressed_attention",
        ],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
        sliding_window=32,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=16,
        index_head_dim=16,
        index_topk=16,
        _T=300,
        _chunks=[137, 1, 101, 61],
    ),
    "tiny_b": dict(
        COMMON,
        vocab_size=192,
        hidden_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=6,
        num_attention_heads=4,
        head_dim=16,
        q_lora_rank=16,
        qk_rope_head_dim=8,
        num_experts_per_tok=3,
        n_routed_experts=6,
        compress_ratios=[0, 0, 4, 128, 4, 128],
        compress_rate_hca=16,
        num_hash_layers=3,
        sliding_window=8,
        o_groups=4,
        o_lora_rank=8,
        index_n_heads=16,
        index_head_dim=8,
        index_topk=4,
        _T=96,
        _chunks=[5, 27, 1, 16, 47],
        _bf16=True,
        _train_mtp=True,
    ),
}
PREFILL_BACK = 10  # prefill T-10, then 10 single steps
WINDOW = 4  # verify-window rows


def make_config(d):
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    return DeepseekV4Config(**d)


def rerandomise(module, gen):
    def normal(shape, scale):
        return torch.randn(shape, generator=gen) * scale

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen) * (hi - lo) + lo

    for name, m in module.named_modules():
        if isinstance(m, M.DeepseekV4RMSNorm):
            m.weight.data = uniform(m.weight.shape, 0.8, 1.2)
        elif isinstance(m, M.DeepseekV4HyperConnection):
            m.fn.data = normal(m.fn.shape, 1 / math.sqrt(m.fn.shape[1]))
            m.base.data = uniform(m.base.shape, -0.5, 0.5)
            m.scale.data = uniform(m.scale.shape, 0.5, 1.5)
        elif isinstance(m, M.DeepseekV4HyperHead):
            m.hc_fn.data = normal(m.hc_fn.shape, 1 / math.sqrt(m.hc_fn.shape[1]))
            m.hc_base.data = uniform(m.hc_base.shape, -0.5, 0.5)
            m.hc_scale.data = uniform(m.hc_scale.shape, 0.5, 1.5)
        elif isinstance(m, nn.Linear):
            # The indexer's projections are wider so its scores spread far
            # beyond f32 rounding at the top-k boundary.
            wide = 4 if (".indexer." in name and not name.endswith("kv_proj") and not name.endswith("gate_proj")) else 1
            m.weight.data = normal(m.weight.shape, wide / math.sqrt(m.weight.shape[1]))
        elif isinstance(m, nn.Embedding):
            m.weight.data = normal(m.weight.shape, 1.0)
        elif isinstance(m, M.DeepseekV4Experts):
            m.gate_up_proj.data = normal(m.gate_up_proj.shape, 1 / math.sqrt(m.gate_up_proj.shape[2]))
            m.down_proj.data = normal(m.down_proj.shape, 1 / math.sqrt(m.down_proj.shape[2]))
        elif isinstance(m, M.DeepseekV4TopKRouter):
            m.weight.data = normal(m.weight.shape, 3 / math.sqrt(m.weight.shape[1]))
            m.e_score_correction_bias.data = uniform(m.e_score_correction_bias.shape, -0.2, 0.2)
        elif isinstance(m, M.DeepseekV4HashRouter):
            m.weight.data = normal(m.weight.shape, 3 / math.sqrt(m.weight.shape[1]))
            v, k = m.tid2eid.shape
            m.tid2eid.data = torch.stack(
                [torch.randperm(m.num_experts, generator=gen)[:k] for _ in range(v)]
            ).long()
        if isinstance(m, M.DeepseekV4Attention):
            m.sinks.data = normal(m.sinks.shape, 1.0)
        if isinstance(m, (M.DeepseekV4HCACompressor, M.DeepseekV4CSACompressor, M.DeepseekV4Indexer)):
            m.position_bias.data = normal(m.position_bias.shape, 0.5)


class MtpHead(nn.Module):
    """Part D's layout, from transformers' classes: e/h projections over the
    four streams, one sliding decoder layer with the learned top-k MoE, its
    own hc_head and the shared final-norm shape."""

    def __init__(self, config):
        super().__init__()
        d = config.hidden_size
        mcfg = copy.deepcopy(config)
        mcfg.num_hidden_layers = 1
        mcfg.layer_types = ["sliding_attention"]
        mcfg.mlp_layer_types = ["moe"]
        self.mcfg = mcfg
        self.enorm = M.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = M.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.block = M.DeepseekV4DecoderLayer(mcfg, 0)
        self.hc_head = M.DeepseekV4HyperHead(config)
        self.norm = M.DeepseekV4RMSNorm(d, eps=config.rms_norm_eps)
        self.rotary = M.DeepseekV4RotaryEmbedding(mcfg)


class MtpReference:
    """The MTP forward with its own sliding cache. Row i of a call combines
    token `tok` (the token after the trunk position) with the trunk's
    pre-hc_head streams `[N, D]` at the trunk position."""

    def __init__(self, head, embed, lm_head):
        self.head, self.embed, self.lm_head = head, embed, lm_head
        self.cache = DynamicCache(config=head.mcfg)
        self.seen = 0

    @torch.no_grad()
    def forward(self, tokens, streams, positions):
        hd = self.head
        w = hd.mcfg.sliding_window
        e = hd.e_proj(hd.enorm(self.embed(tokens)))  # [1, n, D]
        x = hd.h_proj(hd.hnorm(streams)) + e.unsqueeze(-2)  # [1, n, N, D]
        n = tokens.shape[1]
        pos = torch.tensor(positions).view(1, -1)
        pe = {
            "main": hd.rotary(x, position_ids=pos, layer_type="main"),
            "compress": hd.rotary(x, position_ids=pos, layer_type="compress"),
        }
        kept = min(self.seen, w - 1)
        key_pos = list(range(self.seen - kept, self.seen)) + positions
        mask = torch.full((1, 1, n, len(key_pos)), float("-inf"))
        for i, p in enumerate(positions):
            for j, kp in enumerate(key_pos):
                if p - w < kp <= p:
                    mask[0, 0, i, j] = 0.0
        out = hd.block(
            x,
            input_ids=None,
            position_embeddings=pe,
            position_ids=pos,
            attention_mask=mask,
            cache=self.cache,
        )
        self.seen += n
        logits = self.lm_head(hd.norm(hd.hc_head(out)))
        return logits, out


def train_mtp(model, mtp, gen, T, steps=150):
    """Distil the trunk's next-token distribution into the MTP head (row t,
    given the trunk streams at t and token t+1, learns the trunk's logits
    at t+1), so greedy drafts are sometimes accepted and sometimes not:
    random heads are never right, and the MTP loop's accept paths would go
    untested."""
    data = []
    with torch.no_grad():
        for _ in range(4):
            ids = torch.randint(2, model.config.vocab_size, (1, T), generator=gen)
            streams = {}
            L = model.config.num_hidden_layers
            hk = model.model.layers[L - 1].register_forward_hook(lambda m, a, o: streams.__setitem__(0, o))
            out = model(input_ids=ids, use_cache=False)
            hk.remove()
            data.append((ids, streams[0], out.logits))
    params = [p for n, p in mtp.named_parameters() if "rotary" not in n]
    opt = torch.optim.Adam(params, lr=3e-3)
    with torch.enable_grad():
        for step in range(steps):
            loss = 0.0
            for ids, streams, logits in data:
                ref = MtpReference(mtp, model.model.embed_tokens, model.lm_head)
                lg, _ = ref.forward.__wrapped__(ref, ids[:, 1:], streams[:, :-1], list(range(T - 1)))
                # The trunk's greedy token at t+1: what greedy drafts must hit.
                target = logits[:, 1:].argmax(-1)
                loss = loss + torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), target.reshape(-1))
                hits = (lg.argmax(-1) == target).float().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    print(f"MTP distilled: final loss {float(loss) / len(data):.3f}, greedy agreement {float(hits):.2f}")


class TopkProbe:
    """Records the boundary gap of every indexer top-k that prunes (the
    indexer calls `Tensor.topk` on `[B, S, E]` scores with −inf for the
    future)."""

    def __init__(self):
        self.gaps = []
        self.pruned = 0
        self.orig = torch.Tensor.topk

    def __enter__(self):
        probe = self

        def topk(t, k, *a, **kw):
            if t.ndim == 3:
                for row in t.reshape(-1, t.shape[-1]):
                    fin = row[torch.isfinite(row)]
                    if k < fin.numel():
                        s = torch.sort(fin, descending=True).values
                        probe.gaps.append(float(s[k - 1] - s[k]) / max(1.0, float(s[k - 1].abs())))
                        probe.pruned += 1
            return probe.orig(t, k, *a, **kw)

        torch.Tensor.topk = topk
        return self

    def __exit__(self, *exc):
        torch.Tensor.topk = self.orig


def round_bf16(model):
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16).to(torch.float32)
    # Stored buffers (the router's correction bias) are rounded too; the
    # rotary frequency buffers are computed, not stored, and stay f32.
    for name, b in model.named_buffers():
        if b.is_floating_point() and "inv_freq" not in name:
            b.data = b.data.to(torch.bfloat16).to(torch.float32)


def new_cache(model):
    return DynamicCache(config=model.config)


@torch.no_grad()
def reference(name, cfgd, out_dir):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    T = cfgd["_T"]
    config = make_config(cfgd)
    config._attn_implementation = "eager"
    model = M.DeepseekV4ForCausalLM(config).eval()
    rerandomise(model, gen)
    mtp = MtpHead(config).eval()
    rerandomise(mtp, gen)
    if cfgd.get("_train_mtp"):
        train_mtp(model, mtp, gen, T)
    bf16 = cfgd.get("_bf16", False)
    if bf16:
        round_bf16(model)
        round_bf16(mtp)
    ids = torch.randint(2, config.vocab_size, (1, T), generator=gen)
    ref = {"input_ids": ids[0].long()}
    L = config.num_hidden_layers
    csa = [i for i, t in enumerate(config.layer_types) if t == "compressed_sparse_attention"]
    hca = [i for i, t in enumerate(config.layer_types) if t == "heavily_compressed_attention"]

    streams, sel, routed = {}, {}, set()
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: streams.__setitem__(i, o[0])))
        if i in csa:
            hooks.append(
                layer.self_attn.compressor.indexer.register_forward_hook(
                    lambda m, a, o, i=i: sel.__setitem__(i, o[0])
                )
            )
        hooks.append(layer.mlp.gate.register_forward_hook(lambda m, a, o: routed.update(o[2].flatten().tolist())))
    probe = TopkProbe().__enter__()
    out = model(input_ids=ids, use_cache=False)
    for hk in hooks:
        hk.remove()
    ref["logits_full"] = out.logits[0]
    for i in range(L):
        if name == "tiny_b" or i == L - 1:
            ref[f"layer{i}_out_streams"] = streams[i].reshape(T, -1)
    for i in csa:
        ref[f"layer{i}_indexer_topk"] = sel[i].long()
    assert probe.pruned > 0, f"{name}: the indexer never pruned"
    assert len(routed) == config.n_routed_experts, f"{name}: only experts {sorted(routed)} routed"
    for i in hca:
        rate = config.compress_rates["heavily_compressed_attention"]
        assert T // rate >= 1, f"{name}: HCA layer {i} emits nothing"

    # Chunked prefill through the cache.
    chunks = cfgd["_chunks"]
    assert sum(chunks) == T
    cache = new_cache(model)
    rows, s = [], 0
    for n in chunks:
        o = model(input_ids=ids[:, s : s + n], cache=cache, use_cache=True)
        rows.append(o.logits[0])
        s += n
    ref["logits_chunked"] = torch.cat(rows)
    ref["chunks"] = torch.tensor(chunks)

    # Prefill then single-token steps.
    prefill = T - PREFILL_BACK
    cache = new_cache(model)
    o = model(input_ids=ids[:, :prefill], cache=cache, use_cache=True)
    steps = [o.logits[0, -1]]
    for t in range(prefill, T):
        o = model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
        steps.append(o.logits[0, -1])
    ref["logits_steps"] = torch.stack(steps)  # row 0: the last prefill row

    # A verify window after a prefix.
    cache = new_cache(model)
    model(input_ids=ids[:, :prefill], cache=cache, use_cache=True)
    o2 = model(input_ids=ids[:, prefill : prefill + WINDOW], cache=cache, use_cache=True)
    ref["logits_window"] = o2.logits[0]

    # MTP: teacher-forced over rows 0..prefill-1, then a 3-deep chain.
    trunk = streams[L - 1]  # [T, N, D]: pre-hc_head streams
    mref = MtpReference(mtp, model.model.embed_tokens, model.lm_head)
    lp, _ = mref.forward(ids[:, 1 : prefill + 1], trunk[None, :prefill], list(range(prefill)))
    ref["mtp_logits_prefill"] = lp[0]
    x = trunk[None, prefill : prefill + 1]
    chain = []
    for d in range(3):
        tok = ids[:, prefill + 1 + d : prefill + 2 + d]
        lg, x = mref.forward(tok, x, [prefill + d])
        chain.append(lg[0, 0])
    ref["mtp_logits_chain"] = torch.stack(chain)
    probe.__exit__()

    # Relative gaps: our f32 scores differ from torch's by ~1e-6 relative.
    min_gap = min(probe.gaps)
    assert min_gap > 1e-4, f"{name}: indexer top-k boundary tie (relative gap {min_gap})"
    print(f"{name}: {probe.pruned} pruning top-k rows, min boundary gap {min_gap:.4g}, routed {sorted(routed)}")

    save_checkpoint(name, config, cfgd, model, mtp, out_dir, bf16)
    ref = {k: v.contiguous() for k, v in ref.items()}
    save_file(ref, str(OUT / f"{name}.ref.safetensors"))


def saved_state(model):
    """What `save_pretrained` writes (transformers' hybrid names)."""
    tmp = OUT / ".tmp_save"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    cfg = json.loads((tmp / "config.json").read_text())
    shutil.rmtree(tmp)
    return sd, cfg


def mtp_state_dict(mtp, config):
    """`mtp.0.*` in upstream names: the block saved through a one-layer
    model (so transformers' own reverse mapping names it), plus the MTP
    projections, norms and hc head."""
    one = M.DeepseekV4ForCausalLM(mtp.mcfg)
    one.model.layers[0] = mtp.block
    sd, _ = saved_state(one)
    out = {}
    for k, v in sd.items():
        if k.startswith("model.layers.0."):
            out["mtp.0." + k[len("model.layers.0.") :]] = v
    out["mtp.0.enorm.weight"] = mtp.enorm.weight.data
    out["mtp.0.hnorm.weight"] = mtp.hnorm.weight.data
    out["mtp.0.e_proj.weight"] = mtp.e_proj.weight.data
    out["mtp.0.h_proj.weight"] = mtp.h_proj.weight.data
    out["mtp.0.norm.weight"] = mtp.norm.weight.data
    out["mtp.0.hc_head_fn"] = mtp.hc_head.hc_fn.data
    out["mtp.0.hc_head_base"] = mtp.hc_head.hc_base.data
    out["mtp.0.hc_head_scale"] = mtp.hc_head.hc_scale.data
    return out


def upstream_names(sd):
    """Fully upstream top level: no `model.` prefix, `embed.weight`,
    `norm.weight`, `hc_head_fn/base/scale`."""
    out = {}
    for k, v in sd.items():
        if k.startswith("model."):
            k = k[len("model.") :]
        k = {
            "embed_tokens.weight": "embed.weight",
            "hc_head.hc_fn": "hc_head_fn",
            "hc_head.hc_base": "hc_head_base",
            "hc_head.hc_scale": "hc_head_scale",
        }.get(k, k)
        out[k] = v
    return out


def save_checkpoint(name, config, cfgd, model, mtp, out_dir, bf16):
    sd, saved_cfg = saved_state(model)
    sd.update(mtp_state_dict(mtp, config))
    if name == "tiny_b":
        sd = upstream_names(sd)
        # The legacy config forms, as an upstream config.json writes them.
        saved_cfg = {k: v for k, v in cfgd.items() if not k.startswith("_")}
        saved_cfg["model_type"] = "deepseek_v4"
        saved_cfg["architectures"] = ["DeepseekV4ForCausalLM"]
    if bf16:
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in sd.items()}
        saved_cfg["dtype"] = "bfloat16"
    sd = {k: v.contiguous() for k, v in sd.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(saved_cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(out_dir, config.vocab_size)


def save_tokenizer(out_dir, vocab):
    """A word-level tokenizer over the tiny vocabulary (`<s>` 0, `</s>` 1,
    then `w2` … ) so the CLI can load the fixture like any model."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    names = ["<s>", "</s>"] + [f"w{i}" for i in range(2, vocab)]
    tok = Tokenizer(WordLevel({n: i for i, n in enumerate(names)}, unk_token="w2"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(names[:2])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>"}, indent=2) + "\n"
    )


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cfgd in CONFIGS.items():
        reference(name, cfgd, OUT / name)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
