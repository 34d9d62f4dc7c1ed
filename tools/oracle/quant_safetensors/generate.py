"""Stored-type copies of the tiny family checkpoints, and their f32 twins.

    tools/oracle/.venv/bin/python tools/oracle/quant_safetensors/generate.py

Writes, under tests/fixtures/stored/, one directory per family in the form a
release ships (`<family>_<form>`) and one sibling (`<family>_f32`) with the
same config.json whose every weight is the f32 value the stored form
dequantizes to (computed here with torch), under the same names. Loading the
two must give bit-identical logits (crates/engine/tests/stored_safetensors.rs).

* deepseek_v4_fp8_fp4 — from tests/fixtures/deepseek_v4/tiny_a (f32; its
  experts are [32, 64] / [64, 32], whole 32-blocks, so no variant config is
  needed), in DeepSeek-V4-Flash's release layout: upstream names (`embed`,
  `head`, `norm`, `hc_head_*`, `layers.L.…`, `mtp.0.…`); FP8 E4M3 weights
  with an E8M0 `<prefix>.scale` per 128×128 block for the linears the
  reference `inference/model.py` builds in the default (FP8) dtype — attn
  `wq_a`, `wq_b`, `wkv`, `wo_b`, `indexer.wq_b`, `ffn.shared_experts.w1/w2/w3`,
  `mtp.0.e_proj/h_proj`; routed experts `ffn.experts.E.w1/w2/w3` as FP4 E2M1
  pairs in I8 `[out, in/2]` (low nibble = even element) with an E8M0
  `.scale` `[out, in/32]`; BF16 where the release stores bf16 (embed, head,
  `attn.wo_a`, the compressors' `wkv`/`wgate`, `indexer.weights_proj`,
  `ffn.gate.weight`, every RMSNorm weight); F32 where it keeps f32
  (`attn_sink`, `ape`, `hc_*`, `ffn.gate.bias`); `tid2eid` as the tiny
  checkpoint has it (I64). config.json adds the release's
  `quantization_config` (`fmt: e4m3`, `scale_fmt: ue8m0`,
  `weight_block_size: [128, 128]`) and `expert_dtype: "fp4"`.
* glm5_next_fp8 — from tests/fixtures/glm5_next/tiny_a (f32, per-expert,
  NextN layer 6): transformers' fine-grained FP8 form as GLM FP8 releases
  ship it: FP8 E4M3 `<name>.weight` plus an f32 `<name>.weight_scale_inv`
  per 128×128 block (`scale = amax / 448`, not a power of two) for every
  linear of the decoder layers except the router (`mlp.gate`) and the
  indexer's `weights_proj` (DeepSeek-V3.2's FP8 release keeps both in
  bf16); everything else BF16 (embeddings, heads, norms, convolutions, hc_*,
  biases, A_log). config.json adds `quantization_config` (`quant_method:
  fp8`, `fmt: e4m3`, `weight_block_size: [128, 128]`, those exceptions in
  `modules_to_not_convert`).
* qwen4_exp_bf16 — from tests/fixtures/qwen4_exp/tiny_a (f32): every float
  tensor BF16 (rounded to nearest even), integer tensors as they are.

Tiny dims are not multiples of 128: FP8 grids have ⌈out/128⌉ × ⌈in/128⌉
blocks, the edge blocks partial (here every grid is 1×1 except
`indexer.wq_b` [256, 32] with 2×1), which is how the release's `Linear`
sizes them and what the loader accepts.

Quantizers:
* FP8 with E8M0 scales (DeepSeek's ue8m0): per block `s = 2^⌈log2(amax /
  448)⌉` (amax clamped to 1e-4), `q = float8_e4m3fn(w / s)` (torch's cast,
  round to nearest even; w / s is exact and |w / s| ≤ 448).
* FP8 with f32 scales (DeepSeek-V3 / transformers): `s = amax / 448` in f32,
  `q = float8_e4m3fn(w / s)`.
* FP4 E2M1 (MXFP4): per 32 inputs of a row `s = 2^⌈log2(amax / 6)⌉`, each
  `w / s` rounded to the nearest E2M1 value (ties to the even code; torch
  2.15 cannot cast to float4_e2m1fn_x2), packed two per byte.
Dequantization (the f32 twins): `fp8.float() * s` per block, FP4 `E2M1[code]
* 2^(e − 127)`: one f32 product per value, as the engine computes them.

Deterministic: rerunning writes identical bytes.
"""

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "stored"

