"""Write a medium random glm5_next checkpoint for speed measurements only
(not committed, no reference outputs):

    tools/oracle/.venv/bin/python tools/oracle/glm5_next/bench_model.py /tmp/glm5_bench

hidden 512, 8 layers (3 KDA : 1 MLA, the second MLA layer a shared-indexer
one), 16 experts top-4 in 4 groups, pools of 16 with index_topk 256 (so
prompts past 271 tokens prune), vocab 4096, a NextN layer. ~40 M
parameters, f32.
"""

import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))
import generate as G  # noqa: E402

TEXT = dict(
    G.TEXT,
    vocab_size=4096,
    hidden_size=512,
    intermediate_size=1024,
    moe_intermediate_size=128,
    num_attention_heads=8,
    num_key_value_heads=8,
    kv_lora_rank=128,
    q_lora_rank=256,
    v_head_dim=64,
    qk_nope_head_dim=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_group=4,
    topk_group=2,
    index_head_dim=64,
    index_n_heads=16,
    index_topk=256,
    index_kpool=16,
    linear_head_dim=64,
    linear_num_heads=8,
    max_position_embeddings=4096,
    num_hidden_layers=8,
    layer_types=(["linear_attention"] * 3 + ["indexed_attention"]) * 2,
    mlp_layer_types=["dense"] + ["sparse"] * 7,
    indexer_types=["full"] * 8,
    linear_lower_bound=-5.0,
)


def main(out_dir):
    out_dir = Path(out_dir)
    torch.manual_seed(0)
    config = G.make_config(TEXT)
    model = G.Glm5NextForConditionalGeneration(config).eval()
    gen = torch.Generator().manual_seed(1)
    G.rerandomise(model, gen, False)
    mtp = G.NextN(model.config.text_config).eval()
    G.rerandomise(mtp, gen, False)
    tmp = out_dir.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    cfg = json.loads((tmp / "config.json").read_text())
    shutil.rmtree(tmp)
    sd = {k: v for k, v in sd.items() if not k.startswith("model.visual.")}
    sd.update(G.mtp_state_dict(mtp, f"model.language_model.layers.{TEXT['num_hidden_layers']}.", fused=True))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    G.save_tokenizer(out_dir, TEXT["vocab_size"])
    n = sum(v.numel() for v in sd.values())
    print(f"{out_dir}: {n / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main(sys.argv[1])
