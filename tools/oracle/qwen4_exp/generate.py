"""Regenerate every qwen4_exp fixture under tests/fixtures/qwen4_exp/.

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/generate.py

Three tiny random checkpoints, each with a reference file `<name>.ref.safetensors`:

* `tiny_a` — text-only (`qwen4_exp_text`, keys `model.*`), explicit
  `layer_types` [lin, lin, idx, lin, lin, idx], PLE on layer id 2 (1-indexed),
  per-expert disk layout and a sharded n-gram table (what `save_pretrained`
  writes), sigmoid output gate, untied head, f32.
* `tiny_b` — VL wrapper (`qwen4_exp`, keys `model.language_model.*`, one
  `model.visual.*` tensor the text engine must ignore), `full_attention_interval`
  = 2 (no `layer_types`), PLE on ids [1, 3] (two PLE layers: global head index
  and a second seed offset), ngram_size 4 with ple_embed_dim != hidden_size, a
  kernel-3 PLE conv (dilation 4), silu output gate, fused 3-D experts, one
  unsharded n-gram table, tied embeddings, partial_rotary 0.5, QSA budget 6 /
  ratio 2, f32.
* `tiny_bf16` — `tiny_a`'s shape with 4 layers, stored in bf16. Its reference
  is the f32 forward of the bf16-rounded weights (what the engine computes
  after upcasting on load).

Every checkpoint also carries `mtp.*` weights generated here (transformers
ignores them); the reference MTP forward is composed from transformers' own
`Qwen4ExpTextDecoderLayer`, `Qwen4ExpTextGatedResidual` and
`Qwen4ExpTextRMSNorm` (see `MtpReference`).

Weights are re-randomised so that every path fires (HF init leaves the
zero-centred norms at 0, the PLE conv at 0, and std-0.02 weights barely move
activations). The script asserts that QSA actually prunes, that no indexer
top-k decision sits on a tie (min boundary gap is printed), that MoE routes to
every expert and that the prompt crosses EOS segments.
"""

import copy
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen4ExpTextConfig
from transformers.cache_utils import DynamicCache
from transformers.models.qwen4_exp import modeling_qwen4_exp as M

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "qwen4_exp"
T = 40
PREFILL = 30
EOS = 2

BASE = dict(
    vocab_size=128,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=8,
    shared_expert_intermediate_size=8,
    norm_topk_prob=True,
    hc_count=4,
    hc_lowrank=8,
    indexer_n_heads=4,
    indexer_kv_heads=1,
    indexer_head_dim=16,
    indexer_budget=8,
    indexer_compress_ratio=4,
    ple_conv_kernel_size=4,
    ngram_size=3,
    heads_per_ngram=4,
    ngram_vocab_size_base=1000,
    make_ngram_vocab_size_divisible_by=128,
    seed=1234,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=EOS,
    pad_token_id=None,
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=0.02,
    use_cache=True,
)

CONFIGS = {
    "tiny_a": dict(
        BASE,
        num_hidden_layers=6,
        layer_types=["linear_attention", "linear_attention", "indexed_attention"] * 2,
        output_gate_type="sigmoid",
        ple_layer_ids=[2],
        ple_embed_dim=32,
        split_ngram_parts=4,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=1e7,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
    ),
    "tiny_b": dict(
        BASE,
        num_hidden_layers=5,
        full_attention_interval=2,
        head_dim=16,
        indexer_head_dim=8,
        indexer_n_heads=6,
        indexer_budget=6,
        indexer_compress_ratio=2,
        output_gate_type=None,
        ple_layer_ids=[1, 3],
        ple_embed_dim=24,
        ngram_size=4,
        heads_per_ngram=2,
        ple_conv_kernel_size=3,
        split_ngram_parts=1,
        tie_word_embeddings=True,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=1e6,
            partial_rotary_factor=0.5,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
    ),
    "tiny_bf16": dict(
        BASE,
        num_hidden_layers=4,
        layer_types=["linear_attention", "indexed_attention"] * 2,
        output_gate_type="sigmoid",
        ple_layer_ids=[3],
        ple_embed_dim=32,
        split_ngram_parts=2,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=1e7,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
    ),
}


def make_config(d):
    d = dict(d)
    return Qwen4ExpTextConfig(**d)


