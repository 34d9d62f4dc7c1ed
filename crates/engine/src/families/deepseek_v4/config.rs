//! DeepSeek-V4 hyper-parameters from a Hugging Face `config.json`.
//!
//! Mirrors `DeepseekV4Config.__post_init__` / `validate_layer_type` in
//! transformers 5.24, legacy forms included:
//!
//! * `layer_types` — explicit, else the legacy per-layer `compress_ratios`
//!   (0 → sliding, 4 → CSA, 128 → HCA), else V4-Pro's default (two HCA,
//!   then HCA/CSA alternating). V4-Flash ships `compress_ratios` with layers
//!   0–1 sliding, then CSA on even and HCA on odd layers.
//! * `compress_rates` — `{CSA: 4, HCA: 128}` unless given, with the legacy
//!   scalars `compress_rate_csa` / `compress_rate_hca` folded in.
//! * `mlp_layer_types` — explicit, else `num_hash_layers` (default 3) hash
//!   layers then learned top-k.
//! * the rotary width — `partial_rotary_factor`, else the legacy
//!   `qk_rope_head_dim / head_dim`, else 64/512.
//! * `rope_parameters` — nested `{main, compress}`, or flat (YaRN keys go
//!   to the compress rope only, with `attention_factor` forced to 1).
//!
//! Every error names the file and the field.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{EngineError, Result};
use crate::layers::rope::RopeScaling;
use crate::load::config_fields::Fields;

/// The attention of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// Sliding window only (main rope).
    Sliding,
    /// Compressed sparse attention: ratio-4 compressed entries chosen by the
    /// lightning indexer (compress rope).
    Csa,
    /// Heavily compressed attention: every complete ratio-128 entry.
    Hca,
}

/// How a layer's MoE picks its experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    /// By token id (`tid2eid`).
    Hash,
    /// Learned top-k over `score + bias`.
    TopK,
}

/// One rotary embedding (`main` or `compress`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    pub scaling: RopeScaling,
    /// Multiplies cos and sin (YaRN's attention factor; DeepSeek forces 1).
    pub attention_factor: f32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeepseekV4Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub attn: Vec<AttnKind>,
    pub mlp: Vec<MlpKind>,
    pub rms_norm_eps: f32,
    pub eos_token_id: Option<u32>,
    pub tie_word_embeddings: bool,
    pub context_length: usize,
    // Attention.
    pub num_heads: usize,
    pub head_dim: usize,
    pub q_lora_rank: usize,
    /// Rotated trailing dims per head.
    pub rope_dim: usize,
    pub main_rope: RopeSpec,
    pub compress_rope: RopeSpec,
    pub sliding_window: usize,
    pub csa_rate: usize,
    pub hca_rate: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    // Indexer.
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    // MoE.
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub routed_scaling_factor: f32,
    pub sigmoid_scoring: bool,
    pub swiglu_limit: f32,
    // Hyper-connections.
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
}

