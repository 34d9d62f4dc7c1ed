//! GLM-5.3-Flash (`glm5_next`) hyper-parameters from a Hugging Face
//! `config.json`.
//!
//! Three layouts, as transformers 5.24 reads them: the conditional-generation
//! wrapper (`model_type: glm5_next` with a `text_config` object), the flat
//! text-only form of the same `model_type` (`Glm5NextConfig.__post_init__`
//! forwards top-level fields to the text config) and `glm5_next_text`. The
//! derivations mirror `Glm5NextTextConfig.__post_init__`: the default
//! schedules (`layer_types`: KDA for `i % 4 ≠ 3`; `mlp_layer_types`: three
//! dense layers then sparse; `indexer_types` from `index_topk_pattern` or
//! `index_topk_freq` / `index_skip_topk_offset`), the legacy layer names
//! (`full_attention`, `attention`, `deepseek_sparse_attention`, `mamba`), the
//! `linear_attn_config` dict and `head_dim` forced to `qk_rope_head_dim`.
//!
//! Checks: every one of `validate_architecture` and `validate_layer_type`
//! (heads = kv heads, `index_kpool ≥ 1`, `index_topk` divisible by it,
//! `q_lora_rank` required, NoPE, known layer types, one per layer), plus what
//! transformers only finds when it builds or runs the model — a shared
//! indexer layer must directly follow a full indexed layer, the expert
//! groups must divide the experts, `pad_token_id` must be inside the vocab —
//! and two settings under which transformers' attention stops being causal
//! (an empty top-k set becomes uniform attention over every cached key,
//! future ones included: `index_kpool_always_select_tail = false` or
//! `index_topk = 0`), which are refused rather than imitated. Every error
//! names the file and the field.

use std::path::Path;

use serde_json::Value as Json;

use super::fields::FieldsExt;
use super::schedule::{indexer_kinds, layer_kinds, mlp_kinds};
use crate::error::Result;
use crate::load::config_fields::Fields;

/// A decoder layer's token mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Kimi delta attention (`linear_attention`).
    Kda,
    /// MLA with the DSA indexer (`indexed_attention`).
    Mla,
}

/// A decoder layer's feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpKind {
    Dense,
    Sparse,
}

/// Whether an MLA layer runs its own indexer or reuses the selection of the
/// layer right before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexerKind {
    Full,
    Shared,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Glm5NextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub mlp_kinds: Vec<MlpKind>,
    /// One per layer (meaningful on MLA layers only).
    pub indexer_kinds: Vec<IndexerKind>,
    pub rms_norm_eps: f64,
    pub context_length: usize,
    pub tie_word_embeddings: bool,
    pub eos_token_id: Option<u32>,
    // MLA.
    pub num_heads: usize,
    pub q_lora_rank: usize,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub v_head_dim: usize,
    // DSA indexer.
    pub index_topk: usize,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    /// Tokens per pool (`index_kpool`).
    pub index_pool: usize,
    // KDA.
    pub linear_num_heads: usize,
    pub linear_head_dim: usize,
    pub linear_conv_kernel: usize,
    /// `Some(lb)`: `g = lb·σ(e^A·f)`; `None`: `g = −e^A·softplus(f)`.
    pub linear_lower_bound: Option<f64>,
    // FFN.
    pub intermediate_size: usize,
    pub moe_intermediate_size: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
    pub swiglu_limit: f64,
    // mHC.
    pub hc_mult: usize,
    pub hc_eps: f64,
    /// At least 1 (transformers' `range(iters − 1)` makes 0 act as 1).
    pub hc_sinkhorn_iters: usize,
}

impl Glm5NextConfig {
    /// Parse `config.json` (already read) from `path`.
    pub fn from_hf(path: &Path, json: &Json) -> Result<Self> {
        let top = Fields {
            path,
            json,
            scope: "",
        };
        let model_type = top
            .opt_str("model_type")?
            .ok_or_else(|| top.err("model_type", "missing"))?;
        let (text, scope, top_tie) = match model_type {
            "glm5_next_text" => (json, "", None),
            "glm5_next" => match top.get("text_config") {
                Some(t) if t.is_object() => {
                    (t, "text_config.", top.opt_bool("tie_word_embeddings")?)
                }
                Some(v) => {
                    return Err(top.err("text_config", format!("expected an object, found {v}")));
                }
                // Flat text-only checkpoints keep the text fields at the top.
                None => (json, "", None),
            },
            other => {
                return Err(top.err(
                    "model_type",
                    format!("`{other}` is not a glm5_next model (glm5_next, glm5_next_text)"),
                ));
            }
        };
        let f = Fields {
            path,
            json: text,
            scope,
        };
        parse_text(&f, top_tie)
    }