def rerandomise(module, gen):
    """Every parameter gets a distribution that makes its path matter."""

    def normal(shape, scale):
        return torch.randn(shape, generator=gen) * scale

    for name, m in module.named_modules():
        if isinstance(m, M.Qwen4ExpTextRMSNorm):
            m.weight.data = (torch.rand(m.weight.shape, generator=gen) * 2 - 1) * 0.1
        elif isinstance(m, M.Qwen4ExpTextRMSNormGated):
            m.weight.data = 1 + (torch.rand(m.weight.shape, generator=gen) * 2 - 1) * 0.1
        elif isinstance(m, nn.Linear):
            m.weight.data = normal(m.weight.shape, 1 / math.sqrt(m.weight.shape[1]))
        elif isinstance(m, nn.Embedding):
            m.weight.data = normal(m.weight.shape, 1.0)
        elif isinstance(m, nn.Conv1d):
            m.weight.data = normal(m.weight.shape, 0.5)
        elif isinstance(m, M.Qwen4ExpTextExperts):
            m.gate_up_proj.data = normal(m.gate_up_proj.shape, 1 / math.sqrt(m.gate_up_proj.shape[2]))
            m.down_proj.data = normal(m.down_proj.shape, 1 / math.sqrt(m.down_proj.shape[2]))
        elif isinstance(m, M.Qwen4ExpTextTopKRouter):
            # Wider router logits: routing decisions far from ties.
            m.weight.data = normal(m.weight.shape, 3 / math.sqrt(m.weight.shape[1]))


class MtpHead(nn.Module):
    """The shipped MTP layout (digest §7), built from transformers' classes."""

    def __init__(self, config):
        super().__init__()
        h, c = config.hidden_size, config.hc_count
        self.config = config
        mcfg = copy.deepcopy(config)
        mcfg.num_hidden_layers = 1
        mcfg.layer_types = ["indexed_attention"]
        mcfg.ple_layer_ids = []
        self.mcfg = mcfg
        self.pre_fc_norm_embedding = M.Qwen4ExpTextRMSNorm(h, eps=config.rms_norm_eps)
        # One statistic over all C·H values (SGLang GemmaRMSNorm(CH)).
        self.pre_fc_norm_hidden = M.Qwen4ExpTextRMSNorm(h * c, eps=config.rms_norm_eps)
        self.fc_embedding = nn.Linear(h, h, bias=False)
        self.fc_hidden = nn.Linear(h, h, bias=False)
        self.layers = nn.ModuleList([M.Qwen4ExpTextDecoderLayer(mcfg, 0)])
        self.hyper_connection_mixer = M.Qwen4ExpTextGatedResidual(config, use_combine=False)
        self.rotary = M.Qwen4ExpTextRotaryEmbedding(mcfg)


class MtpReference:
    """MTP forward with its own cache. Row i of a call combines token `tok`
    (the token after the trunk position) with trunk streams `streams`
    (pre-mixer, [CH]) at RoPE position `pos` (the trunk position)."""

    def __init__(self, head, embed, lm_head):
        self.head, self.embed, self.lm_head = head, embed, lm_head
        self.cache = DynamicCache(config=head.mcfg)
        self.positions = []

    @torch.no_grad()
    def forward(self, tokens, streams, positions):
        hd = self.head
        c, h = hd.config.hc_count, hd.config.hidden_size
        e = hd.fc_embedding(hd.pre_fc_norm_embedding(self.embed(tokens)))  # [1,n,H]
        hn = hd.pre_fc_norm_hidden(streams)  # [1,n,CH]
        x0 = hd.fc_hidden(hn.unflatten(-1, (c, h))) + e.unsqueeze(-2)
        x0 = x0.flatten(-2)
        p = len(self.positions)
        self.positions.extend(positions)
        n = len(tokens[0])
        pos = torch.tensor(self.positions).view(1, 1, -1).expand(3, 1, -1)
        cos, sin = hd.rotary(x0, pos)
        kv = p + n
        mask = torch.full((1, 1, n, kv), torch.finfo(torch.float32).min)
        for i in range(n):
            mask[0, 0, i, : p + i + 1] = 0
        x1 = hd.layers[0](x0, position_embeddings=(cos, sin), attention_mask=mask, cache=self.cache)
        logits = self.lm_head(hd.hyper_connection_mixer(x1))
        return logits, x1


class TopkProbe:
    """Records the boundary gap of every indexer top-k that prunes (the
    indexer calls `Tensor.topk` on 1-D score vectors; the router uses 2-D)."""

    def __init__(self):
        self.gaps = []
        self.orig = torch.Tensor.topk

    def __enter__(self):
        probe = self

        def topk(t, k, *a, **kw):
            if t.ndim == 1 and k < t.shape[0]:
                s = torch.sort(t, descending=True).values
                probe.gaps.append(float(s[k - 1] - s[k]))
            return probe.orig(t, k, *a, **kw)

        torch.Tensor.topk = topk
        return self

    def __exit__(self, *exc):
        torch.Tensor.topk = self.orig