impl DeepseekV4Config {
    pub fn from_hf(path: &Path, json: &Json) -> Result<Self> {
        let f = Fields {
            path,
            json,
            scope: "",
        };
        let positive = |field: &str, v: usize| -> Result<usize> {
            if v == 0 {
                return Err(f.err(field, "must be positive"));
            }
            Ok(v)
        };
        let n = positive("num_hidden_layers", f.usize_or("num_hidden_layers", 43)?)?;
        let hidden_size = positive("hidden_size", f.usize_or("hidden_size", 4096)?)?;
        let num_heads = positive(
            "num_attention_heads",
            f.usize_or("num_attention_heads", 64)?,
        )?;
        let kv_heads = f.usize_or("num_key_value_heads", 1)?;
        if kv_heads != 1 {
            return Err(f.err(
                "num_key_value_heads",
                format!("DeepSeek-V4 attention has one shared K=V head, not {kv_heads}"),
            ));
        }
        let head_dim = positive("head_dim", f.usize_or("head_dim", 512)?)?;
        if let Some(act) = f.opt_str("hidden_act")?
            && act != "silu"
        {
            return Err(f.err("hidden_act", format!("only silu is supported, not {act}")));
        }
        for flag in ["attention_bias", "mlp_bias"] {
            if f.opt_bool(flag)? == Some(true) {
                return Err(f.err(flag, "DeepSeek-V4 has no biases here"));
            }
        }

        // Compression rates: the dict, then the legacy scalars.
        let (mut csa_rate, mut hca_rate) = (4, 128);
        if let Some(rates) = f.get("compress_rates") {
            let obj = rates
                .as_object()
                .ok_or_else(|| f.err("compress_rates", "expected an object"))?;
            for (k, v) in obj {
                let r = v.as_u64().filter(|&r| r > 0).ok_or_else(|| {
                    f.err(
                        &format!("compress_rates.{k}"),
                        "expected a positive integer",
                    )
                })? as usize;
                match k.as_str() {
                    "compressed_sparse_attention" => csa_rate = r,
                    "heavily_compressed_attention" => hca_rate = r,
                    _ => {
                        return Err(f.err(
                            &format!("compress_rates.{k}"),
                            "unknown attention type (compressed_sparse_attention or heavily_compressed_attention)",
                        ));
                    }
                }
            }
        }
        if let Some(r) = f.opt_usize("compress_rate_csa")? {
            csa_rate = positive("compress_rate_csa", r)?;
        }
        if let Some(r) = f.opt_usize("compress_rate_hca")? {
            hca_rate = positive("compress_rate_hca", r)?;
        }

        let attn = layer_types(&f, n)?;
        let mlp = mlp_types(&f, n)?;

        let rope_dim = match (
            f.opt_f64("partial_rotary_factor")?,
            f.opt_usize("qk_rope_head_dim")?,
        ) {
            (Some(p), _) => (head_dim as f64 * p) as usize,
            (None, Some(r)) => r,
            (None, None) => head_dim / 8,
        };
        if rope_dim == 0 || rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(f.err(
                "partial_rotary_factor",
                format!("gives {rope_dim} rotated dims of a {head_dim}-dim head (needs an even number in 2..={head_dim})"),
            ));
        }
        let rope_theta = f.opt_f64("rope_theta")?.unwrap_or(10000.0);
        let compress_theta = f.opt_f64("compress_rope_theta")?.unwrap_or(160000.0);
        let (main_rope, compress_rope) = ropes(&f, rope_theta, compress_theta)?;

