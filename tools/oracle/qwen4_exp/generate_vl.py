"""Regenerate the qwen4_exp vision-language fixtures under tests/fixtures/qwen4_exp/vl/.

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/generate_vl.py

(needs Pillow, pinned in tools/oracle/requirements.txt: the processor's PIL
backend decodes and resizes.)

What it writes:

* `images/`: generated images of different sizes, aspect ratios and formats
  (PNG, JPEG, lossless WebP, a two-frame GIF, an RGBA PNG), one tiny image
  that `smart_resize` scales up to `min_pixels` and large ones it scales
  down to `max_pixels`.
* `processor.ref.safetensors`: for every image, transformers'
  `Qwen2VLImageProcessorPil` output (`<img>.pixel_values` [N, 3·2·16·16] f32,
  `<img>.grid_thw` [3]) and the decoded RGB pixels before resizing
  (`<img>.rgb` [H, W, 3] u8, Pillow's decoder) so a decoder difference and a
  resampling difference can be told apart.
* `tiny_vl/`: a tiny `Qwen4ExpForConditionalGeneration` checkpoint (vision
  tower of 2 blocks, patch 16, temporal patch 2, 2x2 merger; the text side is
  `tiny_a`'s shape in three layers: GDN with PLE, GDN, QSA that prunes;
  4 experts top-2) with `mtp.*`
  weights, a `preprocessor_config.json` and the word-level tokenizer.
* `tiny_vl.ref.safetensors`, per prompt `p{k}`:
  `input_ids` (placeholders expanded), `images` (indices into IMAGES),
  `vision_features` [n_img_tokens, H] (the merger output, rows in prompt
  order), `position_ids` [3, T] and `rope_delta` [1] (`get_rope_index`),
  `logits_full` [T, V] (the conditional-generation forward from pixels),
  `logits_chunked` with `chunks` (chunk sizes; every chunking cuts through
  an image), `logits_steps` (a prefill of `steps_prefill` rows, then one row
  per call through the rest, images included), `decode_ids` and
  `logits_decode` (three tokens after the prompt through transformers'
  generation path: positions = cache length + rope delta),
  `layer{L}_qsa_selected` [T, T] (QSA selection with the images present,
  ∧ causal; the script asserts it prunes).

Chunked and stepped references call the language model with transformers'
own 3-row positions from `get_rope_index` sliced per chunk (transformers'
cached path would otherwise give image rows of a later chunk plain text
positions — the #108 defect); the full forward is the unmodified model.
"""

import io
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen4ExpConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen4_exp import modeling_qwen4_exp as M

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as G  # noqa: E402  (the text fixtures' shared pieces)

ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "qwen4_exp" / "vl"

PROMPT_SEED = int(sys.argv[1]) if len(sys.argv) > 1 else 1
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 124, 125, 126, 127

PROCESSOR = dict(
    # 32x32 pixels per merged token; 2..8 merged tokens per image keep the
    # fixtures small while every image still has a grid of several blocks.
    size={"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 8},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
    # CLIP's statistics: normalisation with non-trivial constants.
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)

VISION = dict(
    model_type="qwen4_exp_vision",
    depth=2,
    hidden_size=16,
    hidden_act="gelu_pytorch_tanh",
    intermediate_size=40,
    num_heads=2,
    in_channels=3,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=32,
    num_position_embeddings=36,  # a 6x6 learned grid, resampled to every image
)

# tiny_a's shape cut to three layers (GDN with PLE, GDN, QSA): the fixtures
# stay under 2 MB.
TEXT = dict(
    G.CONFIGS["tiny_a"],
    num_hidden_layers=3,
    layer_types=["linear_attention", "linear_attention", "indexed_attention"],
    model_type="qwen4_exp_text",
)


def pattern(w, h, seed):
    """A deterministic image with edges, gradients and noise (resampling
    differences show up on all three)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1)).astype(np.int64)
    g = (y * 255 // max(h - 1, 1)).astype(np.int64)
    b = (((x // 5) + (y // 7)) % 2) * 200
    img = np.stack([r, g, b], -1) + rng.integers(-30, 31, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(arr, fmt, **kw):
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


def make_images():
    """name -> file bytes."""
    imgs = {}
    imgs["tiny.png"] = encode(pattern(20, 13, 1), "PNG")  # scaled up to min_pixels
    imgs["exact.png"] = encode(pattern(96, 64, 2), "PNG")  # already on the grid: no resampling
    imgs["wide.jpg"] = encode(pattern(300, 120, 3), "JPEG", quality=90)  # scaled down
    imgs["tall.png"] = encode(pattern(45, 170, 4), "PNG")  # tall, scaled down
    imgs["lossless.webp"] = encode(pattern(70, 50, 5), "WEBP", lossless=True)
    # Two frames: the processor takes the first.
    f0 = Image.fromarray(pattern(60, 40, 6)).convert("P", palette=Image.Palette.ADAPTIVE)
    f1 = Image.fromarray(pattern(60, 40, 7)).convert("P", palette=Image.Palette.ADAPTIVE)
    buf = io.BytesIO()
    f0.save(buf, format="GIF", save_all=True, append_images=[f1], duration=100)
    imgs["anim.gif"] = buf.getvalue()
    # RGBA: transformers composites transparency onto white.
    rgba = np.concatenate([pattern(64, 48, 8), np.tile(np.arange(64, dtype=np.uint8)[None, :, None] * 4, (48, 1, 1))], -1)
    imgs["alpha.png"] = encode(rgba, "PNG")
    return imgs


def processor():
    return Qwen2VLImageProcessorPil(**PROCESSOR)


def decoded_rgb(data):
    """What the processor sees: Pillow's decode, first frame, RGB (alpha
    composited on white), as transformers' `convert_to_rgb` does."""
    from transformers.image_transforms import convert_to_rgb

    return convert_to_rgb(Image.open(io.BytesIO(data)), return_numpy=True)