def prompt(gen, vocab):
    ids = torch.randint(3, vocab, (T,), generator=gen)
    ids[17] = EOS
    ids[33] = EOS
    ids[34] = EOS  # two EOS in a row: an empty segment
    return ids.view(1, T)


def round_bf16(model):
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16).to(torch.float32)


@torch.no_grad()
def reference(name, cfgd, out_dir):
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = make_config(cfgd)
    config._attn_implementation = "eager"
    model = M.Qwen4ExpForCausalLM(config).eval()
    rerandomise(model, gen)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    mtp = MtpHead(config).eval()
    mtp.layers[0].mlp.experts.config = config
    rerandomise(mtp, gen)
    bf16 = name.endswith("bf16")
    if bf16:
        round_bf16(model)
        round_bf16(mtp)
    ids = prompt(gen, config.vocab_size)
    ref = {"input_ids": ids[0].long()}
    L = config.num_hidden_layers
    attn_layers = [i for i, t in enumerate(config.layer_types) if t == "indexed_attention"]

    # Full forward with hooks: per-layer streams, QSA selections, routing.
    streams, sel, routed = {}, {}, set()
    hooks = []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: streams.__setitem__(i, o[0])))
        if i in attn_layers:
            hooks.append(
                layer.self_attn.indexer.register_forward_hook(
                    lambda m, a, o, i=i: sel.__setitem__(i, o[0, 0])
                )
            )
        hooks.append(
            layer.mlp.gate.register_forward_hook(lambda m, a, o: routed.update(o[2].flatten().tolist()))
        )
    probe = TopkProbe().__enter__()
    out = model(input_ids=ids, use_cache=True)
    for hk in hooks:
        hk.remove()
    ref["logits_full"] = out.logits[0]
    for i in range(L):
        ref[f"layer{i}_out_streams"] = streams[i]
    for i in attn_layers:
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        s = sel[i] & causal
        pruned = int((causal & ~s).sum())
        assert pruned > 0, f"{name}: QSA layer {i} prunes nothing"
        ref[f"layer{i}_qsa_selected"] = s.long()
        print(f"{name}: layer {i} pruned {pruned} of {int(causal.sum())} causal pairs")
    assert len(routed) == config.num_experts, f"{name}: only experts {sorted(routed)} routed"

    # Chunked prefill through the cache, uneven chunk sizes.
    chunks = [13, 1, 9, 17]
    cache = None
    rows = []
    s = 0
    for n in chunks:
        o = model(input_ids=ids[:, s : s + n], cache=cache, use_cache=True)
        cache = o.cache
        rows.append(o.logits[0])
        s += n
    ref["logits_chunked"] = torch.cat(rows)
    ref["chunks"] = torch.tensor(chunks)

    # Prefill then single-token steps.
    o = model(input_ids=ids[:, :PREFILL], use_cache=True)
    cache = o.cache
    steps = [o.logits[0, -1]]
    for t in range(PREFILL, T):
        o = model(input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
        cache = o.cache
        steps.append(o.logits[0, -1])
    ref["logits_steps"] = torch.stack(steps)  # row 0: last prefill row (position 29)

    # Verify window: prefix of PREFILL then a (K+1)=4-row window.
    o = model(input_ids=ids[:, :PREFILL], use_cache=True)
    o2 = model(input_ids=ids[:, PREFILL : PREFILL + 4], cache=o.cache, use_cache=True)
    ref["logits_window"] = o2.logits[0]

    # MTP: teacher-forced prefill of rows 0..PREFILL-1, then a 3-deep chain.
    trunk = streams[L - 1]  # [T, CH] pre-mixer streams
    mref = MtpReference(mtp, model.model.embed_tokens, model.lm_head)
    logits_p, _ = mref.forward(ids[:, 1 : PREFILL + 1], trunk[None, :PREFILL], list(range(PREFILL)))
    ref["mtp_logits_prefill"] = logits_p[0]
    x = trunk[None, PREFILL : PREFILL + 1]
    chain = []
    for d in range(3):
        tok = ids[:, PREFILL + 1 + d : PREFILL + 2 + d]
        lg, x = mref.forward(tok, x, [PREFILL + d])
        chain.append(lg[0, 0])
    ref["mtp_logits_chain"] = torch.stack(chain)
    probe.__exit__()

    # Every indexer top-k that pruned (trunk full, chunked, steps, window and
    # MTP) had a clear gap at the boundary: no ties for torch to break.
    assert probe.gaps, "indexer never pruned"
    min_gap = min(probe.gaps)
    assert min_gap > 1e-3, f"{name}: indexer top-k boundary tie (gap {min_gap})"
    print(f"{name}: {len(probe.gaps)} pruning top-k calls, min boundary gap {min_gap:.4g}")

    # M-RoPE tables for distinct (t, h, w) positions (image-like rows).
    mpos = torch.randint(0, 200, (3, 1, 8), generator=gen)
    cos, sin = model.model.rotary_emb(torch.zeros(1, 8, 1), mpos)
    ref["mrope_positions"] = mpos[:, 0].long()
    ref["mrope_cos"] = cos[0]
    ref["mrope_sin"] = sin[0]

    # Sanity: the prompt crosses EOS segments where PLE runs.
    assert (ids == EOS).sum() >= 2

    save_checkpoint(name, config, cfgd, model, mtp, out_dir, bf16)
    ref = {k: v.contiguous() for k, v in ref.items()}
    save_file(ref, str(OUT / f"{name}.ref.safetensors"))


def mtp_state_dict(mtp):
    """`mtp.*` keys in the disk layout: per-expert weights."""
    sd = {}
    for k, v in mtp.state_dict().items():
        if "rotary" in k:
            continue
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            i = v.shape[1] // 2
            for e in range(v.shape[0]):
                sd[f"mtp.{base}{e}.gate_proj.weight"] = v[e, :i]
                sd[f"mtp.{base}{e}.up_proj.weight"] = v[e, i:]
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                sd[f"mtp.{base}{e}.down_proj.weight"] = v[e]
        else:
            sd[f"mtp.{k}"] = v
    return sd


def save_checkpoint(name, config, cfgd, model, mtp, out_dir, bf16):
    tmp = out_dir.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    saved_cfg = json.loads((tmp / "config.json").read_text())
    shutil.rmtree(tmp)
    sd.update(mtp_state_dict(mtp))
    if name == "tiny_b":
        sd = to_vl_fused(sd, config)
        text = {k: v for k, v in cfgd.items()}
        text["model_type"] = "qwen4_exp_text"
        saved_cfg = {
            "architectures": ["Qwen4ExpForConditionalGeneration"],
            "model_type": "qwen4_exp",
            "text_config": text,
            "vision_config": {"model_type": "qwen4_exp_vision", "depth": 1, "hidden_size": 8},
            "image_token_id": 248056,
            "video_token_id": 248057,
            "vision_start_token_id": 248053,
            "vision_end_token_id": 248054,
            "tie_word_embeddings": True,
        }
    if bf16:
        sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in sd.items()}
        saved_cfg["dtype"] = "bfloat16"
    sd = {k: v.contiguous() for k, v in sd.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(saved_cfg, indent=2, sort_keys=True) + "\n")
    save_tokenizer(out_dir, config.vocab_size)