        let o_groups = positive("o_groups", f.usize_or("o_groups", 8)?)?;
        if num_heads % o_groups != 0 {
            return Err(f.err(
                "o_groups",
                format!("{num_heads} heads do not split into {o_groups} groups"),
            ));
        }
        let n_routed_experts = positive("n_routed_experts", f.usize_or("n_routed_experts", 256)?)?;
        let k = positive("num_experts_per_tok", f.usize_or("num_experts_per_tok", 6)?)?;
        if k > n_routed_experts {
            return Err(f.err(
                "num_experts_per_tok",
                format!("{k} experts per token of {n_routed_experts}"),
            ));
        }
        let sigmoid_scoring = match f.opt_str("scoring_func")?.unwrap_or("sqrtsoftplus") {
            "sqrtsoftplus" => false,
            "sigmoid" => true,
            other => {
                return Err(f.err(
                    "scoring_func",
                    format!("{other} is not supported (sqrtsoftplus or sigmoid)"),
                ));
            }
        };
        let sliding_window = f.usize_or("sliding_window", 128)?;
        if sliding_window < 2 {
            return Err(f.err("sliding_window", "must be at least 2"));
        }
        let index_n_heads = positive("index_n_heads", f.usize_or("index_n_heads", 64)?)?;
        let index_head_dim = f.usize_or("index_head_dim", 128)?;
        if attn.contains(&AttnKind::Csa) && (index_head_dim < rope_dim || index_head_dim == 0) {
            return Err(f.err(
                "index_head_dim",
                format!("the indexer rotates {rope_dim} dims of each {index_head_dim}-dim head"),
            ));
        }
        let eos_token_id =
            match f.get("eos_token_id") {
                None => None,
                Some(Json::Array(a)) => a.first().and_then(|v| v.as_u64()).map(|v| v as u32),
                Some(v) => Some(v.as_u64().ok_or_else(|| {
                    f.err("eos_token_id", format!("expected an integer, found {v}"))
                })? as u32),
            };
        Ok(Self {
            vocab_size: positive("vocab_size", f.usize_or("vocab_size", 129280)?)?,
            hidden_size,
            num_layers: n,
            attn,
            mlp,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            eos_token_id,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            context_length: positive(
                "max_position_embeddings",
                f.usize_or("max_position_embeddings", 1 << 20)?,
            )?,
            num_heads,
            head_dim,
            q_lora_rank: positive("q_lora_rank", f.usize_or("q_lora_rank", 1024)?)?,
            rope_dim,
            main_rope,
            compress_rope,
            sliding_window,
            csa_rate,
            hca_rate,
            o_groups,
            o_lora_rank: positive("o_lora_rank", f.usize_or("o_lora_rank", 1024)?)?,
            index_n_heads,
            index_head_dim,
            index_topk: positive("index_topk", f.usize_or("index_topk", 512)?)?,
            n_routed_experts,
            num_experts_per_tok: k,
            moe_intermediate_size: positive(
                "moe_intermediate_size",
                f.usize_or("moe_intermediate_size", 2048)?,
            )?,
            routed_scaling_factor: f.opt_f64("routed_scaling_factor")?.unwrap_or(1.5) as f32,
            sigmoid_scoring,
            swiglu_limit: f.opt_f64("swiglu_limit")?.unwrap_or(10.0) as f32,
            hc_mult: positive("hc_mult", f.usize_or("hc_mult", 4)?)?,
            hc_sinkhorn_iters: positive("hc_sinkhorn_iters", f.usize_or("hc_sinkhorn_iters", 20)?)?,
            hc_eps: f.opt_f64("hc_eps")?.unwrap_or(1e-6) as f32,
        })
    }

    /// The compression ratio of an attention kind (0 for sliding).
    pub fn ratio_of(&self, kind: AttnKind) -> usize {
        match kind {
            AttnKind::Sliding => 0,
            AttnKind::Csa => self.csa_rate,
            AttnKind::Hca => self.hca_rate,
        }
    }
}

fn layer_types(f: &Fields<'_>, n: usize) -> Result<Vec<AttnKind>> {
    let types: Vec<AttnKind> = if let Some(v) = f.get("layer_types") {
        let a = v
            .as_array()
            .ok_or_else(|| f.err("layer_types", "expected a list"))?;
        a.iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(AttnKind::Sliding),
                Some("compressed_sparse_attention") => Ok(AttnKind::Csa),
                Some("heavily_compressed_attention") => Ok(AttnKind::Hca),
                _ => Err(f.err(
                    "layer_types",
                    format!(
                        "entries must be one of sliding_attention, compressed_sparse_attention, \
                         heavily_compressed_attention; got {t}"
                    ),
                )),
            })
            .collect::<Result<_>>()?
    } else if let Some(v) = f.get("compress_ratios") {
        let a = v
            .as_array()
            .ok_or_else(|| f.err("compress_ratios", "expected a list"))?;
        a.iter()
            .map(|r| match r.as_u64() {
                Some(0) => Ok(AttnKind::Sliding),
                Some(4) => Ok(AttnKind::Csa),
                Some(128) => Ok(AttnKind::Hca),
                _ => Err(f.err(
                    "compress_ratios",
                    format!("entries must be 0, 4 or 128; got {r}"),
                )),
            })
            .collect::<Result<_>>()?
    } else {
        let mut t = vec![AttnKind::Hca; n.min(2)];
        t.extend((0..n.saturating_sub(2)).map(|i| {
            if i % 2 == 1 {
                AttnKind::Csa
            } else {
                AttnKind::Hca
            }
        }));
        t
    };
    // transformers keeps the first `n` entries, then requires exactly `n`.
    let types: Vec<AttnKind> = types.into_iter().take(n).collect();
    if types.len() != n {
        return Err(f.err(
            "layer_types",
            format!(
                "`num_hidden_layers` ({n}) must equal its length ({})",
                types.len()
            ),
        ));
    }
    Ok(types)
}