def rerandomise_vision(visual, gen):
    def normal(shape, scale):
        return torch.randn(shape, generator=gen) * scale

    for m in visual.modules():
        if isinstance(m, nn.LayerNorm):
            m.weight.data = 1 + (torch.rand(m.weight.shape, generator=gen) * 2 - 1) * 0.1
            m.bias.data = normal(m.bias.shape, 0.1)
        elif isinstance(m, nn.Linear):
            m.weight.data = normal(m.weight.shape, 1 / math.sqrt(m.weight.shape[1]))
            m.bias.data = normal(m.bias.shape, 0.1)
        elif isinstance(m, nn.Conv3d):
            fan_in = m.weight[0].numel()
            m.weight.data = normal(m.weight.shape, 1 / math.sqrt(fan_in))
            m.bias.data = normal(m.bias.shape, 0.1)
        elif isinstance(m, nn.Embedding):
            m.weight.data = normal(m.weight.shape, 1.0)


def text_ids(gen, n):
    return torch.randint(3, VISION_START, (n,), generator=gen).tolist()


# Each prompt: a list of ("text", n) / ("image", name); an EOS inside a text
# run crosses a PLE segment.
PROMPTS = [
    [("text", 6), ("image", "exact.png"), ("text", 7)],
    [("text", 4), ("image", "wide.jpg"), ("text", 3), ("image", "tall.png"), ("text", 6)],
    [("image", "tiny.png"), ("text", 2), ("image", "anim.gif"), ("image", "lossless.webp"), ("text", 5)],
]
IMAGES = ["tiny.png", "exact.png", "wide.jpg", "tall.png", "lossless.webp", "anim.gif", "alpha.png"]


def build_prompt(spec, gen, grids, merge):
    ids, types, images = [], [], []
    eos_at = None
    for kind, v in spec:
        if kind == "text":
            t = text_ids(gen, v)
            if eos_at is None:
                eos_at = len(ids) + 1
            ids += t
            types += [0] * len(t)
        else:
            n = int(grids[v].prod()) // (merge * merge)
            block = [VISION_START] + [IMAGE_PAD] * n + [VISION_END]
            ids += block
            types += [0] + [1] * n + [0]
            images.append(v)
    # An EOS in the first text run: PLE segments cross it.
    ids[eos_at] = G.EOS
    return ids, types, images


