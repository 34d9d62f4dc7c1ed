//! Llama hyper-parameters, read from a GGUF's `llama.*` metadata or from a
//! Hugging Face `config.json`. Every error names the file and the key.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{EngineError, Result};
use crate::layers::rope::{RopeLayout, RopeScaling};
use crate::load::gguf::GgufFile;

#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// GGUF stores q/k rows permuted for interleaved (GPT-J style) rotation;
    /// Hugging Face checkpoints rotate the two halves of each head.
    pub rope_layout: RopeLayout,
    pub context_length: usize,
    pub tie_word_embeddings: bool,
}

impl LlamaConfig {
    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |field: &str, message: String| EngineError::Config {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.context_length),
        ] {
            if v == 0 {
                return Err(bad(field, "must be positive".into()));
            }
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(
                "num_key_value_heads",
                format!(
                    "{} query heads are not a multiple of {} kv heads",
                    self.num_heads, self.num_kv_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                format!("{} is odd; RoPE rotates pairs", self.head_dim),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(bad(
                "rope_theta",
                format!("{} is not a positive number", self.rope_theta),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(bad(
                "rms_norm_eps",
                format!("{} is not a non-negative number", self.rms_norm_eps),
            ));
        }
        Ok(())
    }

    /// From `llama.*` GGUF metadata. The vocabulary size comes from the
    /// embedding table when `llama.vocab_size` is absent (it usually is).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g.string("general.architecture")?;
        if !super::DESCRIPTOR.model_types.contains(&arch) {
            return Err(EngineError::Config {
                path: g.path().to_path_buf(),
                field: "general.architecture".into(),
                message: format!("`{arch}` is not a llama-family architecture"),
            });
        }
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size = g.usize(&key("embedding_length"))?;
        let num_heads = g.usize(&key("attention.head_count"))?;
        let num_kv_heads = g
            .opt_usize(&key("attention.head_count_kv"))?
            .unwrap_or(num_heads);
        let head_dim = match g.opt_usize(&key("attention.key_length"))? {
            Some(d) => d,
            None => g
                .opt_usize(&key("rope.dimension_count"))?
                .unwrap_or(hidden_size / num_heads.max(1)),
        };
        let vocab_size = match g.opt_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => match g.tensor_meta("token_embd.weight") {
                Some((shape, _)) if shape.len() == 2 => shape[0],
                _ => {
                    return Err(EngineError::Tensor {
                        path: g.path().to_path_buf(),
                        tensor: "token_embd.weight".into(),
                        message: "missing or not 2-D; cannot infer the vocabulary size".into(),
                    });
                }
            },
        };
        let scaling_key = key("rope.scaling.type");
        let rope_scaling = match g.opt_string(&scaling_key)? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: g.f64(&key("rope.scaling.factor"))?,
            },
            Some(other) => {
                return Err(EngineError::Config {
                    path: g.path().to_path_buf(),
                    field: scaling_key,
                    message: format!("RoPE scaling `{other}` is not supported (none, linear)"),
                });
            }
        };
        let cfg = Self {
            vocab_size,
            hidden_size,
            intermediate_size: g.usize(&key("feed_forward_length"))?,
            num_layers: g.usize(&key("block_count"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: g.f64(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_scaling,
            rope_layout: RopeLayout::Interleaved,
            context_length: g.usize(&key("context_length"))?,
            // Decided by the loader from the presence of `output.weight`.
            tie_word_embeddings: !g.has_tensor("output.weight"),
        };
        cfg.validate(g.path())?;
        Ok(cfg)
    }

    /// From a Hugging Face `config.json` (either the transformers 5
    /// `rope_parameters` form or the older `rope_theta` + `rope_scaling`).
    pub fn from_hf(path: &Path, json: &Json) -> Result<Self> {
        let f = HfFields { path, json };
        let model_type = f.string("model_type")?;
        if !super::DESCRIPTOR.model_types.contains(&model_type) {
            return Err(f.err(
                "model_type",
                format!("`{model_type}` is not a llama-family model"),
            ));
        }
        if let Some(act) = f.opt_string("hidden_act")?
            && act != "silu"
        {
            return Err(f.err("hidden_act", format!("`{act}` is not supported (silu)")));
        }
        for field in ["attention_bias", "mlp_bias"] {
            if f.opt_bool(field)? == Some(true) {
                return Err(f.err(field, "biases are not supported by the llama family".into()));
            }
        }
        if let Some(p) = f.opt_f64("partial_rotary_factor")?
            && p != 1.0
        {
            return Err(f.err(
                "partial_rotary_factor",
                format!("{p} is not supported (1.0)"),
            ));
        }
        let hidden_size = f.usize("hidden_size")?;
        let num_heads = f.usize("num_attention_heads")?;
        let num_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim = f
            .opt_usize("head_dim")?
            .unwrap_or(hidden_size / num_heads.max(1));
        let (rope_theta, rope_scaling) = f.rope()?;
        let cfg = Self {
            vocab_size: f.usize("vocab_size")?,
            hidden_size,
            intermediate_size: f.usize("intermediate_size")?,
            num_layers: f.usize("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            rope_layout: RopeLayout::HalfSplit,
            context_length: f.usize("max_position_embeddings")?,
            // transformers' default for llama is untied.
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        };
        cfg.validate(path)?;
        Ok(cfg)
    }
}

/// Typed access to config.json fields; errors name file and field.
struct HfFields<'a> {
    path: &'a Path,
    json: &'a Json,
}

impl HfFields<'_> {
    fn err(&self, field: &str, message: String) -> EngineError {
        EngineError::Config {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            message,
        }
    }

    fn get_in<'j>(&self, obj: &'j Json, field: &str) -> Option<&'j Json> {
        obj.get(field).filter(|v| !v.is_null())
    }

    fn usize_in(&self, obj: &Json, prefix: &str, field: &str) -> Result<Option<usize>> {
        match self.get_in(obj, field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(
                        &format!("{prefix}{field}"),
                        format!("expected a non-negative integer, found {v}"),
                    )
                }),
        }
    }

    fn f64_in(&self, obj: &Json, prefix: &str, field: &str) -> Result<Option<f64>> {
        match self.get_in(obj, field) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                self.err(
                    &format!("{prefix}{field}"),
                    format!("expected a number, found {v}"),
                )
            }),
        }
    }

    fn usize(&self, field: &str) -> Result<usize> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing".into()))
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        self.usize_in(self.json, "", field)
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>> {
        self.f64_in(self.json, "", field)
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.get_in(self.json, field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    fn string(&self, field: &str) -> Result<&str> {
        self.opt_string(field)?
            .ok_or_else(|| self.err(field, "missing".into()))
    }

    fn opt_string(&self, field: &str) -> Result<Option<&str>> {
        match self.get_in(self.json, field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`.
    fn rope(&self) -> Result<(f64, RopeScaling)> {
        let (obj, prefix, theta) = if let Some(p) = self.get_in(self.json, "rope_parameters") {
            if !p.is_object() {
                return Err(self.err("rope_parameters", "expected an object".into()));
            }
            let theta = match self.f64_in(p, "rope_parameters.", "rope_theta")? {
                Some(t) => t,
                None => self.opt_f64("rope_theta")?.unwrap_or(10_000.0),
            };
            (Some(p), "rope_parameters.", theta)
        } else {
            let theta = self.opt_f64("rope_theta")?.unwrap_or(10_000.0);
            match self.get_in(self.json, "rope_scaling") {
                None => (None, "", theta),
                Some(s) if s.is_object() => (Some(s), "rope_scaling.", theta),
                Some(_) => {
                    return Err(self.err("rope_scaling", "expected an object or null".into()));
                }
            }
        };
        let Some(obj) = obj else {
            return Ok((theta, RopeScaling::None));
        };
        let kind_field = if obj.get("rope_type").is_some() {
            "rope_type"
        } else {
            "type"
        };
        let kind = match self.get_in(obj, kind_field) {
            None => "default",
            Some(v) => v.as_str().ok_or_else(|| {
                self.err(
                    &format!("{prefix}{kind_field}"),
                    format!("expected a string, found {v}"),
                )
            })?,
        };
        let req_f64 = |field: &str| -> Result<f64> {
            self.f64_in(obj, prefix, field)?.ok_or_else(|| {
                self.err(
                    &format!("{prefix}{field}"),
                    format!("required by `{kind}` RoPE"),
                )
            })
        };
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: req_f64("factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: req_f64("factor")?,
                low_freq_factor: req_f64("low_freq_factor")?,
                high_freq_factor: req_f64("high_freq_factor")?,
                original_max_position_embeddings: self
                    .usize_in(obj, prefix, "original_max_position_embeddings")?
                    .ok_or_else(|| {
                        self.err(
                            &format!("{prefix}original_max_position_embeddings"),
                            "required by `llama3` RoPE".into(),
                        )
                    })?,
            },
            other => {
                return Err(self.err(
                    &format!("{prefix}{kind_field}"),
                    format!("RoPE type `{other}` is not supported (default, linear, llama3)"),
                ));
            }
        };
        if let RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. } = &scaling
            && !(factor.is_finite() && *factor > 0.0)
        {
            return Err(self.err(
                &format!("{prefix}factor"),
                format!("{factor} is not a positive number"),
            ));
        }
        if let RopeScaling::Llama3 {
            low_freq_factor,
            high_freq_factor,
            ..
        } = &scaling
            // Written to reject NaN too: the smoothing divides by the gap.
            && high_freq_factor.partial_cmp(low_freq_factor) != Some(std::cmp::Ordering::Greater)
        {
            return Err(self.err(
                &format!("{prefix}high_freq_factor"),
                format!("{high_freq_factor} must exceed low_freq_factor {low_freq_factor}"),
            ));
        }
        Ok((theta, scaling))
    }
}
