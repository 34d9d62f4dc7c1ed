"""The tiny qwen4_exp *vision-language chat* checkpoint the server tests and
the end-to-end image tests serve (`tests/fixtures/qwen4_exp/chat_vl/`):

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/chat_vl_model.py

`chat_model.py`'s text side (real Qwen3.5/3.6 vocabulary, hidden size 4,
tied bf16 embedding, an MTP head) as a `Qwen4ExpForConditionalGeneration`
with `generate_vl.py`'s vision tower cut to the text width (2 blocks, patch
16, temporal patch 2, a 2x2 merger into 4 values) and the real
`<|vision_start|>` / `<|image_pad|>` / `<|vision_end|>` ids, so the server
loads it with the real tokenizer and chat template and reads images. The
processor's pixel budget is tiny (2..64 merged tokens per image). It emits
random text. Deterministic: rerunning leaves git clean.
"""

import json
import math
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen4ExpConfig
from transformers.models.qwen4_exp import modeling_qwen4_exp as M

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chat_model as C  # noqa: E402
import generate as G  # noqa: E402

OUT = G.ROOT / "tests" / "fixtures" / "qwen4_exp" / "chat_vl"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 248053, 248054, 248056, 248057

# generate_vl.py's processor and tower (repeated here: that script needs
# Pillow, this one only torch), with up to 64 merged tokens per image.
PROCESSOR = dict(
    size={"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 64},
    patch_size=16,
    temporal_patch_size=2,
    merge_size=2,
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
    out_hidden_size=C.CONFIG["hidden_size"],
    num_position_embeddings=36,
)
TEXT = dict(C.CONFIG, model_type="qwen4_exp_text")


def rerandomise_vision(visual, gen):
    """As generate_vl.py: every vision weight gets a scale that matters."""

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
            m.weight.data = normal(m.weight.shape, 1 / math.sqrt(m.weight[0].numel()))
            m.bias.data = normal(m.bias.shape, 0.1)
        elif isinstance(m, nn.Embedding):
            m.weight.data = normal(m.weight.shape, 1.0)


@torch.no_grad()
def main():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = Qwen4ExpConfig(
        text_config=TEXT,
        vision_config=VISION,
        image_token_id=IMAGE_PAD,
        video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=True,
    )
    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = "eager"
    model = M.Qwen4ExpForConditionalGeneration(config).eval()
    G.rerandomise(model.model.language_model, gen)
    rerandomise_vision(model.model.visual, gen)
    model.lm_head.weight = model.model.language_model.embed_tokens.weight
    tcfg = config.text_config
    mtp = G.MtpHead(tcfg).eval()
    mtp.layers[0].mlp.experts.config = tcfg
    G.rerandomise(mtp, gen)
    G.round_bf16(model)
    G.round_bf16(mtp)
    shutil.rmtree(OUT, ignore_errors=True)
    tmp = OUT.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    saved_cfg = json.loads((tmp / "config.json").read_text())
    shutil.rmtree(tmp)
    sd.update(G.mtp_state_dict(mtp))
    # bf16 on disk (the values are bf16-exact): the embedding is most of it.
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}
    sd.pop("lm_head.weight", None)
    OUT.mkdir(parents=True)
    save_file(sd, str(OUT / "model.safetensors"), metadata={"format": "pt"})
    saved_cfg["dtype"] = "bfloat16"
    (OUT / "config.json").write_text(json.dumps(saved_cfg, indent=2, sort_keys=True) + "\n")
    pp = dict(PROCESSOR, image_processor_type="Qwen2VLImageProcessor")
    (OUT / "preprocessor_config.json").write_text(json.dumps(pp, indent=2, sort_keys=True) + "\n")
    (OUT / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [248046, 248044]}, indent=2) + "\n"
    )
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT.relative_to(G.ROOT)}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