@torch.no_grad()
def main():
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "images").mkdir(parents=True)
    imgs = make_images()
    proc = processor()
    pref = {}
    pixel, grids = {}, {}
    for name in IMAGES:
        data = imgs[name]
        (OUT / "images" / name).write_bytes(data)
        out = proc(images=[Image.open(io.BytesIO(data))], return_tensors="pt")
        pixel[name] = out["pixel_values"].float()
        grids[name] = out["image_grid_thw"][0].long()
        pref[f"{name}.pixel_values"] = pixel[name]
        pref[f"{name}.grid_thw"] = grids[name]
        pref[f"{name}.rgb"] = torch.from_numpy(np.ascontiguousarray(decoded_rgb(data)))
        print(f"{name}: {Image.open(io.BytesIO(data)).size} -> grid {grids[name].tolist()}")
    save_file({k: v.contiguous() for k, v in pref.items()}, str(OUT / "processor.ref.safetensors"))

    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = Qwen4ExpConfig(
        text_config=TEXT,
        vision_config=VISION,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    model = M.Qwen4ExpForConditionalGeneration(config).eval()
    G.rerandomise(model.model.language_model, gen)
    G.rerandomise(model.lm_head, gen)
    rerandomise_vision(model.model.visual, gen)
    tcfg = config.text_config
    mtp = G.MtpHead(tcfg).eval()
    mtp.layers[0].mlp.experts.config = tcfg
    G.rerandomise(mtp, gen)
    merge = VISION["spatial_merge_size"]
    lm = model.model.language_model
    attn_layers = [i for i, t in enumerate(tcfg.layer_types) if t == "indexed_attention"]

    ref = {}
    # Prompts and decode tokens have their own stream: PROMPT_SEED is the
    # first seed whose indexer top-k decisions all have a clear gap.
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    probe = G.TopkProbe().__enter__()
    for k, spec in enumerate(PROMPTS):
        ids, types, images = build_prompt(spec, gen, grids, merge)
        T = len(ids)
        input_ids = torch.tensor([ids])
        mm = torch.tensor([types], dtype=torch.int32)
        pv = torch.cat([pixel[n] for n in images])
        thw = torch.stack([grids[n] for n in images])
        p = f"p{k}."
        ref[p + "input_ids"] = input_ids[0]
        ref[p + "images"] = torch.tensor([IMAGES.index(n) for n in images])

        feats = model.model.get_image_features(pv, thw, return_dict=True).pooler_output
        ref[p + "vision_features"] = torch.cat(feats)
        pos, delta = model.model.get_rope_index(input_ids, mm, image_grid_thw=thw)
        ref[p + "position_ids"] = pos[:, 0]
        ref[p + "rope_delta"] = delta[0]

        sel = {}
        hooks = [
            lm.layers[i].self_attn.indexer.register_forward_hook(lambda m, a, o, i=i: sel.__setitem__(i, o[0, 0]))
            for i in attn_layers
        ]
        out = model(input_ids=input_ids, pixel_values=pv, image_grid_thw=thw, mm_token_type_ids=mm, use_cache=True)
        for h in hooks:
            h.remove()
        ref[p + "logits_full"] = out.logits[0]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        for i in attn_layers:
            s = sel[i] & causal
            pruned = int((causal & ~s).sum())
            assert pruned > 0, f"p{k}: QSA layer {i} prunes nothing"
            ref[p + f"layer{i}_qsa_selected"] = s.long()
            print(f"p{k}: T={T} layer {i} pruned {pruned} of {int(causal.sum())} causal pairs")

        # Decode after the prompt through transformers' own cached path
        # (positions = cache length + rope delta).
        dec = text_ids(gen, 3)
        cache = out.cache
        rows = []
        for t in dec:
            o = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
            cache = o.cache
            rows.append(o.logits[0, -1])
        ref[p + "decode_ids"] = torch.tensor(dec)
        ref[p + "logits_decode"] = torch.stack(rows)

        # Chunked / stepped: the language model over the merged embeddings
        # with get_rope_index's positions sliced per chunk.
        embeds = model.model.get_input_embeddings()(input_ids)
        mask = (input_ids == IMAGE_PAD)[..., None]
        embeds = embeds.masked_scatter(mask, torch.cat(feats))

        def run(chunks):
            cache = None
            rows = []
            s = 0
            for n in chunks:
                o = lm(
                    inputs_embeds=embeds[:, s : s + n],
                    position_ids=pos[:, :, s : s + n],
                    ple_input_ids=input_ids[:, s : s + n],
                    cache=cache,
                    use_cache=True,
                )
                cache = o.cache
                rows.append(model.lm_head(o.last_hidden_state)[0])
                s += n
            assert s == T
            return torch.cat(rows)

        first_image = ids.index(IMAGE_PAD)
        # Boundaries inside the first image (one and three rows in), and a
        # last chunk of the rest.
        c0 = first_image + 1
        chunks = [c0, 3, T - c0 - 3]
        ref[p + "chunks"] = torch.tensor(chunks)
        ref[p + "logits_chunked"] = run(chunks)
        steps_prefill = first_image + 2
        ref[p + "steps_prefill"] = torch.tensor([steps_prefill])
        ref[p + "logits_steps"] = run([steps_prefill] + [1] * (T - steps_prefill))
        full_diff = (ref[p + "logits_chunked"] - out.logits[0]).abs().max().item()
        print(f"p{k}: chunked vs full {full_diff:.3g}; images {images}; delta {int(delta)}")
    probe.__exit__()
    assert probe.gaps, "indexer never pruned"
    min_gap = min(probe.gaps)
    assert min_gap > 1e-3, f"indexer top-k boundary tie (gap {min_gap})"
    print(f"{len(probe.gaps)} pruning top-k calls, min boundary gap {min_gap:.4g}")
    save_file({k: v.contiguous() for k, v in ref.items()}, str(OUT / "tiny_vl.ref.safetensors"))
    save_vl_checkpoint(model, mtp, config, OUT / "tiny_vl")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"fixtures: {total / 1e6:.2f} MB")


def save_vl_checkpoint(model, mtp, config, out_dir):
    tmp = out_dir.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    saved_cfg = json.loads((tmp / "config.json").read_text())
    shutil.rmtree(tmp)
    sd.update(G.mtp_state_dict(mtp))
    sd = {k: v.contiguous() for k, v in sd.items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(saved_cfg, indent=2, sort_keys=True) + "\n")
    pp = dict(PROCESSOR, image_processor_type="Qwen2VLImageProcessor")
    (out_dir / "preprocessor_config.json").write_text(json.dumps(pp, indent=2, sort_keys=True) + "\n")
    G.save_tokenizer(out_dir, config.text_config.vocab_size)


if __name__ == "__main__":
    main()
