"""Input for antirez/ds4's own quantizer (`gguf-tools/deepseek4-quantize`),
and the f32 twin of what it writes.

    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/ds4_quantizer_input.py input --out /tmp/ds4q_in
    (run ds4's quantizer: tests/fixtures/deepseek_v4/ds4_quantizer/README.md)
    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/ds4_quantizer_input.py twin \
        --gguf tests/fixtures/deepseek_v4/ds4_quantizer/q2.gguf \
        --config /tmp/ds4q_in/twin_config.json --json tests/fixtures/deepseek_v4/ds4_quantizer/q2.twin.json

This script never builds or runs ds4's code; the README says how that was
done.

`input` writes (not committed, deterministic):

* `model.safetensors` + `model.safetensors.index.json` + `config.json`: a
  tiny random DeepSeek-V4 checkpoint (this directory's `generate.py`
  machinery) in the release form ds4's quantizer reads: upstream names
  (`attn.kv_norm.weight` for the KV norm, as in DeepSeek's files), FP8 E4M3
  + E8M0 `.scale` per 128×128 block for the attention projections,
  `indexer.wq_b`, shared experts and MTP e/h projections, routed experts as
  FP4 E2M1 pairs in I8 + E8M0 `.scale` per 32 inputs, F32 `hc_*`, `ape`,
  `attn_sink` and router bias, I64 `tid2eid`, BF16 the rest
  (`tools/oracle/quant_safetensors/generate.py`'s DeepSeek writer). Every
  FP8 tensor has both dims multiples of 128 and every routed row 256 inputs
  (ds4's checks: "FP8 dims are not divisible by 128", K-quant and IQ2_XXS
  blocks of 256). The MTP block (`mtp.0.*`) is included as the release
  ships it, though ds4's quantizer at 8d57664 maps no `mtp.*` name.
* `template-q2.gguf`, `template-q4.gguf`: the template GGUF ds4's quantizer
  requires (`--template`: "metadata, tokenizer, tensor order, and logical
  shapes"; its tensor bytes are never read): ds4's tensor names and order,
  `deepseek4.*` metadata as `write_ds4_gguf.py` writes it, ds4's types per
  group, zero data.
* `twin_config.json`: the same configuration in transformers' form.

`twin` dequantizes every tensor of a GGUF ds4 wrote with gguf-py 0.19
(`gguf.quants.dequantize`) and writes `--json`: per GGUF tensor, the
upstream names our `deepseek_v4` family binds from a Hugging Face directory
(routed stacks split per expert), dims, type and the SHA-256 of gguf-py's
values (little-endian F32; I32 `tid2eid` as I64), plus the twin's config.
`crates/engine/tests/deepseek_v4_ds4_quantizer.rs` rebuilds the twin from
it (6.6 MB of f32 is not committed). `--out DIR` also writes the twin as a
safetensors directory (F16 where lossless, else F32).
"""

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize, quant_shape_to_byte_shape
from safetensors.numpy import save_file as save_np
from safetensors.torch import save_file as save_pt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate as G  # noqa: E402
import write_ds4_gguf as W  # noqa: E402

# The release-form writer (FP8 / FP4 / BF16) of ../quant_safetensors.
_spec = importlib.util.spec_from_file_location("quant_safetensors_generate", HERE.parent / "quant_safetensors" / "generate.py")
QS = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(QS)

ROUTED = {
    # ds4's q2 recipe: gate/up IQ2_XXS, down Q2_K; q4: Q4_K everywhere.
    "q2": (Q.IQ2_XXS, Q.Q2_K),
    "q4": (Q.Q4_K, Q.Q4_K),
}


def config_dict(experts, used):
    return dict(
        G.COMMON,
        vocab_size=48,
        hidden_size=256,
        moe_intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=128,
        q_lora_rank=128,
        partial_rotary_factor=0.25,
        num_experts_per_tok=used,
        n_routed_experts=experts,
        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
        # ds4: CSA is ratio 4, HCA 128; 8 here so 48 tokens make 6 entries.
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        mlp_layer_types=["hash_moe", "moe"],
        sliding_window=8,
        o_groups=2,
        o_lora_rank=64,
        index_n_heads=2,
        index_head_dim=64,
        index_topk=4,
        max_position_embeddings=1 << 20,
        hc_mult=2,
    )


