//! Qwen4-Exp hyper-parameters from a Hugging Face `config.json`.
//!
//! Two layouts: text-only `qwen4_exp_text` (fields at the top level, tensor
//! keys `model.*`) and the VL wrapper `qwen4_exp` (fields under
//! `text_config`, tensor keys `model.language_model.*`). The derivations and
//! checks mirror `Qwen4ExpTextConfig.__post_init__` / `validate_architecture`
//! in transformers 5.24: `layer_types` from `full_attention_interval`
//! (default 4), `full_attention` rewritten to `indexed_attention`, every
//! attention layer is QSA (so the `indexer_*` fields are required), PLE only on
//! linear layers, `eos_token_id` required with PLE, and so on. Every error
//! names the file and the field.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::Result;
use crate::load::config_fields::Fields;

/// What a decoder layer's token mixer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet (`linear_attn`).
    Linear,
    /// Gated attention with the QSA indexer (`self_attn`).
    Indexed,
}

/// Activation of the GDN output gate (`output_gate_type`, or `hidden_act`).
pub use crate::backend::GateAct;

#[derive(Debug, Clone, PartialEq)]
pub struct Qwen4ExpConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub rms_norm_eps: f64,
    pub eos_token_id: Option<u32>,
    pub tie_word_embeddings: bool,
    pub context_length: usize,
    // Gated attention.
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    /// Rotated dims per head: `int(head_dim · partial_rotary_factor)`.
    pub rotary_dim: usize,
    pub mrope_section: [usize; 3],
    // GDN.
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel: usize,
    pub output_gate: GateAct,
    // MoE.
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    // Hyper-connections.
    pub hc_count: usize,
    pub hc_lowrank: usize,
    // QSA indexer.
    pub indexer_n_heads: usize,
    pub indexer_head_dim: usize,
    pub indexer_budget: usize,
    pub indexer_compress_ratio: usize,
    // PLE.
    /// 1-indexed decoder layer ids, sorted and deduplicated (as transformers).
    pub ple_layer_ids: Vec<usize>,
    pub ple_embed_dim: usize,
    pub ple_conv_kernel: usize,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    pub ngram_vocab_size_base: u64,
    pub ngram_vocab_divisor: u64,
    pub seed: u64,
}

/// Parsed config plus where the text model's tensors live.
#[derive(Debug, Clone)]
pub struct ParsedConfig {
    pub config: Qwen4ExpConfig,
    /// `model.` (text-only) or `model.language_model.` (VL checkpoint).
    pub prefix: &'static str,
}

fn positive(f: &Fields<'_>, field: &str, v: usize) -> Result<usize> {
    if v == 0 {
        return Err(f.err(field, "must be positive"));
    }
    Ok(v)
}

