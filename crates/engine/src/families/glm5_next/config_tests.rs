//! Config parsing: the three layouts, the default schedules, the legacy
//! names and every refusal (each naming its field).

use std::path::Path;

use serde_json::{Value as Json, json};

use super::config::{Glm5NextConfig, IndexerKind, LayerKind, MlpKind};
use crate::error::EngineError;

/// The digest's tiny text config (Part C), flat.
fn base() -> Json {
    json!({"model_type":"glm5_next_text","vocab_size":512,"hidden_size":64,"intermediate_size":128,
        "moe_intermediate_size":32,"num_hidden_layers":6,"num_attention_heads":4,"num_key_value_heads":4,
        "n_shared_experts":1,"n_routed_experts":8,"routed_scaling_factor":2.5,"kv_lora_rank":32,
        "q_lora_rank":32,"qk_rope_head_dim":0,"v_head_dim":16,"qk_nope_head_dim":16,"n_group":2,
        "topk_group":1,"num_experts_per_tok":2,"norm_topk_prob":true,"pad_token_id":0,"eos_token_id":1,
        "mlp_layer_types":["dense","dense","sparse","sparse","sparse","sparse"],
        "layer_types":["linear_attention","indexed_attention","indexed_attention","linear_attention",
            "linear_attention","indexed_attention"],
        "indexer_types":["full","full","shared","full","full","full"],"index_topk":32,
        "index_head_dim":16,"index_n_heads":16,"index_kpool":4,"linear_head_dim":16,"linear_num_heads":4,
        "linear_conv_kernel_dim":4,"linear_lower_bound":-5.0,"hc_mult":4})
}

fn parse(j: &Json) -> Glm5NextConfig {
    Glm5NextConfig::from_hf(Path::new("c.json"), j).unwrap()
}

fn field_of(j: &Json) -> String {
    match Glm5NextConfig::from_hf(Path::new("c.json"), j) {
        Err(EngineError::Config { field, .. }) => field,
        other => panic!("expected a config error, got {other:?}"),
    }
}

#[test]
fn glm5_tiny_config_parses_in_every_layout() {
    let c = parse(&base());
    use LayerKind::*;
    assert_eq!(c.layer_kinds, vec![Kda, Mla, Mla, Kda, Kda, Mla]);
    assert_eq!(c.indexer_kinds[2], IndexerKind::Shared);
    assert!(c.forwards_selection(1) && !c.forwards_selection(0) && !c.forwards_selection(5));
    assert_eq!((c.pool_topk(), c.qk_head_dim()), (8, 16));
    assert_eq!(c.linear_lower_bound, Some(-5.0));
    assert_eq!(c.eos_token_id, Some(1));
    // The wrapper: the same fields under text_config, tie from the top.
    let wrapped = json!({"model_type":"glm5_next","text_config":base(),"tie_word_embeddings":true});
    let w = parse(&wrapped);
    assert!(w.tie_word_embeddings);
    assert_eq!(w.layer_kinds, c.layer_kinds);
    // The flat form of the wrapper's model_type.
    let mut flat = base();
    flat["model_type"] = json!("glm5_next");
    assert_eq!(parse(&flat), c);
}