BLOCK = 128
FP4_BLOCK = 32
E4M3_MAX = 448.0
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def read(path):
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def blocks_of(shape, br, bc):
    return math.ceil(shape[0] / br), math.ceil(shape[1] / bc)


def expand(grid, shape, br, bc):
    """A [gr, gc] grid as one value per element of `shape`."""
    return grid.repeat_interleave(br, 0).repeat_interleave(bc, 1)[: shape[0], : shape[1]]


def block_amax(w, br, bc):
    gr, gc = blocks_of(w.shape, br, bc)
    pad = torch.zeros(gr * br, gc * bc)
    pad[: w.shape[0], : w.shape[1]] = w.abs()
    return pad.view(gr, br, gc, bc).amax(dim=(1, 3))


def pow2_exponent(amax, top):
    """E8M0 byte of the smallest power of two s with amax / s <= top."""
    e = torch.ceil(torch.log2(amax.clamp(min=1e-4) / top)).to(torch.int32)
    # log2 is exact at powers of two; check the bound anyway.
    s = torch.pow(2.0, e.double()).float()
    assert bool((amax / s <= top).all())
    return (e + 127).to(torch.uint8)


def e8m0_values(codes):
    return codes.view(torch.float8_e8m0fnu).float()


def fp8_ue8m0(w):
    """FP8 E4M3 values and their E8M0 block scales; the dequantized f32."""
    codes = pow2_exponent(block_amax(w, BLOCK, BLOCK), E4M3_MAX)
    s = expand(e8m0_values(codes), w.shape, BLOCK, BLOCK)
    q = (w / s).to(torch.float8_e4m3fn)
    deq = q.float() * s
    return q, codes.view(torch.float8_e8m0fnu), deq


def fp8_scale_inv(w):
    """FP8 E4M3 values and f32 `weight_scale_inv` blocks; the dequantized f32."""
    inv = (block_amax(w, BLOCK, BLOCK) / E4M3_MAX).clamp(min=1e-12)
    s = expand(inv, w.shape, BLOCK, BLOCK)
    q = (w / s).to(torch.float8_e4m3fn)
    deq = q.float() * s
    return q, inv.contiguous(), deq


def e2m1_codes(x):
    """Nearest E2M1 code of each value (|x| <= 6), ties to the even code."""
    mag = E2M1[:8]
    d = (x.abs().unsqueeze(-1) - mag).abs()  # [..., 8]
    best = d.min(dim=-1, keepdim=True).values
    tied = d == best
    # Among tied codes prefer the even one (mantissa bit 0); ties only ever
    # join two neighbouring codes, one of them even.
    even = torch.tensor([c % 2 == 0 for c in range(8)])
    pick = torch.where(tied & even, 0, torch.where(tied, 1, 2))
    code = pick.argmin(dim=-1)
    sign = (x < 0) | ((x == 0) & torch.signbit(x))
    return (code + 8 * sign.long()).to(torch.uint8)