fn mlp_types(f: &Fields<'_>, n: usize) -> Result<Vec<MlpKind>> {
    let types: Vec<MlpKind> = if let Some(v) = f.get("mlp_layer_types") {
        let a = v
            .as_array()
            .ok_or_else(|| f.err("mlp_layer_types", "expected a list"))?;
        a.iter()
            .map(|t| match t.as_str() {
                Some("hash_moe") => Ok(MlpKind::Hash),
                Some("moe") => Ok(MlpKind::TopK),
                _ => Err(f.err(
                    "mlp_layer_types",
                    format!("entries must be one of hash_moe, moe; got {t}"),
                )),
            })
            .collect::<Result<_>>()?
    } else {
        let hash = f.usize_or("num_hash_layers", 3)?;
        (0..n)
            .map(|i| {
                if i < hash {
                    MlpKind::Hash
                } else {
                    MlpKind::TopK
                }
            })
            .collect()
    };
    let types: Vec<MlpKind> = types.into_iter().take(n).collect();
    if types.len() != n {
        return Err(f.err(
            "mlp_layer_types",
            format!(
                "`num_hidden_layers` ({n}) must equal its length ({})",
                types.len()
            ),
        ));
    }
    Ok(types)
}

/// The `main` and `compress` ropes, from the nested or the flat form.
fn ropes(f: &Fields<'_>, theta: f64, compress_theta: f64) -> Result<(RopeSpec, RopeSpec)> {
    let rp = f.get("rope_parameters");
    let nested = rp.and_then(|r| Some((r.get("main")?, r.get("compress")?)));
    match nested {
        Some((main, compress)) => Ok((
            rope_spec(f, "rope_parameters.main", main, theta)?,
            rope_spec(f, "rope_parameters.compress", compress, compress_theta)?,
        )),
        None => {
            let main = RopeSpec {
                theta,
                scaling: RopeScaling::None,
                attention_factor: 1.0,
            };
            let mut compress = rp
                .cloned()
                .unwrap_or_else(|| Json::Object(Default::default()));
            if let Some(o) = compress.as_object_mut() {
                o.remove("rope_theta");
                if o.get("rope_type").and_then(|t| t.as_str()) == Some("yarn") {
                    o.entry("attention_factor").or_insert(Json::from(1.0));
                }
            }
            Ok((
                main,
                rope_spec(f, "rope_parameters", &compress, compress_theta)?,
            ))
        }
    }
}

