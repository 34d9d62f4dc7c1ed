"""Regenerate every glm5_next fixture under tests/fixtures/glm5_next/.

    tools/oracle/.venv/bin/python tools/oracle/glm5_next/generate.py

Two tiny random checkpoints (transformers 5.24 `Glm5NextForConditionalGeneration`,
eager attention, CPU, f32 compute), each with a reference file
`<name>.ref.safetensors`:

* `tiny_a` — the conditional-generation layout `save_pretrained` writes
  (`model_type: glm5_next`, `text_config`, keys `model.language_model.*`,
  upstream leaf names: `hc_attn_fn`, `self_attn.f_a_proj`, `q/k/v_conv1d`,
  per-expert weights; one `model.visual.*` tensor kept, which the text engine
  must ignore), f32, the lower-bounded sigmoid KDA gate, 6 layers
  [KDA, MLA-full, MLA-shared, KDA, KDA, MLA-full] (a shared indexer layer),
  pools of 8 with `index_topk` 16.
* `tiny_b` — the text-only layout (`model_type: glm5_next_text`, keys
  `model.*`) with transformers' internal leaf names (`attn_hc.fn`,
  `forget_gate.*`, a fused `conv1d`, fused 3-D experts), stored in bf16 (its
  reference is the f32 forward of the bf16-rounded weights, what the engine
  computes after upcasting), the softplus KDA gate, 5 layers
  [KDA, MLA, KDA, MLA, MLA] all with full indexers, pools of 4 with
  `index_topk` 8.

In both, T = 40 exceeds `index_topk + P − 1` (23 and 11), so the selection
prunes; the script asserts it, asserts that no pruning top-k decision sits
on a tie (the minimum boundary gap is printed), that the group-limited
router's −inf masking (not 0) changes at least one routing decision (the
correction bias is partly negative), that every expert is routed to, and
that the chunked and stepped runs select the same sets as the full forward.

The NextN MTP layer (Part D of the digest; transformers does not build it)
is composed from transformers' own `Glm5NextTextRMSNorm`,
`Glm5NextTextAttention` (a full indexed layer) and `Glm5NextTextMoE` with a
plain pre-norm residual (no mHC), saved under `layers.{L}.` (L =
`num_hidden_layers`): `enorm`, `hnorm`, `eh_proj [D, 2D]` over
`[enorm(embed(tok)) | hnorm(h)]`, the block, `shared_head.norm`, then the
trunk's `lm_head` (`tiny_a` also stores the DeepSeek-V3 / GLM-4.5-style
copies `shared_head.head` and `embed_tokens`). `h` is the trunk's final hidden (stream mean, then the
final norm: what `lm_head` reads); a deeper draft feeds the layer's output
before `shared_head.norm`. The layer starts near a bigram predictor
(`near_bigram`) so that greedy drafts are sometimes right; the script
asserts both right and wrong drafts on greedy paths.

Weights: `torch.manual_seed(0)` builds the model, then a `Generator` seeded
with 1 re-randomises every parameter (the constant inits — kpool ape zeros,
kpool gate ones, `A_log` zeros, router bias zeros, norms ones, hc base and
scale — would make paths degenerate).
"""

import copy
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration
from transformers.cache_utils import DynamicCache
from transformers.models.glm5_next import modeling_glm5_next as M

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "glm5_next"
T = 40
PREFILL = 30
CHUNKS = [13, 1, 9, 17]
WINDOW = 4
DEPTH = 3

TEXT = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    moe_intermediate_size=8,
    num_attention_heads=2,
    num_key_value_heads=2,
    n_shared_experts=1,
    n_routed_experts=8,
    routed_scaling_factor=2.5,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=0,
    v_head_dim=8,
    qk_nope_head_dim=8,
    n_group=4,
    topk_group=2,
    num_experts_per_tok=3,
    norm_topk_prob=True,
    max_position_embeddings=256,
    initializer_range=0.1,
    rms_norm_eps=1e-5,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=1,
    tie_word_embeddings=False,
    index_head_dim=8,
    index_n_heads=16,
    index_kpool_always_select_tail=True,
    swiglu_limit=10.0,
    linear_head_dim=8,
    linear_num_heads=2,
    linear_conv_kernel_dim=4,
    hc_mult=4,
    hc_eps=1e-6,
    hc_sinkhorn_iters=20,
)