def fp4(w):
    """FP4 E2M1 pairs in I8 [out, in/2] and E8M0 scales [out, in/32]."""
    out, inp = w.shape
    assert inp % FP4_BLOCK == 0, f"FP4 needs whole 32-blocks per row, got {inp}"
    g = w.view(out, inp // FP4_BLOCK, FP4_BLOCK)
    codes_e = pow2_exponent(g.abs().amax(dim=-1), 6.0)  # [out, in/32]
    s = e8m0_values(codes_e).unsqueeze(-1)
    c = e2m1_codes(g / s).view(out, inp)
    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8)
    deq = (E2M1[c.long()].view(out, inp // FP4_BLOCK, FP4_BLOCK) * s).view(out, inp)
    return packed.view(torch.int8), codes_e.view(torch.float8_e8m0fnu), deq


def bf16(t):
    b = t.to(torch.bfloat16)
    return b, b.float()


def write(name, tensors, config):
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    tensors = {k: v.contiguous() for k, v in sorted(tensors.items())}
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    size = (d / "model.safetensors").stat().st_size
    kinds = {}
    for v in tensors.values():
        kinds[str(v.dtype).replace("torch.", "")] = kinds.get(str(v.dtype).replace("torch.", ""), 0) + 1
    print(f"{name}: {len(tensors)} tensors, {size / 1e3:.0f} kB, {kinds}")


# ---- deepseek_v4 ----

DS_FP8 = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_b.weight",
          "attn.indexer.wq_b.weight", "e_proj.weight", "h_proj.weight")


def ds_upstream(k):
    if k.startswith("model."):
        k = k[len("model."):]
    return {
        "embed_tokens.weight": "embed.weight",
        "hc_head.hc_fn": "hc_head_fn",
        "hc_head.hc_base": "hc_head_base",
        "hc_head.hc_scale": "hc_head_scale",
    }.get(k, k)


def ds_kind(k):
    if ".ffn.experts." in k:
        return "fp4"
    if ".ffn.shared_experts." in k or k.endswith(DS_FP8):
        return "fp8"
    if k.endswith(("attn_sink", ".ape", ".gate.bias")) or ".hc_" in k or k.startswith("hc_") or "hc_head_" in k:
        return "f32"
    if k.endswith("tid2eid"):
        return "keep"
    return "bf16"


def deepseek_v4():
    src = FIX / "deepseek_v4" / "tiny_a"
    sd = {ds_upstream(k): v for k, v in read(src / "model.safetensors").items()}
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [BLOCK, BLOCK],
    }
    cfg["expert_dtype"] = "fp4"
    cfg["dtype"] = "bfloat16"
    stored, f32 = {}, {}
    for k, v in sd.items():
        kind = ds_kind(k)
        if kind == "fp8":
            q, s, deq = fp8_ue8m0(v)
            stored[k] = q
            stored[k[: -len(".weight")] + ".scale"] = s
            f32[k] = deq
        elif kind == "fp4":
            q, s, deq = fp4(v)
            stored[k] = q
            stored[k[: -len(".weight")] + ".scale"] = s
            f32[k] = deq
        elif kind == "bf16":
            stored[k], f32[k] = bf16(v)
        elif kind == "f32":
            stored[k], f32[k] = v, v
        else:
            stored[k], f32[k] = v, v
    write("deepseek_v4_fp8_fp4", stored, cfg)
    write("deepseek_v4_f32", f32, cfg)


# ---- glm5_next ----

GLM_NOT_CONVERTED = ["lm_head", "embed_tokens", "shared_head.head", "mlp.gate", "indexer.weights_proj"]


def glm_kind(k, v):
    if not v.is_floating_point():
        return "keep"
    linear = (
        ".layers." in k
        and k.endswith(".weight")
        and v.ndim == 2
        and not k.endswith(("mlp.gate.weight", "indexer.weights_proj.weight", "embed_tokens.weight", "shared_head.head.weight"))
        and "norm" not in k.rsplit(".", 2)[-2]
    )
    return "fp8" if linear else "bf16"


def glm5_next():
    src = FIX / "glm5_next" / "tiny_a"
    sd = read(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
        "modules_to_not_convert": GLM_NOT_CONVERTED,
    }
    cfg["dtype"] = "bfloat16"
    stored, f32 = {}, {}
    for k, v in sd.items():
        kind = glm_kind(k, v)
        if kind == "fp8":
            q, s, deq = fp8_scale_inv(v)
            stored[k] = q
            stored[k + "_scale_inv"] = s
            f32[k] = deq
        elif kind == "bf16":
            stored[k], f32[k] = bf16(v)
        else:
            stored[k], f32[k] = v, v
    write("glm5_next_fp8", stored, cfg)
    write("glm5_next_f32", f32, cfg)


# ---- qwen4_exp ----


def qwen4_exp():
    src = FIX / "qwen4_exp" / "tiny_a"
    sd = read(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    stored, f32 = {}, {}
    for k, v in sd.items():
        if v.is_floating_point():
            stored[k], f32[k] = bf16(v)
        else:
            stored[k], f32[k] = v, v
    write("qwen4_exp_bf16", stored, cfg)
    write("qwen4_exp_f32", f32, cfg)


def self_check():
    # E2M1 rounding: every midpoint goes to the even code, values round-trip.
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, -0.0, 6.0, 0.3])
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -4.0, -0.0, 6.0, 0.5]
    got = E2M1[e2m1_codes(x).long()].tolist()
    assert got == want, got
    for c in range(16):
        assert int(e2m1_codes(E2M1[c : c + 1])[0]) == c or (c == 8), c


def main():
    self_check()
    deepseek_v4()
    glm5_next()
    qwen4_exp()
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"tests/fixtures/stored: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