    /// `index_topk / index_kpool`: complete pools kept per query.
    pub fn pool_topk(&self) -> usize {
        self.index_topk / self.index_pool
    }

    /// `qk_nope_head_dim` (NoPE: the whole query/key head).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim
    }

    /// Whether MLA layer `l`'s selection is reused by layer `l + 1`.
    pub fn forwards_selection(&self, l: usize) -> bool {
        self.indexer_kinds.get(l + 1) == Some(&IndexerKind::Shared)
            && self.layer_kinds.get(l + 1) == Some(&LayerKind::Mla)
    }
}

fn parse_text(f: &Fields<'_>, top_tie: Option<bool>) -> Result<Glm5NextConfig> {
    let num_layers = f.positive_or("num_hidden_layers", 45)?;
    let hidden_size = f.positive_or("hidden_size", 4096)?;
    let vocab_size = f.positive_or("vocab_size", 154_880)?;
    let layer_kinds = layer_kinds(f, num_layers)?;
    let mlp_kinds = mlp_kinds(f, num_layers)?;
    let indexer_kinds = indexer_kinds(f, num_layers, &layer_kinds)?;

    // validate_architecture.
    let num_heads = f.positive_or("num_attention_heads", 64)?;
    let kv_heads = f.usize_or("num_key_value_heads", num_heads)?;
    if kv_heads != num_heads {
        return Err(f.err(
            "num_key_value_heads",
            format!("{kv_heads} must equal num_attention_heads ({num_heads}) in GLM-5 MLA"),
        ));
    }
    let index_pool = f.usize_or("index_kpool", 16)?;
    if index_pool < 1 {
        return Err(f.err("index_kpool", "must be positive, got 0"));
    }
    let index_topk = f.usize_or("index_topk", 2048)?;
    if !index_topk.is_multiple_of(index_pool) {
        return Err(f.err(
            "index_topk",
            format!("{index_topk} must be divisible by index_kpool ({index_pool})"),
        ));
    }
    if f.is_null("q_lora_rank") {
        return Err(f.err(
            "q_lora_rank",
            "required: the DSA indexer reads the query LoRA residual",
        ));
    }
    let q_lora_rank = f.positive_or("q_lora_rank", 1536)?;
    if let Some(r) = f.opt_i64("qk_rope_head_dim")?
        && r != 0
    {
        return Err(f.err(
            "qk_rope_head_dim",
            format!("GLM-5 attention is NoPE: expected 0, got {r}"),
        ));
    }

    // What transformers only finds when it builds or runs the model.
    if f.opt_str("hidden_act")?.unwrap_or("silu") != "silu" {
        return Err(f.err(
            "hidden_act",
            "only silu is supported (it is the SwiGLU and the KDA conv activation)",
        ));
    }
    if f.opt_bool("attention_bias")? == Some(true) {
        return Err(f.err(
            "attention_bias",
            "MLA projections with biases are not supported",
        ));
    }
    if f.opt_bool("index_kpool_always_select_tail")? == Some(false) {
        return Err(f.err(
            "index_kpool_always_select_tail",
            "false is not supported: a query before its first complete pool selects no key, \
             and transformers then attends uniformly to every cached key, future ones included",
        ));
    }
    if index_topk == 0 && layer_kinds.contains(&LayerKind::Mla) {
        return Err(f.err(
            "index_topk",
            "0 is not supported: a query right after a complete pool would select no key",
        ));
    }
    let pad = f.opt_i64("pad_token_id")?.or(if f.is_null("pad_token_id") {
        None
    } else {
        Some(154_820)
    });
    if let Some(p) = pad
        && !(-(vocab_size as i64)..vocab_size as i64).contains(&p)
    {
        return Err(f.err(
            "pad_token_id",
            format!("{p} is outside the embedding table of {vocab_size} rows"),
        ));
    }

    let (experts, groups) = (
        f.positive_or("n_routed_experts", 288)?,
        f.positive_or("n_group", 1)?,
    );
    let (topk_group, k) = (
        f.positive_or("topk_group", 1)?,
        f.positive_or("num_experts_per_tok", 8)?,
    );
    let has_sparse = mlp_kinds.contains(&MlpKind::Sparse);
    if has_sparse {
        if !experts.is_multiple_of(groups) || experts / groups < 2 {
            return Err(f.err(
                "n_group",
                format!("{groups} groups must split {experts} experts into groups of at least 2"),
            ));
        }
        if topk_group > groups {
            return Err(f.err(
                "topk_group",
                format!("{topk_group} exceeds n_group ({groups})"),
            ));
        }
        let reachable = topk_group * (experts / groups);
        if k > reachable {
            return Err(f.err(
                "num_experts_per_tok",
                format!("{k} exceeds the {reachable} experts of the {topk_group} kept groups"),
            ));
        }
    }

    let (head_dim, heads, kernel, lower) = linear_attention(f)?;
    let eos_token_id = match f.get("eos_token_id") {
        None => None,
        Some(Json::Array(a)) => a.first().and_then(|v| v.as_u64()).map(|v| v as u32),
        Some(v) => Some(
            v.as_u64()
                .map(|x| x as u32)
                .ok_or_else(|| f.err("eos_token_id", format!("expected an integer, found {v}")))?,
        ),
    };
    let rms_norm_eps = f.finite_or("rms_norm_eps", 1e-5)?;
    if rms_norm_eps < 0.0 {
        return Err(f.err("rms_norm_eps", format!("{rms_norm_eps} is negative")));
    }
    Ok(Glm5NextConfig {
        vocab_size,
        hidden_size,
        num_layers,
        layer_kinds,
        mlp_kinds,
        indexer_kinds,
        rms_norm_eps,
        context_length: f.positive_or("max_position_embeddings", 1_048_576)?,
        tie_word_embeddings: match top_tie {
            Some(t) => t,
            None => f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        },
        eos_token_id,
        num_heads,
        q_lora_rank,
        kv_lora_rank: f.positive_or("kv_lora_rank", 512)?,
        qk_nope_head_dim: f.positive_or("qk_nope_head_dim", 256)?,
        v_head_dim: f.positive_or("v_head_dim", 256)?,
        index_topk,
        index_n_heads: f.positive_or("index_n_heads", 32)?,
        index_head_dim: f.positive_or("index_head_dim", 128)?,
        index_pool,
        linear_num_heads: heads,
        linear_head_dim: head_dim,
        linear_conv_kernel: kernel,
        linear_lower_bound: lower,
        intermediate_size: f.positive_or("intermediate_size", 12_288)?,
        moe_intermediate_size: f.positive_or("moe_intermediate_size", 2048)?,
        n_routed_experts: experts,
        n_shared_experts: f.positive_or("n_shared_experts", 1)?,
        num_experts_per_tok: k,
        n_group: groups,
        topk_group,
        norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(true),
        routed_scaling_factor: f.finite_or("routed_scaling_factor", 2.5)?,
        swiglu_limit: f.finite_or("swiglu_limit", 10.0)?,
        hc_mult: f.positive_or("hc_mult", 4)?,
        hc_eps: f.finite_or("hc_eps", 1e-6)?,
        hc_sinkhorn_iters: f.usize_or("hc_sinkhorn_iters", 20)?.max(1),
    })
}