#[test]
fn glm5_default_schedules_and_legacy_names() {
    let mut j = base();
    for k in ["layer_types", "mlp_layer_types", "indexer_types"] {
        j.as_object_mut().unwrap().remove(k);
    }
    j["num_hidden_layers"] = json!(8);
    let c = parse(&j);
    use LayerKind::*;
    assert_eq!(c.layer_kinds, vec![Kda, Kda, Kda, Mla, Kda, Kda, Kda, Mla]);
    assert_eq!(
        c.mlp_kinds[..4],
        [
            MlpKind::Dense,
            MlpKind::Dense,
            MlpKind::Dense,
            MlpKind::Sparse
        ]
    );
    assert!(c.indexer_kinds.iter().all(|k| *k == IndexerKind::Full));
    // freq 2, offset 2: layer i is full when max(i − 1, 0) is even.
    j["index_topk_freq"] = json!(2);
    j["layer_types"] = json!([
        "mamba",
        "attention",
        "full_attention",
        "deepseek_sparse_attention",
        "indexed_attention",
        "indexed_attention",
        "indexed_attention",
        "linear_attention"
    ]);
    let c = parse(&j);
    assert_eq!(c.layer_kinds, vec![Kda, Mla, Mla, Mla, Mla, Mla, Mla, Kda]);
    let full: Vec<bool> = c
        .indexer_kinds
        .iter()
        .map(|k| *k == IndexerKind::Full)
        .collect();
    assert_eq!(
        full,
        vec![true, true, false, true, false, true, false, true]
    );
    // A pattern string wins over the schedule (longer than the layers is legal).
    j["index_topk_pattern"] = json!("FFSFFFFSFF");
    let c = parse(&j);
    assert_eq!(c.indexer_kinds[2], IndexerKind::Shared);
    assert_eq!(c.indexer_kinds[7], IndexerKind::Shared);
    // linear_attn_config overrides; safe_gate restores the bound.
    let mut j = base();
    j["linear_lower_bound"] = Json::Null;
    assert_eq!(parse(&j).linear_lower_bound, None);
    j["linear_attn_config"] = json!({"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 3});
    let c = parse(&j);
    assert_eq!(
        (c.linear_head_dim, c.linear_num_heads, c.linear_conv_kernel),
        (8, 2, 3)
    );
    assert_eq!(c.linear_lower_bound, Some(-5.0));
    j["linear_attn_config"]["safe_gate"] = json!(false);
    assert_eq!(parse(&j).linear_lower_bound, None);
}

#[test]
fn glm5_validation_names_fields() {
    let cases: Vec<(&str, Json, &str)> = vec![
        ("num_key_value_heads", json!(2), "num_key_value_heads"),
        ("index_kpool", json!(0), "index_kpool"),
        ("index_topk", json!(30), "index_topk"),
        ("index_topk", json!(0), "index_topk"),
        ("q_lora_rank", Json::Null, "q_lora_rank"),
        ("qk_rope_head_dim", json!(8), "qk_rope_head_dim"),
        ("layer_types", json!(["linear_attention"]), "layer_types"),
        (
            "mlp_layer_types",
            json!(["dense", "dense", "sparse", "sparse", "sparse", "moe"]),
            "mlp_layer_types[5]",
        ),
        (
            "indexer_types",
            json!(["full", "shared", "full", "full", "full", "full"]),
            "indexer_types[1]",
        ),
        (
            "indexer_types",
            json!(["full", "full", "bogus", "full", "full", "full"]),
            "indexer_types[2]",
        ),
        ("indexer_types", json!(["full"]), "indexer_types"),
        ("hidden_act", json!("gelu"), "hidden_act"),
        ("attention_bias", json!(true), "attention_bias"),
        (
            "index_kpool_always_select_tail",
            json!(false),
            "index_kpool_always_select_tail",
        ),
        ("pad_token_id", json!(512), "pad_token_id"),
        ("n_group", json!(3), "n_group"),
        ("topk_group", json!(3), "topk_group"),
        ("num_experts_per_tok", json!(5), "num_experts_per_tok"),
        ("vocab_size", json!("big"), "vocab_size"),
        ("hidden_size", json!(0), "hidden_size"),
        ("model_type", json!("glm4_moe"), "model_type"),
    ];
    for (key, value, field) in cases {
        let mut j = base();
        j[key] = value;
        assert_eq!(field_of(&j), field, "{key}");
    }
    // A layer type transformers knows but GLM cannot run.
    let mut j = base();
    j["layer_types"][1] = json!("sliding_attention");
    assert_eq!(field_of(&j), "layer_types[1]");
    // A shared layer after a KDA layer, and a shared first layer.
    let mut j = base();
    j["indexer_types"] = json!(["full", "full", "shared", "full", "shared", "full"]);
    j["layer_types"][4] = json!("indexed_attention");
    assert_eq!(field_of(&j), "indexer_types[4]");
    let mut j = base();
    j["layer_types"][0] = json!("indexed_attention");
    j["indexer_types"][0] = json!("shared");
    assert_eq!(field_of(&j), "indexer_types[0]");
    // Shared on a KDA layer means nothing and is legal.
    let mut j = base();
    j["indexer_types"][3] = json!("shared");
    parse(&j);
    // Errors inside the wrapper carry its scope.
    let mut inner = base();
    inner["index_topk"] = json!(6);
    let wrapped = json!({"model_type":"glm5_next","text_config":inner});
    assert_eq!(field_of(&wrapped), "text_config.index_topk");
    let mut j = base();
    j["linear_attn_config"] = json!({"num_heads": "many"});
    assert_eq!(field_of(&j), "linear_attn_config.num_heads");
}