impl Qwen4ExpConfig {
    /// Parse `config.json` (already read) from `path`.
    pub fn from_hf(path: &Path, json: &Json) -> Result<ParsedConfig> {
        let top = Fields {
            path,
            json,
            scope: "",
        };
        let model_type = top
            .opt_str("model_type")?
            .ok_or_else(|| top.err("model_type", "missing"))?;
        let (text, prefix, top_tie) = match model_type {
            "qwen4_exp_text" => (json, "model.", None),
            "qwen4_exp" => {
                let t = top
                    .get("text_config")
                    .filter(|t| t.is_object())
                    .ok_or_else(|| top.err("text_config", "missing or not an object"))?;
                (
                    t,
                    "model.language_model.",
                    top.opt_bool("tie_word_embeddings")?,
                )
            }
            other => {
                return Err(top.err(
                    "model_type",
                    format!("`{other}` is not a qwen4_exp model (qwen4_exp, qwen4_exp_text)"),
                ));
            }
        };
        let f = Fields {
            path,
            json: text,
            scope: if prefix == "model." {
                ""
            } else {
                "text_config."
            },
        };
        let num_layers = positive(&f, "num_hidden_layers", f.usize("num_hidden_layers")?)?;
        let layer_kinds = match f.get("layer_types") {
            Some(Json::Array(a)) => {
                if a.len() != num_layers {
                    return Err(f.err(
                        "layer_types",
                        format!("{} entries for {num_layers} layers", a.len()),
                    ));
                }
                a.iter()
                    .enumerate()
                    .map(|(i, v)| match v.as_str() {
                        Some("linear_attention") => Ok(LayerKind::Linear),
                        // The shipped config says full_attention; transformers
                        // rewrites it: every attention layer is QSA.
                        Some("full_attention" | "indexed_attention") => Ok(LayerKind::Indexed),
                        _ => Err(f.err(
                            &format!("layer_types[{i}]"),
                            format!(
                                "unsupported layer type {v} (linear_attention, full_attention, indexed_attention)"
                            ),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            Some(v) => return Err(f.err("layer_types", format!("expected a list, found {v}"))),
            None => {
                let interval = positive(
                    &f,
                    "full_attention_interval",
                    f.usize_or("full_attention_interval", 4)?,
                )?;
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % interval != 0 {
                            LayerKind::Linear
                        } else {
                            LayerKind::Indexed
                        }
                    })
                    .collect()
            }
        };

        let hidden_size = positive(&f, "hidden_size", f.usize("hidden_size")?)?;
        let num_heads = positive(&f, "num_attention_heads", f.usize("num_attention_heads")?)?;
        let num_kv_heads = positive(
            &f,
            "num_key_value_heads",
            f.usize_or("num_key_value_heads", num_heads)?,
        )?;
        if num_heads % num_kv_heads != 0 {
            return Err(f.err(
                "num_key_value_heads",
                format!("{num_heads} query heads are not a multiple of {num_kv_heads} kv heads"),
            ));
        }
        let head_dim = positive(
            &f,
            "head_dim",
            f.usize_or("head_dim", hidden_size / num_heads)?,
        )?;
        if f.opt_bool("attention_bias")? == Some(true) {
            return Err(f.err("attention_bias", "Qwen4-Exp attention has no biases"));
        }
        let hidden_act = f.opt_str("hidden_act")?.unwrap_or("silu");
        if hidden_act != "silu" {
            return Err(f.err(
                "hidden_act",
                format!("`{hidden_act}` is not supported (silu)"),
            ));
        }
        let output_gate = match f.opt_str("output_gate_type")?.unwrap_or(hidden_act) {
            "sigmoid" => GateAct::Sigmoid,
            "silu" => GateAct::Silu,
            other => {
                return Err(f.err(
                    "output_gate_type",
                    format!("unsupported output gate activation `{other}` (sigmoid, silu)"),
                ));
            }
        };

        // RoPE: `rope_parameters` (transformers 5) with theta, partial factor
        // and the M-RoPE section.
        let rope = f.get("rope_parameters");
        let rp = rope.map(|r| Fields {
            path,
            json: r,
            scope: if prefix == "model." {
                "rope_parameters."
            } else {
                "text_config.rope_parameters."
            },
        });
        let (rope_theta, partial, rope_type, section) = match &rp {
            Some(rp) => {
                if !rp.json.is_object() {
                    return Err(f.err("rope_parameters", "expected an object"));
                }
                let section = match rp.get("mrope_section") {
                    None => [11, 11, 10],
                    Some(Json::Array(a)) if a.len() == 3 => {
                        let mut s = [0usize; 3];
                        for (i, v) in a.iter().enumerate() {
                            s[i] = v.as_u64().map(|x| x as usize).ok_or_else(|| {
                                rp.err("mrope_section", format!("expected integers, found {v}"))
                            })?;
                        }
                        s
                    }
                    Some(v) => {
                        return Err(
                            rp.err("mrope_section", format!("expected 3 integers, found {v}"))
                        );
                    }
                };
                (
                    rp.opt_f64("rope_theta")?
                        .or(f.opt_f64("rope_theta")?)
                        .unwrap_or(10_000.0),
                    rp.opt_f64("partial_rotary_factor")?.unwrap_or(1.0),
                    rp.opt_str("rope_type")?.unwrap_or("default").to_string(),
                    section,
                )
            }
            None => (
                f.opt_f64("rope_theta")?.unwrap_or(10_000.0),
                f.opt_f64("partial_rotary_factor")?.unwrap_or(1.0),
                "default".to_string(),
                [11, 11, 10],
            ),
        };
        if rope_type != "default" {
            return Err(f.err(
                "rope_parameters.rope_type",
                format!("RoPE type `{rope_type}` is not supported (default)"),
            ));
        }
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(f.err(
                "rope_parameters.rope_theta",
                format!("{rope_theta} is not positive"),
            ));
        }
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(f.err(
                "rope_parameters.partial_rotary_factor",
                format!("{partial} is not in (0, 1]"),
            ));
        }
        // Python's int() truncation.
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if !rotary_dim.is_multiple_of(2) || rotary_dim == 0 {
            return Err(f.err(
                "rope_parameters.partial_rotary_factor",
                format!("rotary dim {rotary_dim} must be positive and even"),
            ));
        }
        // QSA: always built on attention layers, so the fields are required
        // when any attention layer exists (transformers raises a TypeError).
        let has_attn = layer_kinds.contains(&LayerKind::Indexed);
        let q = |field: &str| -> Result<usize> {
            match f.opt_usize(field)? {
                Some(v) => positive(&f, field, v),
                None if has_attn => Err(f.err(
                    field,
                    "required: every Qwen4-Exp attention layer uses the QSA indexer",
                )),
                None => Ok(1),
            }
        };
        let indexer_n_heads = q("indexer_n_heads")?;
        let indexer_kv_heads = q("indexer_kv_heads")?;
        let indexer_head_dim = q("indexer_head_dim")?;
        let indexer_budget = q("indexer_budget")?;
        let indexer_compress_ratio = q("indexer_compress_ratio")?;
        if indexer_kv_heads != 1 {
            return Err(f.err(
                "indexer_kv_heads",
                "Qwen4-Exp QSA requires indexer_kv_heads=1",
            ));
        }
        if indexer_budget % indexer_compress_ratio != 0 {
            return Err(f.err(
                "indexer_budget",
                format!("{indexer_budget} is not divisible by indexer_compress_ratio {indexer_compress_ratio}"),
            ));
        }
        if has_attn && rotary_dim > indexer_head_dim {
            return Err(f.err(
                "indexer_head_dim",
                format!("attention RoPE dims must fit the QSA index head: rotary_dim={rotary_dim} > {indexer_head_dim}"),
            ));
        }

        let hc_count = f.usize_or("hc_count", 4)?;
        if hc_count <= 1 {
            return Err(f.err(
                "hc_count",
                format!("Qwen4-Exp requires hc_count > 1, got {hc_count}"),
            ));
        }
        let num_experts = positive(&f, "num_experts", f.usize_or("num_experts", 512)?)?;
        let num_experts_per_tok = f.usize_or("num_experts_per_tok", 10)?;
        if num_experts_per_tok == 0 || num_experts_per_tok > num_experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("must be in [1, {num_experts}], got {num_experts_per_tok}"),
            ));
        }

        let eos_token_id =
            match f.get("eos_token_id") {
                None => None,
                Some(Json::Array(a)) => match a.first() {
                    None => None,
                    Some(v) => Some(v.as_u64().map(|x| x as u32).ok_or_else(|| {
                        f.err("eos_token_id", format!("expected integers, found {v}"))
                    })?),
                },
                Some(v) => Some(v.as_u64().map(|x| x as u32).ok_or_else(|| {
                    f.err("eos_token_id", format!("expected an integer, found {v}"))
                })?),
            };
        let mut ple_layer_ids: Vec<usize> = match f.get("ple_layer_ids") {
            None => vec![],
            Some(Json::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64().map(|x| x as usize).ok_or_else(|| {
                        f.err("ple_layer_ids", format!("expected integers, found {v}"))
                    })
                })
                .collect::<Result<_>>()?,
            Some(v) => return Err(f.err("ple_layer_ids", format!("expected a list, found {v}"))),
        };
        ple_layer_ids.sort_unstable();
        ple_layer_ids.dedup();
        let ple_embed_dim = f.usize_or("ple_embed_dim", hidden_size)?;
        let ngram_size = f.usize_or("ngram_size", 3)?;
        let heads_per_ngram = f.usize_or("heads_per_ngram", 8)?;
        if !ple_layer_ids.is_empty() {
            let heads = ngram_size.saturating_sub(1) * heads_per_ngram;
            if heads == 0 || ple_embed_dim == 0 || ple_embed_dim % heads != 0 {
                return Err(f.err(
                    "ple_embed_dim",
                    format!(
                        "must be positive and divisible by the {heads} n-gram heads ((ngram_size-1)·heads_per_ngram)"
                    ),
                ));
            }
            if let Some(bad) = ple_layer_ids.iter().find(|&&id| id < 1 || id > num_layers) {
                return Err(f.err(
                    "ple_layer_ids",
                    format!("ids are one-indexed in [1, {num_layers}], got {bad}"),
                ));
            }
            if let Some(bad) = ple_layer_ids
                .iter()
                .find(|&&id| layer_kinds[id - 1] != LayerKind::Linear)
            {
                return Err(f.err(
                    "ple_layer_ids",
                    format!("PLE is only supported on linear_attention layers, got layer id {bad}"),
                ));
            }
            if eos_token_id.is_none() {
                return Err(f.err("eos_token_id", "must be set when PLE layers are enabled"));
            }
        }
        let tie_word_embeddings = match top_tie {
            Some(t) => t,
            None => f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        };
        let rms_norm_eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        if !(rms_norm_eps.is_finite() && rms_norm_eps >= 0.0) {
            return Err(f.err(
                "rms_norm_eps",
                format!("{rms_norm_eps} is not a non-negative number"),
            ));
        }
        let lin_k = positive(
            &f,
            "linear_num_key_heads",
            f.usize_or("linear_num_key_heads", 16)?,
        )?;
        let lin_v = positive(
            &f,
            "linear_num_value_heads",
            f.usize_or("linear_num_value_heads", 32)?,
        )?;
        if lin_v % lin_k != 0 {
            return Err(f.err(
                "linear_num_value_heads",
                format!("{lin_v} value heads are not a multiple of {lin_k} key heads"),
            ));
        }
        let cfg = Qwen4ExpConfig {
            vocab_size: positive(&f, "vocab_size", f.usize("vocab_size")?)?,
            hidden_size,
            num_layers,
            layer_kinds,
            rms_norm_eps,
            eos_token_id,
            tie_word_embeddings,
            context_length: positive(
                &f,
                "max_position_embeddings",
                f.usize_or("max_position_embeddings", 262_144)?,
            )?,
            num_heads,
            num_kv_heads,
            head_dim,
            rope_theta,
            rotary_dim,
            mrope_section: section,
            linear_num_key_heads: lin_k,
            linear_num_value_heads: lin_v,
            linear_key_head_dim: positive(
                &f,
                "linear_key_head_dim",
                f.usize_or("linear_key_head_dim", 128)?,
            )?,
            linear_value_head_dim: positive(
                &f,
                "linear_value_head_dim",
                f.usize_or("linear_value_head_dim", 128)?,
            )?,
            linear_conv_kernel: positive(
                &f,
                "linear_conv_kernel_dim",
                f.usize_or("linear_conv_kernel_dim", 4)?,
            )?,
            output_gate,
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size: positive(
                &f,
                "moe_intermediate_size",
                f.usize("moe_intermediate_size")?,
            )?,
            shared_expert_intermediate_size: positive(
                &f,
                "shared_expert_intermediate_size",
                f.usize("shared_expert_intermediate_size")?,
            )?,
            norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(true),
            hc_count,
            hc_lowrank: positive(&f, "hc_lowrank", f.usize_or("hc_lowrank", 320)?)?,
            indexer_n_heads,
            indexer_head_dim,
            indexer_budget,
            indexer_compress_ratio,
            ple_layer_ids,
            ple_embed_dim,
            ple_conv_kernel: positive(
                &f,
                "ple_conv_kernel_size",
                f.usize_or("ple_conv_kernel_size", 4)?,
            )?,
            ngram_size,
            heads_per_ngram,
            ngram_vocab_size_base: f.usize_or("ngram_vocab_size_base", 20_000_000)? as u64,
            ngram_vocab_divisor: positive(
                &f,
                "make_ngram_vocab_size_divisible_by",
                f.usize_or("make_ngram_vocab_size_divisible_by", 128)?,
            )? as u64,
            seed: f.usize_or("seed", 1234)? as u64,
        };
        Ok(ParsedConfig {
            config: cfg,
            prefix,
        })
    }

    /// Index of decoder layer `layer` in `ple_layer_ids` (its PLE hash
    /// index), when it has PLE. The ids are 1-indexed.
    pub fn ple_index(&self, layer: usize) -> Option<usize> {
        self.ple_layer_ids.iter().position(|&id| id == layer + 1)
    }

    /// `indexer_budget / indexer_compress_ratio`.
    pub fn block_topk(&self) -> usize {
        self.indexer_budget / self.indexer_compress_ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::EngineError;
    use serde_json::json;

    fn base() -> Json {
        json!({"model_type":"qwen4_exp_text","vocab_size":64,"hidden_size":16,"num_hidden_layers":4,
            "num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,"moe_intermediate_size":4,
            "shared_expert_intermediate_size":4,"num_experts":4,"num_experts_per_tok":2,
            "indexer_n_heads":2,"indexer_kv_heads":1,"indexer_head_dim":8,"indexer_budget":8,
            "indexer_compress_ratio":4,"eos_token_id":2,"ple_layer_ids":[1],
            "rope_parameters":{"rope_type":"default","rope_theta":1e4,"partial_rotary_factor":0.5,"mrope_section":[1,1,0]}})
    }

    fn field_of(j: Json) -> String {
        match Qwen4ExpConfig::from_hf(Path::new("c.json"), &j) {
            Err(EngineError::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn qwen4_interval_and_full_attention_rewrite() {
        let c = Qwen4ExpConfig::from_hf(Path::new("c.json"), &base())
            .unwrap()
            .config;
        use LayerKind::*;
        assert_eq!(c.layer_kinds, vec![Linear, Linear, Linear, Indexed]);
        let mut j = base();
        j["layer_types"] = json!([
            "linear_attention",
            "full_attention",
            "linear_attention",
            "linear_attention"
        ]);
        let c = Qwen4ExpConfig::from_hf(Path::new("c.json"), &j)
            .unwrap()
            .config;
        assert_eq!(c.layer_kinds, vec![Linear, Indexed, Linear, Linear]);
        assert_eq!(c.rotary_dim, 4);
        assert_eq!(c.ple_index(0), Some(0));
    }

    #[test]
    fn qwen4_validation_names_fields() {
        let cases: Vec<(&str, Json, &str)> = vec![
            ("hc_count", json!(1), "hc_count"),
            ("indexer_budget", json!(6), "indexer_budget"),
            ("indexer_kv_heads", json!(2), "indexer_kv_heads"),
            ("indexer_head_dim", json!(2), "indexer_head_dim"),
            ("indexer_n_heads", Json::Null, "indexer_n_heads"),
            ("eos_token_id", Json::Null, "eos_token_id"),
            ("ple_layer_ids", json!([4]), "ple_layer_ids"),
            ("ple_embed_dim", json!(15), "ple_embed_dim"),
            ("num_experts_per_tok", json!(5), "num_experts_per_tok"),
            ("output_gate_type", json!("gelu"), "output_gate_type"),
            ("model_type", json!("llama"), "model_type"),
        ];
        for (key, value, field) in cases {
            let mut j = base();
            j[key] = value;
            assert_eq!(field_of(j), field, "{key}");
        }
        let mut vl = json!({"model_type":"qwen4_exp"});
        vl["text_config"] = base();
        vl["text_config"]["hc_count"] = json!(1);
        assert_eq!(field_of(vl), "text_config.hc_count");
    }
}
