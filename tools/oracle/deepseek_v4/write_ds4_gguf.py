"""Write a tiny DeepSeek-V4 checkpoint as antirez/ds4 GGUF files, plus the same
weights dequantized to f32 as a Hugging Face directory.

    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/write_ds4_gguf.py
    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/write_ds4_gguf.py \
        --recipe q2 --inter 256 --out /tmp/ds4_q2     # not committed, see below

Output (default: `tests/fixtures/deepseek_v4/ds4_gguf/`):

* `model.gguf` — the trunk in ds4's layout (`ds4.c` `weights_bind` /
  `weights_validate_layout`, `gguf-tools/deepseek4-quantize.c` `top_map` /
  `layer_map`, antirez/ds4 @ 8d57664): ds4's tensor names, ds4's types per
  group (F16 embedding, HC, compressor, indexer and router; Q8_0 attention
  projections, shared expert and output; F32 norms, HC base/scale, sinks and
  router bias; I32 `ffn_gate_tid2eid`; routed experts in a routed type, one
  3-D `[E, out, in]` stack per projection) and the `deepseek4.*` metadata
  keys ds4's `config_validate_model` reads.
* `mtp.gguf` — ds4's separate MTP file (`mtp_weights_bind`): `mtp.0.*`,
  plain tensors (HC fns, router) in F32 as in ds4's
  `DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf`.
* `f32/` — `config.json` (the same configuration in transformers' form) and
  `model.safetensors`: every tensor of both files, dequantized by gguf-py
  0.19 (`gguf.quants.dequantize`), under the upstream names our
  `deepseek_v4` family binds for a Hugging Face directory. Values are
  gguf-py's f32 results; a tensor is stored as F16 when that is lossless
  (asserted per tensor), otherwise as F32.

Routed experts. ds4 ships IQ2_XXS gate/up + Q2_K down (q2), Q4_K (q4), q2
with Q4_K in the last layers (q2-q4 mixed) and native MXFP4 (the ds4f-mxfp4
recipe). gguf-py 0.19 quantizes Q8_0 and MXFP4 but not IQ2_XXS, Q2_K or
Q4_K, so those blocks are random valid blocks (random grid / sign / scale
bits, 6-bit scales and mins centred, super-block scales a power of two so
every dequantized value is exact in F16); MXFP4 and Q8_0 go through
`gguf.quants.quantize`. Q8_0 sources are snapped to a power-of-two grid per
block (gguf-py then reproduces them exactly), for the same reason: it keeps
the f32 copy small.

The committed fixture (1.98 MB) is a CSA layer with hash routing, an HCA
layer and the MTP block at D 256, hc 2, 3 experts of width 32
(`--inter 32`): 256-value K-quant blocks need rows of 256 inputs, so gate/up
(rows of `hidden` = 256) carry IQ2_XXS (layer 0), Q2_K (layer 1) and Q4_K
(MTP), and down (rows of `moe_intermediate_size` = 32) MXFP4. A true ds4
recipe needs `--inter 256` (K-quant down) and is ~7.5 MB:
`--recipe q2|q4|mixed|mxfp4 --inter 256 --out DIR` writes one for a local
run of `crates/engine/tests/deepseek_v4_gguf.rs` with
`DS4_GGUF_FIXTURE=DIR` (not committed).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as G  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "deepseek_v4" / "ds4_gguf"
QK_K = 256

EOS_TEXT = "<｜end▁of▁sentence｜>"
BOS_TEXT = "<｜begin▁of▁sentence｜>"

# Routed (gate/up, down) types of the trunk layers, then the MTP block.
IQ2, Q2K, Q4K, FP4 = Q.IQ2_XXS, Q.Q2_K, Q.Q4_K, Q.MXFP4
RECIPES = {
    # The committed fixture: every routed type ds4 reads, rows of 32 for down.
    "tiny": [(IQ2, FP4), (Q2K, FP4), (Q4K, FP4)],
    # ds4's recipes (they need --inter 256): q2, q4, q2 with a Q4_K last
    # layer (ds4's q2-q4 splice), native MXFP4; ds4's MTP file is Q4_K.
    "q2": [(IQ2, Q2K), (IQ2, Q2K), (Q4K, Q4K)],
    "q4": [(Q4K, Q4K)] * 3,
    "mixed": [(IQ2, Q2K), (Q4K, Q4K), (Q4K, Q4K)],
    "mxfp4": [(FP4, FP4), (FP4, FP4), (Q4K, Q4K)],
}


def config_dict(inter):
    return dict(
        G.COMMON,
        vocab_size=48,
        hidden_size=256,
        moe_intermediate_size=inter,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=32,
        q_lora_rank=32,
        partial_rotary_factor=0.25,
        num_experts_per_tok=2,
        n_routed_experts=3,
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
        # ds4: CSA is ratio 4, HCA 128; 8 here so 48 tokens make 6 entries.
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        mlp_layer_types=["hash_moe", "moe"],
        sliding_window=8,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        max_position_embeddings=1 << 20,
        hc_mult=2,
    )


# ds4's gguf-tools/deepseek4-quantize.c `top_map` / `layer_map` (GGUF name ←
# upstream name). Our loader binds `attn.norm.weight` for the KV norm (the
# name transformers saves); ds4's table reads DeepSeek's `attn.kv_norm.weight`.
TOP_MAP = {
    "embed.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "head.weight": "output.weight",
    "hc_head_base": "output_hc_base.weight",
    "hc_head_fn": "output_hc_fn.weight",
    "hc_head_scale": "output_hc_scale.weight",
}
LAYER_MAP = {
    "hc_attn_base": "hc_attn_base.weight",
    "hc_attn_fn": "hc_attn_fn.weight",
    "hc_attn_scale": "hc_attn_scale.weight",
    "hc_ffn_base": "hc_ffn_base.weight",
    "hc_ffn_fn": "hc_ffn_fn.weight",
    "hc_ffn_scale": "hc_ffn_scale.weight",
    "attn.attn_sink": "attn_sinks.weight",
    "attn.wq_a.weight": "attn_q_a.weight",
    "attn.wq_b.weight": "attn_q_b.weight",
    "attn.q_norm.weight": "attn_q_a_norm.weight",
    "attn.wkv.weight": "attn_kv.weight",
    "attn.norm.weight": "attn_kv_a_norm.weight",
    "attn.wo_a.weight": "attn_output_a.weight",
    "attn.wo_b.weight": "attn_output_b.weight",
    "attn.compressor.ape": "attn_compressor_ape.weight",
    "attn.compressor.wkv.weight": "attn_compressor_kv.weight",
    "attn.compressor.wgate.weight": "attn_compressor_gate.weight",
    "attn.compressor.norm.weight": "attn_compressor_norm.weight",
    "attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
    "attn.indexer.weights_proj.weight": "indexer.proj.weight",
    "attn.indexer.compressor.ape": "indexer_compressor_ape.weight",
    "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv.weight",
    "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate.weight",
    "attn.indexer.compressor.norm.weight": "indexer_compressor_norm.weight",
    "attn_norm.weight": "attn_norm.weight",
    "ffn_norm.weight": "ffn_norm.weight",
    "ffn.shared_experts.w1.weight": "ffn_gate_shexp.weight",
    "ffn.shared_experts.w3.weight": "ffn_up_shexp.weight",
    "ffn.shared_experts.w2.weight": "ffn_down_shexp.weight",
    "ffn.gate.weight": "ffn_gate_inp.weight",
    "ffn.gate.bias": "exp_probs_b.bias",
    "ffn.gate.tid2eid": "ffn_gate_tid2eid.weight",
}
MTP_OWN = {
    "e_proj.weight": "e_proj.weight",
    "h_proj.weight": "h_proj.weight",
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "norm.weight": "norm.weight",
    "hc_head_base": "hc_head_base.weight",
    "hc_head_fn": "hc_head_fn.weight",
    "hc_head_scale": "hc_head_scale.weight",
}
EXPERT_PARTS = {"w1": "ffn_gate_exps.weight", "w3": "ffn_up_exps.weight", "w2": "ffn_down_exps.weight"}


def gguf_type(gname, mtp):
    """ds4's type of a non-routed tensor (`weights_validate_layout`)."""
    if gname.endswith("ffn_gate_tid2eid.weight"):
        return "I32"
    # The indexer's query projection is F16 in ds4 (checked before the
    # attention suffixes, which `indexer.attn_q_b` would also match).
    if "indexer.attn_q_b" in gname:
        return Q.F16
    if any(gname.endswith(s) for s in ("attn_q_a.weight", "attn_q_b.weight", "attn_kv.weight",
                                       "attn_output_a.weight", "attn_output_b.weight", "_shexp.weight",
                                       "e_proj.weight", "h_proj.weight")) or gname == "output.weight":
        return Q.Q8_0
    if gname == "token_embd.weight" or any(s in gname for s in ("_compressor_ape", "_compressor_kv", "_compressor_gate",
                                                                 "indexer.attn_q_b", "indexer.proj")):
        return Q.F16
    if gname.endswith(("hc_attn_fn.weight", "hc_ffn_fn.weight", "hc_head_fn.weight", "output_hc_fn.weight",
                       "ffn_gate_inp.weight")):
        # ds4's MTP file keeps these plain tensors in F32 (F16 or F32 accepted).
        return Q.F32 if mtp else Q.F16
    return Q.F32