def save_tokenizer(out_dir, vocab):
    """A word-level tokenizer over the tiny vocabulary (`<unk>`, `<s>`,
    `</s>`, then `w3` … `w{V-1}`) so the CLI (`ds4server debug logits`) can
    load the fixture directories like any model."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    names = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, vocab)]
    tok = Tokenizer(WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(names[:3])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2) + "\n"
    )


def to_vl_fused(sd, config):
    """VL key prefix, fused 3-D experts, one unsharded n-gram table, plus one
    vision tensor the text engine must ignore."""
    out = {}
    experts = {}
    shards = {}
    for k, v in sd.items():
        if k.startswith("model."):
            k = "model.language_model." + k[len("model.") :]
        if ".mlp.experts." in k and not k.startswith("mtp."):
            base, rest = k.split(".mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault(base, {}).setdefault(proj, {})[int(e)] = v
            continue
        if ".ngram_embedding.shard_" in k:
            base, rest = k.split(".shard_")
            shards.setdefault(base, {})[int(rest.split(".")[0])] = v
            continue
        out[k] = v
    for base, projs in experts.items():
        n = config.num_experts
        gate = torch.stack([projs["gate_proj"][e] for e in range(n)])
        up = torch.stack([projs["up_proj"][e] for e in range(n)])
        out[f"{base}.mlp.experts.gate_up_proj"] = torch.cat([gate, up], dim=1)
        out[f"{base}.mlp.experts.down_proj"] = torch.stack([projs["down_proj"][e] for e in range(n)])
    for base, parts in shards.items():
        out[f"{base}.weight"] = torch.cat([parts[i] for i in range(len(parts))])
    out["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 3, 2, 2, 2)
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cfgd in CONFIGS.items():
        reference(name, cfgd, OUT / name)
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