CONFIGS = {
    "tiny_a": dict(
        TEXT,
        num_hidden_layers=6,
        layer_types=[
            "linear_attention",
            "indexed_attention",
            "indexed_attention",
            "linear_attention",
            "linear_attention",
            "indexed_attention",
        ],
        mlp_layer_types=["dense", "dense", "sparse", "sparse", "sparse", "sparse"],
        indexer_types=["full", "full", "shared", "full", "full", "full"],
        index_topk=16,
        index_kpool=8,
        linear_lower_bound=-5.0,
    ),
    "tiny_b": dict(
        TEXT,
        num_hidden_layers=5,
        layer_types=[
            "linear_attention",
            "indexed_attention",
            "linear_attention",
            "indexed_attention",
            "indexed_attention",
        ],
        mlp_layer_types=["dense", "sparse", "sparse", "dense", "sparse"],
        indexer_types=["full"] * 5,
        index_topk=8,
        index_kpool=4,
        linear_lower_bound=None,
    ),
}

VISION = dict(
    depth=1,
    hidden_size=16,
    num_heads=2,
    intermediate_size=16,
    out_hidden_size=16,
    projection_intermediate_size=16,
    patch_size=14,
    temporal_patch_size=2,
    spatial_merge_size=2,
)


def make_config(text):
    cfg = Glm5NextConfig(
        text_config=dict(text),
        vision_config=dict(VISION),
        image_token_id=58,
        video_token_id=59,
        image_start_token_id=60,
        image_end_token_id=61,
        video_start_token_id=62,
        video_end_token_id=63,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    return cfg


def rerandomise(module, gen, softplus_gate):
    """Every parameter gets a distribution that makes its path matter."""

    def normal(shape, scale):
        return torch.randn(shape, generator=gen) * scale

    def uniform(shape, lo, hi):
        return lo + torch.rand(shape, generator=gen) * (hi - lo)

    for _, m in module.named_modules():
        if isinstance(m, (M.Glm5NextTextRMSNorm, M.Glm5NextTextRMSNormGated)):
            m.weight.data = uniform(m.weight.shape, 0.8, 1.2)
        elif isinstance(m, nn.LayerNorm):
            m.weight.data = uniform(m.weight.shape, 0.8, 1.2)
            m.bias.data = uniform(m.bias.shape, -0.2, 0.2)
        elif isinstance(m, nn.Linear):
            m.weight.data = normal(m.weight.shape, 1 / math.sqrt(m.weight.shape[1]))
        elif isinstance(m, nn.Embedding):
            m.weight.data = normal(m.weight.shape, 1.0)
        elif isinstance(m, nn.Conv1d):
            m.weight.data = normal(m.weight.shape, 0.5)
        elif isinstance(m, M.Glm5NextTextHyperConnection):
            m.fn.data = normal(m.fn.shape, 1 / math.sqrt(m.fn.shape[1]))
            m.base.data = uniform(m.base.shape, -0.5, 0.5)
            m.scale.data = uniform(m.scale.shape, 0.7, 1.3)
        elif isinstance(m, M.Glm5NextTextExperts):
            m.gate_up_proj.data = normal(m.gate_up_proj.shape, 1 / math.sqrt(m.gate_up_proj.shape[2]))
            m.down_proj.data = normal(m.down_proj.shape, 1 / math.sqrt(m.down_proj.shape[2]))
        elif isinstance(m, M.Glm5NextTextTopkRouter):
            # Wide logits: routing decisions far from ties. Half of the
            # correction biases are negative enough to push a choice below 0,
            # where masking other groups to 0 instead of −inf would differ.
            m.weight.data = normal(m.weight.shape, 3 / math.sqrt(m.weight.shape[1]))
            bias = uniform(m.e_score_correction_bias.shape, -0.2, 0.2)
            bias[1::2] -= 1.2
            m.e_score_correction_bias.data = bias
        elif isinstance(m, M.Glm5NextTextForgetGate):
            if softplus_gate:
                m.A_log.data = uniform(m.A_log.shape, -1.0, 0.5)
            else:
                m.A_log.data = normal(m.A_log.shape, 0.5)
            m.dt_bias.data = uniform(m.dt_bias.shape, -1.0, 1.0)
        elif isinstance(m, M.Glm5NextTextIndexer):
            m.index_kpool_compress_ape.data = normal(m.index_kpool_compress_ape.shape, 0.7)
            m.index_kpool_compress_gate.data = normal(
                m.index_kpool_compress_gate.shape, 1 / math.sqrt(m.index_kpool_compress_gate.shape[1])
            )


class NextN(nn.Module):
    """The NextN MTP layer (digest Part D), from transformers' own classes."""

    def __init__(self, text):
        super().__init__()
        d, eps = text.hidden_size, text.rms_norm_eps
        mcfg = copy.deepcopy(text)
        mcfg.num_hidden_layers = 1
        mcfg.layer_types = ["indexed_attention"]
        mcfg.mlp_layer_types = ["sparse"]
        mcfg.indexer_types = ["full"]
        mcfg._attn_implementation = "eager"
        self.mcfg = mcfg
        self.enorm = M.Glm5NextTextRMSNorm(d, eps)
        self.hnorm = M.Glm5NextTextRMSNorm(d, eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.input_layernorm = M.Glm5NextTextRMSNorm(d, eps)
        self.self_attn = M.Glm5NextTextAttention(mcfg, 0)
        self.post_attention_layernorm = M.Glm5NextTextRMSNorm(d, eps)
        self.mlp = M.Glm5NextTextMoE(mcfg)
        self.shared_head_norm = M.Glm5NextTextRMSNorm(d, eps)


class NextNReference:
    """The MTP forward with its own cache: row i combines `tokens[i]` (the
    token after the trunk position) with `hidden[i]`."""

    def __init__(self, head, embed, lm_head):
        self.head, self.embed, self.lm_head = head, embed, lm_head
        self.cache = DynamicCache(config=head.mcfg)

    @torch.no_grad()
    def forward(self, tokens, hidden):
        hd = self.head
        e = hd.enorm(self.embed(tokens))
        h = hd.hnorm(hidden)
        x = hd.eh_proj(torch.cat([e, h], dim=-1))
        mask = torch.ones(tokens.shape, dtype=torch.bool)
        a, _, _ = hd.self_attn(hd.input_layernorm(x), attention_mask=mask, cache=self.cache)
        x = x + a
        x = x + hd.mlp(hd.post_attention_layernorm(x))
        return self.lm_head(hd.shared_head_norm(x)), x


def near_bigram(mtp, d):
    """Start the NextN layer near a bigram predictor, as a trained head is
    correlated with the trunk: `eh_proj` passes the embedding half through
    (identity plus noise, the hidden half scaled down) and the block's
    outputs are scaled down. Without this, random greedy drafts are
    accepted at chance (1 in V), too rarely for the decode tests to see
    both accepted and rejected drafts."""
    with torch.no_grad():
        w = mtp.eh_proj.weight
        w[:, :d] = torch.eye(d) + 0.1 * w[:, :d]
        w[:, d:] *= 0.1
        mtp.self_attn.o_proj.weight.mul_(0.1)
        mtp.mlp.experts.down_proj.mul_(0.1)
        mtp.mlp.shared_experts.down_proj.weight.mul_(0.1)


@torch.no_grad()
def greedy_drafts(name, model, mtp, tcfg):
    """On greedy paths from a few prompts, the NextN depth-1 draft for
    position t+2 must sometimes equal the greedy token and sometimes not."""
    lm = model.model.language_model
    gen = torch.Generator().manual_seed(7)
    hits = miss = 0
    for plen in [5, 11, 8, 6, 9]:
        seq = torch.randint(2, tcfg.vocab_size, (1, plen), generator=gen)
        for _ in range(14):
            lg = run(model, seq, DynamicCache(config=tcfg)).logits
            seq = torch.cat([seq, lg[:, -1:].argmax(-1)], 1)
        fin = {}
        hk = lm.norm.register_forward_hook(lambda m, a, o: fin.__setitem__("h", o))
        run(model, seq, DynamicCache(config=tcfg))
        hk.remove()
        lp, _ = NextNReference(mtp, lm.embed_tokens, model.lm_head).forward(seq[:, 1:], fin["h"][:, :-1])
        draft = lp[0].argmax(-1)
        for t in range(plen - 1, seq.shape[1] - 2):
            hits += int(draft[t] == seq[0, t + 2])
            miss += int(draft[t] != seq[0, t + 2])
    assert hits > 0 and miss > 0, f"{name}: greedy drafts {hits} right, {miss} wrong"
    print(f"{name}: greedy NextN drafts {hits} right, {miss} wrong")


class TopkProbe:
    """Boundary gaps of every indexer top-k that prunes a valid pool (the
    indexer's only `topk` call runs between its pre- and post-hook)."""

    def __init__(self, model):
        self.gaps, self.pruned, self.active = [], 0, False
        self.orig = torch.Tensor.topk
        self.model = model

    def install(self, modules):
        for m in modules:
            m.register_forward_pre_hook(lambda *a: setattr(self, "active", True))
            m.register_forward_hook(lambda *a: setattr(self, "active", False))
        probe = self
        floor = torch.finfo(torch.float32).min / 2

        def topk(t, k, *a, **kw):
            if probe.active:
                rows = t.reshape(-1, t.shape[-1])
                for r in rows:
                    s = torch.sort(r, descending=True).values
                    if k < s.shape[0] and s[k] > floor:
                        probe.pruned += 1
                        probe.gaps.append(float(s[k - 1] - s[k]))
            return probe.orig(t, k, *a, **kw)

        torch.Tensor.topk = topk

    def remove(self):
        torch.Tensor.topk = self.orig


def selection_sets(idx):
    """`[S, W]` int32 with −1 → `[S, W]` int64, each row's valid indices
    ascending then −1."""
    out = torch.full(idx.shape, -1, dtype=torch.long)
    for i, row in enumerate(idx.long()):
        v = torch.sort(row[row >= 0]).values
        assert len(torch.unique(v)) == len(v), "duplicate selected index"
        out[i, : len(v)] = v
    return out


def route_with_zero_mask(router, x):
    """The router's choice if other groups were masked to 0, not −inf."""
    s = torch.sigmoid(nn.functional.linear(x.float(), router.weight.float()))
    c = s + router.e_score_correction_bias
    g, e = router.num_group, router.num_experts
    gs = c.view(-1, g, e // g).topk(2, dim=-1)[0].sum(-1)
    keep = torch.zeros_like(gs).scatter_(1, torch.topk(gs, router.topk_group, dim=-1)[1], 1)
    mask = keep.unsqueeze(-1).expand(-1, g, e // g).reshape(-1, e).bool()
    return torch.topk(c.masked_fill(~mask, 0.0), router.top_k, dim=-1)[1].sort(-1).values


def run(model, ids, cache):
    return model(input_ids=ids, cache=cache, use_cache=True)


@torch.no_grad()
def reference(name, text):
    torch.manual_seed(0)
    config = make_config(text)
    model = Glm5NextForConditionalGeneration(config).eval()
    tcfg = model.config.text_config
    gen = torch.Generator().manual_seed(1)
    softplus = text["linear_lower_bound"] is None
    rerandomise(model, gen, softplus)
    mtp = NextN(tcfg).eval()
    rerandomise(mtp, gen, softplus)
    near_bigram(mtp, tcfg.hidden_size)
    bf16 = name == "tiny_b"
    if bf16:
        for p in list(model.parameters()) + list(mtp.parameters()):
            p.data = p.data.to(torch.bfloat16).to(torch.float32)
        for b in model.buffers():
            if b.is_floating_point():
                b.data = b.data.to(torch.bfloat16).to(torch.float32)
        for b in mtp.buffers():
            if b.is_floating_point():
                b.data = b.data.to(torch.bfloat16).to(torch.float32)
    lm = model.model.language_model
    L = tcfg.num_hidden_layers
    ids = torch.randint(2, tcfg.vocab_size, (1, T), generator=gen)
    ref = {"input_ids": ids[0].long()}
    full_layers = [i for i in range(L) if tcfg.layer_types[i] == "indexed_attention"]
    indexers = [lm.layers[i].self_attn.indexer for i in full_layers if lm.layers[i].self_attn.indexer is not None]
    probe = TopkProbe(model)
    probe.install(indexers + [mtp.self_attn.indexer])

    # Full forward with hooks: streams, selections, routing, final hidden.
    streams, sel, routed, gate_in, final = {}, {}, set(), [], {}
    hooks = []
    for i, layer in enumerate(lm.layers):
        hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: streams.__setitem__(i, o[0][0])))
        if i in full_layers and layer.self_attn.indexer is not None:
            hooks.append(
                layer.self_attn.indexer.register_forward_hook(lambda m, a, o, i=i: sel.__setitem__(i, o[0]))
            )
        if tcfg.mlp_layer_types[i] == "sparse":
            hooks.append(
                layer.mlp.gate.register_forward_hook(
                    lambda m, a, o: routed.update(o[2].flatten().tolist()) or gate_in.append((m, a[0]))
                )
            )
    hooks.append(lm.norm.register_forward_hook(lambda m, a, o: final.__setitem__("h", o[0])))
    full = run(model, ids, DynamicCache(config=tcfg))
    for hk in hooks:
        hk.remove()
    ref["logits_full"] = full.logits[0]
    ref["hidden_final"] = final["h"]
    if name == "tiny_a":
        for i in range(L):
            ref[f"layer{i}_streams"] = streams[i].flatten(-2)
    # Each full layer's selection (a shared successor reuses it).
    sets_full = {i: selection_sets(idx) for i, idx in sel.items()}
    for i, s in sets_full.items():
        ref[f"layer{i}_selection"] = s
        causal = T * (T + 1) // 2
        picked = int((s >= 0).sum())
        assert picked < causal, f"{name}: layer {i} prunes nothing"
        print(f"{name}: layer {i} selects {picked} of {causal} causal pairs")
    assert len(routed) == tcfg.n_routed_experts, f"{name}: only experts {sorted(routed)} routed"
    differs = sum(
        int((route_with_zero_mask(m, x) != m(x)[2].sort(-1).values).any(-1).sum()) for m, x in gate_in
    )
    assert differs > 0, f"{name}: −inf vs 0 group masking never matters"
    print(f"{name}: {differs} routing rows differ under 0-masking")

    # Chunked prefill through the cache, uneven chunk sizes.
    cache = DynamicCache(config=tcfg)
    rows, s = [], 0
    for n in CHUNKS:
        rows.append(run(model, ids[:, s : s + n], cache).logits[0])
        s += n
    ref["logits_chunked"] = torch.cat(rows)
    ref["chunks"] = torch.tensor(CHUNKS)

    # Prefill then single-token steps; selections of the steps must equal
    # the full forward's rows.
    cache = DynamicCache(config=tcfg)
    step_sel = {}
    hooks = [
        lm.layers[i].self_attn.indexer.register_forward_hook(
            lambda m, a, o, i=i: step_sel.setdefault(i, []).append(o[0])
        )
        for i in sets_full
    ]
    o = run(model, ids[:, :PREFILL], cache)
    steps = [o.logits[0, -1]]
    for t in range(PREFILL, T):
        steps.append(run(model, ids[:, t : t + 1], cache).logits[0, -1])
    for hk in hooks:
        hk.remove()
    ref["logits_steps"] = torch.stack(steps)
    for i, parts in step_sel.items():
        got = selection_sets(torch.cat(parts))
        assert torch.equal(got, sets_full[i]), f"{name}: layer {i} stepped selection differs"

    # Verify window after a prefix.
    cache = DynamicCache(config=tcfg)
    run(model, ids[:, :PREFILL], cache)
    ref["logits_window"] = run(model, ids[:, PREFILL : PREFILL + WINDOW], cache).logits[0]

    # MTP: rows 0..PREFILL-1 teacher-forced, then a DEPTH-deep chain.
    h = final["h"]
    mref = NextNReference(mtp, lm.embed_tokens, model.lm_head)
    lp, _ = mref.forward(ids[:, 1 : PREFILL + 1], h[None, :PREFILL])
    ref["mtp_logits_prefill"] = lp[0]
    x = h[None, PREFILL : PREFILL + 1]
    chain = []
    for d in range(DEPTH):
        tok = ids[:, PREFILL + 1 + d : PREFILL + 2 + d]
        lg, x = mref.forward(tok, x)
        chain.append(lg[0, 0])
    ref["mtp_logits_chain"] = torch.stack(chain)
    probe.remove()

    assert probe.pruned > 0, f"{name}: the indexer never pruned"
    gap = min(probe.gaps)
    assert gap > 1e-3, f"{name}: indexer top-k boundary tie (gap {gap})"
    print(f"{name}: {probe.pruned} pruning top-k rows, min boundary gap {gap:.4g}")

    greedy_drafts(name, model, mtp, tcfg)
    save_checkpoint(name, model, mtp, bf16)
    ref = {k: v.contiguous() for k, v in ref.items()}
    save_file(ref, str(OUT / f"{name}.ref.safetensors"))


def mtp_state_dict(mtp, prefix, fused):
    """The NextN layer under `{prefix}layers.{L}.`."""
    sd = {}
    for k, v in mtp.state_dict().items():
        k = k.replace("shared_head_norm", "shared_head.norm")
        if not fused and k.endswith("mlp.experts.gate_up_proj"):
            i = v.shape[1] // 2
            for e in range(v.shape[0]):
                sd[f"{prefix}mlp.experts.{e}.gate_proj.weight"] = v[e, :i]
                sd[f"{prefix}mlp.experts.{e}.up_proj.weight"] = v[e, i:]
        elif not fused and k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                sd[f"{prefix}mlp.experts.{e}.down_proj.weight"] = v[e]
        else:
            sd[f"{prefix}{k}"] = v
    return sd


def save_checkpoint(name, model, mtp, bf16):
    out_dir = OUT / name
    tmp = out_dir.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    cfg = json.loads((tmp / "config.json").read_text())
    shutil.rmtree(tmp)
    L = model.config.text_config.num_hidden_layers
    if name == "tiny_a":
        # Keep one vision tensor: the text engine must ignore model.visual.*.
        visual = sorted(k for k in sd if k.startswith("model.visual."))
        for k in visual[1:]:
            del sd[k]
        p = f"model.language_model.layers.{L}."
        sd.update(mtp_state_dict(mtp, p, fused=False))
        sd[f"{p}shared_head.head.weight"] = model.lm_head.weight.detach().clone()
        sd[f"{p}embed_tokens.weight"] = model.model.language_model.embed_tokens.weight.detach().clone()
    else:
        sd = to_text_internal(sd)
        sd.update(mtp_state_dict(mtp, f"model.layers.{L}.", fused=True))
        text = cfg["text_config"]
        text["model_type"] = "glm5_next_text"
        cfg = text
    if bf16:
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in sd.items()}
        cfg["dtype"] = "bfloat16"
    sd = {k: v.contiguous() for k, v in sd.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(out_dir, model.config.text_config.vocab_size)


def to_text_internal(sd):
    """Text-only keys (`model.*`, no vision) with transformers' internal leaf
    names: `attn_hc.*`, `forget_gate.*`, one `conv1d`, fused experts."""
    out, experts, convs = {}, {}, {}
    for k, v in sd.items():
        if k.startswith("model.visual."):
            continue
        k = k.replace("model.language_model.", "model.")
        for a, b in [("hc_attn_", "attn_hc."), ("hc_ffn_", "ffn_hc.")]:
            k = k.replace(a, b)
        for g in ["f_a_proj", "f_b_proj", "dt_bias", "A_log"]:
            k = k.replace(f"self_attn.{g}", f"self_attn.forget_gate.{g}")
        if ".mlp.experts." in k:
            base, rest = k.split(".mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault(base, {}).setdefault(proj, {})[int(e)] = v
            continue
        if k.endswith("_conv1d.weight"):
            base, which = k[: -len("_conv1d.weight")].rsplit(".", 1)
            convs.setdefault(base, {})[which] = v
            continue
        out[k] = v
    for base, projs in experts.items():
        n = len(projs["gate_proj"])
        gate = torch.stack([projs["gate_proj"][e] for e in range(n)])
        up = torch.stack([projs["up_proj"][e] for e in range(n)])
        out[f"{base}.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[f"{base}.mlp.experts.down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)])
    for base, c in convs.items():
        out[f"{base}.conv1d.weight"] = torch.cat([c["q"], c["k"], c["v"]], dim=0)
    return out


def save_tokenizer(out_dir, vocab):
    """A word-level tokenizer over the tiny vocabulary (`<pad>`, `</s>`,
    then `w2` … `w{V-1}`) so the CLI can load the fixture like any model."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    names = ["<pad>", "</s>"] + [f"w{i}" for i in range(2, vocab)]
    tok = Tokenizer(WordLevel({n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(names[:2])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<pad>"}, indent=2) + "\n"
    )


def main():
    torch.set_num_threads(1)
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in CONFIGS.items():
        reference(name, text)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures: {total / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