def snap_q8(x):
    """Per 32-block: integers in ±127 times a power of two, with ±127 present,
    so gguf-py's Q8_0 (d = max/127) reproduces the block exactly."""
    b = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(b).max(axis=1, keepdims=True)
    p = 2.0 ** np.ceil(np.log2(np.maximum(amax, 1e-30) / 127.0))
    q = np.clip(np.round(b / p), -127, 127)
    i = np.abs(b).argmax(axis=1)
    q[np.arange(len(q)), i] = np.where(b[np.arange(len(q)), i] < 0, -127, 127)
    return (q * p).astype(np.float32).reshape(x.shape)


def random_blocks(ty, rows, cols, rng):
    """Random valid blocks of a K / IQ type `[rows, cols]`: a power-of-two
    super-block scale, centred 6-bit (Q4_K) or 4-bit (Q2_K) scales and mins."""
    assert cols % QK_K == 0, f"{ty.name} rows need multiples of {QK_K} inputs, not {cols}"
    n = rows * cols // QK_K
    if ty == Q.IQ2_XXS:
        d = np.full((n, 1), 2.0**-11, np.float16).view(np.uint8)
        qs = rng.integers(0, 256, (n, 64), dtype=np.uint8)
        blocks = np.concatenate([d, qs], axis=1)
    elif ty == Q.Q2_K:
        sc = rng.integers(1, 11, (n, 16))
        mn = np.round(1.5 * sc).astype(np.int64)
        scales = (sc | (mn << 4)).astype(np.uint8)
        qs = rng.integers(0, 256, (n, 64), dtype=np.uint8)
        d = np.full((n, 1), 2.0**-8, np.float16).view(np.uint8)
        blocks = np.concatenate([scales, qs, d, d], axis=1)
    elif ty == Q.Q4_K:
        sc = rng.integers(1, 9, (n, 8))
        mn = np.round(7.5 * sc).astype(np.int64)
        packed = np.zeros((n, 12), np.int64)
        for j in range(4):
            packed[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
            packed[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
            packed[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
        d = np.full((n, 1), 2.0**-9, np.float16).view(np.uint8)
        qs = rng.integers(0, 256, (n, 128), dtype=np.uint8)
        blocks = np.concatenate([d, d, packed.astype(np.uint8), qs], axis=1)
    else:
        raise ValueError(ty)
    return blocks.reshape(rows, -1)


def encode(x, ty):
    """`x` f32 → (array for GGUFWriter, raw dtype, gguf-py's dequantization)."""
    if ty == "I32":
        return x.astype(np.int32), None, None
    if ty == Q.F32:
        x = x.astype(np.float32)
        return x, Q.F32, x
    if ty == Q.F16:
        h = x.astype(np.float16)
        return h, Q.F16, h.astype(np.float32)
    if ty == Q.Q8_0:
        x = snap_q8(x)
    q = quantize(x.astype(np.float32), ty)
    back = dequantize(q, ty)
    if ty == Q.Q8_0:
        assert np.array_equal(back, x), "Q8_0 snap was not lossless"
    return q, ty, back


def tiny_checkpoint(cfgd):
    """A random tiny checkpoint in upstream names, from generate.py's machinery."""
    gen = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    config = G.make_config(cfgd)
    model = M.DeepseekV4ForCausalLM(config).eval()
    G.rerandomise(model, gen)
    mtp = G.MtpHead(config)
    G.rerandomise(mtp, gen)
    sd, hf_cfg = G.saved_state(model)
    sd.update(G.mtp_state_dict(mtp, config))
    sd = G.upstream_names(sd)
    return {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}, hf_cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="tiny")
    ap.add_argument("--inter", type=int, default=32, help="moe_intermediate_size (256 for K-quant down)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    recipe = RECIPES[args.recipe]

    cfgd = config_dict(args.inter)
    sd, hf_cfg = tiny_checkpoint(cfgd)
    rng = np.random.default_rng(7)
    L, E, h, inter = cfgd["num_hidden_layers"], cfgd["n_routed_experts"], cfgd["hidden_size"], args.inter
    ratios = [{"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 8}[t]
              for t in cfgd["layer_types"]]

    out = args.out
    (out / "f32").mkdir(parents=True, exist_ok=True)
    ref = {}
    files = {"model": [], "mtp": []}  # (gguf name, array, raw dtype)

    def put(which, gname, upstream, x, ty):
        arr, raw, back = encode(x, ty)
        files[which].append((gname, arr, raw))
        if back is None:
            ref[upstream] = x.astype(np.int64)  # tid2eid as transformers saves it
        else:
            ref[upstream] = back

    used = set()
    # Trunk and MTP block tensors other than the routed experts.
    for name, x in sd.items():
        if ".ffn.experts." in name:
            continue
        if name in TOP_MAP:
            gname, which, mtp = TOP_MAP[name], "model", False
        elif name.startswith("layers."):
            l, rest = name[len("layers."):].split(".", 1)
            gname, which, mtp = f"blk.{l}.{LAYER_MAP[rest]}", "model", False
        elif name.startswith("mtp.0."):
            rest = name[len("mtp.0."):]
            gname = "mtp.0." + (MTP_OWN[rest] if rest in MTP_OWN else LAYER_MAP[rest])
            which, mtp = "mtp", True
        else:
            raise KeyError(name)
        put(which, gname, name, x, gguf_type(gname, mtp))
        used.add(name)

    # Routed experts: one [E, out, in] stack per projection.
    blocks = [(f"layers.{l}", f"blk.{l}", "model", recipe[l]) for l in range(L)]
    blocks.append(("mtp.0", "mtp.0", "mtp", recipe[L]))
    for up, gp, which, (gate_up_ty, down_ty) in blocks:
        for part, gsuffix in EXPERT_PARTS.items():
            names = [f"{up}.ffn.experts.{e}.{part}.weight" for e in range(E)]
            src = np.stack([sd[n] for n in names])
            ty = down_ty if part == "w2" else gate_up_ty
            rows, cols = src.shape[1], src.shape[2]
            if ty in (Q.IQ2_XXS, Q.Q2_K, Q.Q4_K):
                q = random_blocks(ty, E * rows, cols, rng).reshape(E, rows, -1)
                back = dequantize(q, ty)
            else:
                q = quantize(src, ty)
                back = dequantize(q, ty)
            assert back.shape == (E, rows, cols)
            files[which].append((f"{gp}.{gsuffix}", q, ty))
            for e, n in enumerate(names):
                ref[n] = back[e]
                used.add(n)
    assert used == set(sd), set(sd) ^ used

    # GGUF files.
    def write(path, which, meta):
        w = GGUFWriter(str(path), "deepseek4")
        meta(w)
        for gname, arr, raw in files[which]:
            if raw is None:
                w.add_tensor(gname, arr)
            else:
                w.add_tensor(gname, arr, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    p = "deepseek4."

    def trunk_meta(w):
        w.add_name(f"ds4server tiny DeepSeek-V4 ({args.recipe})")
        w.add_uint32(p + "block_count", L)
        w.add_uint64(p + "context_length", cfgd["max_position_embeddings"])
        w.add_uint32(p + "embedding_length", h)
        w.add_uint32(p + "vocab_size", cfgd["vocab_size"])
        w.add_uint32(p + "attention.head_count", cfgd["num_attention_heads"])
        w.add_uint32(p + "attention.head_count_kv", 1)
        w.add_uint32(p + "attention.key_length", cfgd["head_dim"])
        w.add_uint32(p + "attention.value_length", cfgd["head_dim"])
        w.add_uint32(p + "rope.dimension_count", int(cfgd["head_dim"] * cfgd["partial_rotary_factor"]))
        w.add_uint32(p + "attention.q_lora_rank", cfgd["q_lora_rank"])
        w.add_uint32(p + "attention.output_lora_rank", cfgd["o_lora_rank"])
        w.add_uint32(p + "attention.output_group_count", cfgd["o_groups"])
        w.add_uint32(p + "expert_count", E)
        w.add_uint32(p + "expert_used_count", cfgd["num_experts_per_tok"])
        w.add_uint32(p + "expert_feed_forward_length", inter)
        w.add_uint32(p + "expert_shared_count", 1)
        w.add_uint32(p + "hash_layer_count", cfgd["mlp_layer_types"].count("hash_moe"))
        w.add_uint32(p + "expert_group_count", 0)
        w.add_uint32(p + "expert_group_used_count", 0)
        w.add_uint32(p + "attention.sliding_window", cfgd["sliding_window"])
        w.add_uint32(p + "attention.indexer.head_count", cfgd["index_n_heads"])
        w.add_uint32(p + "attention.indexer.key_length", cfgd["index_head_dim"])
        w.add_uint32(p + "attention.indexer.top_k", cfgd["index_topk"])
        w.add_uint32(p + "hyper_connection.count", cfgd["hc_mult"])
        w.add_uint32(p + "hyper_connection.sinkhorn_iterations", cfgd["hc_sinkhorn_iters"])
        w.add_float32(p + "hyper_connection.epsilon", cfgd["hc_eps"])
        w.add_array(p + "attention.compress_ratios", ratios)
        w.add_array(p + "swiglu_clamp_exp", [float(cfgd["swiglu_limit"])] * L)
        rp = cfgd["rope_parameters"]
        w.add_uint64(p + "rope.scaling.original_context_length", rp["original_max_position_embeddings"])
        w.add_float32(p + "rope.freq_base", cfgd["rope_theta"])
        w.add_float32(p + "rope.scaling.factor", rp["factor"])
        w.add_float32(p + "rope.scaling.yarn_beta_fast", rp["beta_fast"])
        w.add_float32(p + "rope.scaling.yarn_beta_slow", rp["beta_slow"])
        w.add_float32(p + "attention.compress_rope_freq_base", cfgd["compress_rope_theta"])
        w.add_float32(p + "expert_weights_scale", cfgd["routed_scaling_factor"])
        w.add_float32(p + "attention.layer_norm_rms_epsilon", cfgd["rms_norm_eps"])
        w.add_bool(p + "expert_weights_norm", True)
        # The vocabulary as ds4 reads it (EOS found by its text).
        tokens = [BOS_TEXT, EOS_TEXT] + [f"w{i}" for i in range(2, cfgd["vocab_size"])]
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)

    def mtp_meta(w):
        w.add_name(f"ds4server tiny DeepSeek-V4 MTP ({args.recipe})")

    write(out / "model.gguf", "model", trunk_meta)
    write(out / "mtp.gguf", "mtp", mtp_meta)

    # The f32 directory: F16 where lossless.
    stored = {}
    for k, v in ref.items():
        if v.dtype == np.float32 and np.array_equal(v.astype(np.float16).astype(np.float32), v):
            stored[k] = np.ascontiguousarray(v.astype(np.float16))
        else:
            stored[k] = np.ascontiguousarray(v)
    save_file(stored, str(out / "f32" / "model.safetensors"), metadata={"format": "pt"})
    (out / "f32" / "model.safetensors").chmod(0o644)
    hf_cfg = dict(hf_cfg)
    hf_cfg.pop("dtype", None)
    (out / "f32" / "config.json").write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")

    kinds = {}
    for k, v in stored.items():
        kinds[str(v.dtype)] = kinds.get(str(v.dtype), 0) + 1
    sizes = {f.name: f.stat().st_size for f in [out / "model.gguf", out / "mtp.gguf", out / "f32" / "model.safetensors"]}
    print(f"{args.recipe}: {len(files['model'])} + {len(files['mtp'])} GGUF tensors; f32 copy dtypes {kinds}; sizes {sizes}")
    print(f"total {sum(sizes.values()) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
