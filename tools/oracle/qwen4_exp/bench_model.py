"""Write a medium random qwen4_exp checkpoint for speed measurements only
(not committed, no reference outputs):

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/bench_model.py /tmp/qwen4_bench

hidden 512, 8 layers (3 GDN : 1 QSA), 16 experts top-4, PLE on layer 2,
QSA budget 256 / ratio 4 (so prompts past 260 tokens prune), vocab 4096.
~35 M parameters, f32.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from generate import BASE, make_config, rerandomise, save_tokenizer  # noqa: E402
from transformers.models.qwen4_exp import modeling_qwen4_exp as M  # noqa: E402

CFG = dict(
    BASE,
    vocab_size=4096,
    hidden_size=512,
    num_hidden_layers=8,
    layer_types=(["linear_attention"] * 3 + ["indexed_attention"]) * 2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=256,
    hc_lowrank=32,
    indexer_n_heads=4,
    indexer_head_dim=64,
    indexer_budget=256,
    indexer_compress_ratio=4,
    ple_layer_ids=[2],
    ple_embed_dim=512,
    heads_per_ngram=8,
    ngram_vocab_size_base=2000,
    split_ngram_parts=1,
    output_gate_type="sigmoid",
    tie_word_embeddings=False,
    max_position_embeddings=8192,
    rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25, mrope_section=[3, 3, 2]),
)


def main():
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    config = make_config(CFG)
    model = M.Qwen4ExpForCausalLM(config).eval()
    rerandomise(model, torch.Generator().manual_seed(0))
    model.save_pretrained(out)
    save_tokenizer(out, config.vocab_size)
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")


if __name__ == "__main__":
    main()
