"""Write a medium random deepseek_v4 checkpoint for speed measurements only
(not committed, no reference outputs):

    tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/bench_model.py /tmp/dsv4_bench

hidden 512, 8 layers in the Flash schedule (2 sliding, then CSA / HCA
alternating, ratio 4 / 128), 8 heads of 128 (rotary 32), window 128, the
indexer 16 heads of 64 keeping 128 entries (so prompts past 512 tokens
prune), 32 experts top-4 (3 hash layers), vocab 8192, f32, with an MTP head.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generate import COMMON, MtpHead, make_config, mtp_state_dict, rerandomise, save_tokenizer  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as M  # noqa: E402

CFG = dict(
    COMMON,
    vocab_size=8192,
    hidden_size=512,
    moe_intermediate_size=256,
    num_hidden_layers=8,
    num_attention_heads=8,
    head_dim=128,
    q_lora_rank=256,
    partial_rotary_factor=0.25,
    num_experts_per_tok=4,
    n_routed_experts=32,
    compress_ratios=[0, 0, 4, 128, 4, 128, 4, 128],
    num_hash_layers=3,
    sliding_window=128,
    o_groups=4,
    o_lora_rank=128,
    index_n_heads=16,
    index_head_dim=64,
    index_topk=128,
    max_position_embeddings=65536,
)


def main():
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    config = make_config(CFG)
    model = M.DeepseekV4ForCausalLM(config).eval()
    rerandomise(model, gen)
    mtp = MtpHead(config).eval()
    rerandomise(mtp, gen)
    model.save_pretrained(out)
    sd = load_file(str(out / "model.safetensors"))
    sd.update({k: v.contiguous() for k, v in mtp_state_dict(mtp, config).items()})
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_tokenizer(out, config.vocab_size)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")


if __name__ == "__main__":
    main()