/// KDA sizes and the gate form, with `linear_attn_config` overriding the
/// flat fields (its `safe_gate`, default true, restores the −5 bound).
fn linear_attention(f: &Fields<'_>) -> Result<(usize, usize, usize, Option<f64>)> {
    let mut head_dim = f.positive_or("linear_head_dim", 128)?;
    let mut heads = f.positive_or("linear_num_heads", 64)?;
    let mut kernel = f.positive_or("linear_conv_kernel_dim", 4)?;
    let mut lower = if f.is_null("linear_lower_bound") {
        None
    } else {
        Some(f.finite_or("linear_lower_bound", -5.0)?)
    };
    if let Some(d) = f.get("linear_attn_config") {
        let sub = Fields {
            path: f.path,
            json: d,
            scope: if f.scope.is_empty() {
                "linear_attn_config."
            } else {
                "text_config.linear_attn_config."
            },
        };
        if !d.is_object() {
            return Err(f.err(
                "linear_attn_config",
                format!("expected an object, found {d}"),
            ));
        }
        head_dim = sub.positive_or("head_dim", head_dim)?;
        heads = sub.positive_or("num_heads", heads)?;
        kernel = sub.positive_or("short_conv_kernel_size", kernel)?;
        if d.get("gate_lower_bound").is_some() {
            lower = sub.opt_f64("gate_lower_bound")?;
        }
        if sub.opt_bool("safe_gate")?.unwrap_or(true) && lower.is_none() {
            lower = Some(-5.0);
        }
    }
    if let Some(lb) = lower
        && !lb.is_finite()
    {
        return Err(f.err("linear_lower_bound", format!("{lb} is not finite")));
    }
    Ok((head_dim, heads, kernel, lower))
}