def release_name(k):
    """Our upstream name → DeepSeek's (ds4's `layer_map` reads `attn.kv_norm`)."""
    if k.endswith(".attn.norm.weight"):
        return k[: -len("attn.norm.weight")] + "attn.kv_norm.weight"
    return k


def gguf_name(k):
    if k in W.TOP_MAP:
        return W.TOP_MAP[k]
    assert k.startswith("layers."), k
    layer, rest = k[len("layers.") :].split(".", 1)
    return f"blk.{layer}.{W.LAYER_MAP[rest]}"


def write_template(path, cfgd, sd, recipe):
    """ds4's trunk layout with zero tensor data (the quantizer reads only the
    metadata, names, order, types and shapes)."""
    L, E, h = cfgd["num_hidden_layers"], cfgd["n_routed_experts"], cfgd["hidden_size"]
    gate_up, down = ROUTED[recipe]
    tensors = []  # (gguf name, numpy shape row-major, type)
    for name, x in sd.items():
        if ".ffn.experts." in name or name.startswith("mtp."):
            continue
        g = gguf_name(name)
        # ds4.c `weights_validate_layout` wants F16 here; write_ds4_gguf.py's
        # `gguf_type` matches it as a Q8_0 `attn_q_b` by its suffix.
        ty = Q.F16 if g.endswith(".indexer.attn_q_b.weight") else W.gguf_type(g, False)
        tensors.append((g, tuple(x.shape), ty))
    for layer in range(L):
        for part, suffix in W.EXPERT_PARTS.items():
            rows, cols = sd[f"layers.{layer}.ffn.experts.0.{part}.weight"].shape
            tensors.append((f"blk.{layer}.{suffix}", (E, rows, cols), down if part == "w2" else gate_up))

    w = GGUFWriter(str(path), "deepseek4")
    p = "deepseek4."
    w.add_name(f"ds4server tiny DeepSeek-V4 template ({recipe})")
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
    w.add_uint32(p + "expert_feed_forward_length", cfgd["moe_intermediate_size"])
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
    ratios = [cfgd["compress_rates"].get(t, 0) for t in cfgd["layer_types"]]
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
    tokens = [W.BOS_TEXT, W.EOS_TEXT] + [f"w{i}" for i in range(2, cfgd["vocab_size"])]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    for g, shape, ty in tensors:
        if ty == "I32":
            w.add_tensor(g, np.zeros(shape, np.int32))
        elif ty == Q.F32:
            w.add_tensor(g, np.zeros(shape, np.float32))
        elif ty == Q.F16:
            w.add_tensor(g, np.zeros(shape, np.float16))
        else:
            w.add_tensor(g, np.zeros(quant_shape_to_byte_shape(shape, ty), np.uint8), raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cmd_input(args):
    cfgd = config_dict(args.experts, args.used)
    sd_np, hf_cfg = W.tiny_checkpoint(cfgd)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd_np.items()}
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    stored = {}
    for k, v in sd.items():
        kind = QS.ds_kind(k)
        rk = release_name(k)
        if kind in ("fp8", "fp4"):
            assert v.shape[1] % (256 if kind == "fp4" else 128) == 0, (k, v.shape)
            if kind == "fp8":
                assert v.shape[0] % 128 == 0, (k, v.shape)
            q, s, _ = QS.fp8_ue8m0(v) if kind == "fp8" else QS.fp4(v)
            stored[rk] = q
            stored[rk[: -len(".weight")] + ".scale"] = s
        elif kind == "bf16":
            stored[rk] = v.to(torch.bfloat16)
        else:  # f32, or tid2eid (I64)
            stored[rk] = v
    stored = {k: v.contiguous() for k, v in sorted(stored.items())}
    save_pt(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {"total_size": (out / "model.safetensors").stat().st_size},
             "weight_map": {k: "model.safetensors" for k in stored}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    rel_cfg = dict(hf_cfg)
    rel_cfg.pop("dtype", None)
    twin_cfg = dict(rel_cfg)
    rel_cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    }
    rel_cfg["expert_dtype"] = "fp4"
    rel_cfg["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(rel_cfg, indent=2, sort_keys=True) + "\n")
    (out / "twin_config.json").write_text(json.dumps(twin_cfg, indent=2, sort_keys=True) + "\n")

    for recipe in ROUTED:
        write_template(out / f"template-{recipe}.gguf", cfgd, sd_np, recipe)
    kinds = {}
    for v in stored.values():
        kinds[str(v.dtype)] = kinds.get(str(v.dtype), 0) + 1
    print(f"input: {len(stored)} tensors {kinds}, {(out / 'model.safetensors').stat().st_size / 1e6:.2f} MB -> {out}")


def upstream_of(gname):
    inv_top = {v: k for k, v in W.TOP_MAP.items()}
    if gname in inv_top:
        return inv_top[gname]
    layer, rest = gname[len("blk.") :].split(".", 1)
    inv_layer = {v: k for k, v in W.LAYER_MAP.items()}
    return f"layers.{layer}.{inv_layer[rest]}"


def cmd_twin(args):
    r = GGUFReader(str(args.gguf))
    stack = {v: k for k, v in W.EXPERT_PARTS.items()}
    ref = {}
    entries = []
    types = {}
    for t in r.tensors:
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # row-major
        ty = Q(t.tensor_type)
        types[ty.name] = types.get(ty.name, 0) + 1
        if ty == Q.I32:
            back = np.asarray(t.data).reshape(shape).astype(np.int64)  # as transformers saves it
        else:
            back = dequantize(np.asarray(t.data), ty).reshape(shape).astype(np.float32)
        rest = t.name.split(".", 2)[2] if t.name.startswith("blk.") else None
        if rest in stack:
            layer = t.name.split(".")[1]
            names = [f"layers.{layer}.ffn.experts.{e}.{stack[rest]}.weight" for e in range(shape[0])]
            for e, n in enumerate(names):
                ref[n] = back[e]
        else:
            names = [upstream_of(t.name)]
            ref[names[0]] = back
        entries.append({
            "gguf": t.name,
            "type": ty.name,
            "dims": list(shape),
            "upstream": names,
            "dtype": "I64" if back.dtype == np.int64 else "F32",
            "sha256": hashlib.sha256(np.ascontiguousarray(back).astype("<" + back.dtype.str[1:]).tobytes()).hexdigest(),
        })
    config = json.loads(args.config.read_text())
    manifest = {
        "what": f"gguf-py {importlib.metadata.version('gguf')} dequantization of {args.gguf.name}: per GGUF tensor, "
                "the upstream names it splits into (one per routed expert for a stack) and the SHA-256 of its "
                "row-major values (little-endian F32; tid2eid as I64); config: the twin's config.json",
        "config": config,
        "tensors": entries,
    }
    args.json.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"twin of {args.gguf.name}: GGUF types {types}; {len(entries)} tensors -> {args.json}")
    if args.out is None:
        return
    stored = {}
    for k, v in sorted(ref.items()):
        if v.dtype == np.float32 and np.array_equal(v.astype(np.float16).astype(np.float32), v):
            stored[k] = np.ascontiguousarray(v.astype(np.float16))
        else:
            stored[k] = np.ascontiguousarray(v)
    out = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_np(stored, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    shutil.copyfile(args.config, out / "config.json")
    print(f"  and the directory: {(out / 'model.safetensors').stat().st_size / 1e6:.2f} MB -> {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("input")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--experts", type=int, default=2)
    a.add_argument("--used", type=int, default=1)
    b = sub.add_parser("twin")
    b.add_argument("--gguf", type=Path, required=True)
    b.add_argument("--config", type=Path, required=True)
    b.add_argument("--json", type=Path, required=True, help="the manifest the Rust test checks and builds the twin from")
    b.add_argument("--out", type=Path, help="also write the twin as a safetensors directory (not committed)")
    args = ap.parse_args()
    {"input": cmd_input, "twin": cmd_twin}[args.cmd](args)


if __name__ == "__main__":
    main()