fn rope_spec(f: &Fields<'_>, field: &str, j: &Json, theta_default: f64) -> Result<RopeSpec> {
    let get_f = |k: &str| j.get(k).and_then(|v| v.as_f64());
    let theta = get_f("rope_theta").unwrap_or(theta_default);
    let kind = j
        .get("rope_type")
        .or_else(|| j.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    match kind {
        "default" => Ok(RopeSpec {
            theta,
            scaling: RopeScaling::None,
            attention_factor: 1.0,
        }),
        "yarn" => {
            let factor = get_f("factor")
                .filter(|&x| x >= 1.0)
                .ok_or_else(|| f.err(&format!("{field}.factor"), "YaRN needs a factor >= 1"))?;
            let original = j
                .get("original_max_position_embeddings")
                .and_then(|v| v.as_u64())
                .ok_or_else(|| {
                    f.err(
                        &format!("{field}.original_max_position_embeddings"),
                        "YaRN needs the original context length",
                    )
                })? as usize;
            Ok(RopeSpec {
                theta,
                scaling: RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: get_f("beta_fast").unwrap_or(32.0),
                    beta_slow: get_f("beta_slow").unwrap_or(1.0),
                },
                attention_factor: get_f("attention_factor").unwrap_or(1.0) as f32,
            })
        }
        other => Err(EngineError::Config {
            path: f.path.to_path_buf(),
            field: format!("{field}.rope_type"),
            message: format!("{other} is not supported for DeepSeek-V4 (default or yarn)"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(j: Json) -> Result<DeepseekV4Config> {
        DeepseekV4Config::from_hf(Path::new("config.json"), &j)
    }

    fn field_of(j: Json) -> String {
        match parse(j) {
            Err(EngineError::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn flash_defaults_and_legacy_forms() {
        // The Flash schedule in the legacy form.
        let mut ratios = vec![0, 0];
        ratios.extend((2..43).map(|i| if i % 2 == 0 { 4 } else { 128 }));
        let c = parse(json!({"compress_ratios": ratios, "num_hash_layers": 3,
            "rope_parameters": {"rope_type": "yarn", "factor": 16.0,
                "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}}))
        .unwrap();
        assert_eq!(
            c.attn[..4],
            [
                AttnKind::Sliding,
                AttnKind::Sliding,
                AttnKind::Csa,
                AttnKind::Hca
            ]
        );
        assert_eq!(c.mlp[2..4], [MlpKind::Hash, MlpKind::TopK]);
        assert_eq!((c.rope_dim, c.csa_rate, c.hca_rate), (64, 4, 128));
        assert_eq!(c.main_rope.scaling, RopeScaling::None);
        assert!(
            matches!(c.compress_rope.scaling, RopeScaling::Yarn { factor, .. } if factor == 16.0)
        );
        assert_eq!(
            (c.main_rope.theta, c.compress_rope.theta),
            (10000.0, 160000.0)
        );
        // Nothing given: V4-Pro's default schedule.
        let d = parse(json!({"num_hidden_layers": 5})).unwrap();
        assert_eq!(
            d.attn,
            [
                AttnKind::Hca,
                AttnKind::Hca,
                AttnKind::Hca,
                AttnKind::Csa,
                AttnKind::Hca
            ]
        );
        // Legacy rate scalars and qk_rope_head_dim.
        let e = parse(json!({"num_hidden_layers": 2, "compress_rate_hca": 16,
            "qk_rope_head_dim": 8, "head_dim": 32, "index_head_dim": 16}))
        .unwrap();
        assert_eq!((e.hca_rate, e.rope_dim), (16, 8));
    }

    #[test]
    fn validation_names_fields() {
        assert_eq!(
            field_of(json!({"num_key_value_heads": 2})),
            "num_key_value_heads"
        );
        assert_eq!(
            field_of(json!({"num_hidden_layers": 3, "layer_types": ["sliding_attention"]})),
            "layer_types"
        );
        assert_eq!(
            field_of(json!({"compress_ratios": [0, 5]})),
            "compress_ratios"
        );
        assert_eq!(
            field_of(json!({"num_hidden_layers": 1, "mlp_layer_types": ["dense"]})),
            "mlp_layer_types"
        );
        assert_eq!(field_of(json!({"o_groups": 7})), "o_groups");
        assert_eq!(field_of(json!({"scoring_func": "softmax"})), "scoring_func");
        assert_eq!(
            field_of(json!({"rope_parameters": {"rope_type": "yarn"}})),
            "rope_parameters.factor"
        );
        assert_eq!(
            field_of(json!({"partial_rotary_factor": 0.0})),
            "partial_rotary_factor"
        );
    }
}
