//! antirez/ds4's GGUF files of DeepSeek-V4-Flash (`general.architecture`
//! `deepseek4`), loaded unchanged: the configuration from the `deepseek4.*`
//! keys ds4's `config_validate_model` reads, and [`Ds4GgufSource`], a
//! [`WeightSource`] that serves the upstream names the family binds
//! (`layers.L.attn.wq_a.weight`, `layers.L.ffn.experts.E.w1.weight`,
//! `hc_head_fn`, `mtp.0.*`) from ds4's tensors (`blk.L.attn_q_a.weight`,
//! `blk.L.ffn_gate_exps.weight`, `output_hc_fn.weight`, `mtp.0.*`).
//!
//! The layout (`docs/GGUF-LAYOUTS.md`, from ds4 @ 8d57664 `ds4.c`
//! `weights_bind` / `mtp_weights_bind` and `gguf-tools/deepseek4-quantize.c`
//! `top_map` / `layer_map`): one GGUF tensor per upstream tensor, no
//! transposition or fusion (GGUF's `ne` is the upstream shape reversed, so
//! the row-major dims are the upstream ones), except the routed experts:
//! one `[E, out, in]` stack per projection, whose expert `e` is served as
//! the row view `e·out .. (e+1)·out` (no copy, in its stored type).
//! Stored types pass through as read ([`HostWeight::Quant`]); ds4's types
//! per group are not enforced (any type the engine reads is accepted), the
//! shapes are.
//!
//! Strict accounting: [`Ds4GgufSource::finish`] refuses a tensor of either
//! file that nothing bound, and an expert stack some of whose experts were
//! never bound. Errors name the file and the GGUF tensor, with the upstream
//! name it was bound as.
//!
//! The MTP head lives in a second GGUF (ds4's `--mtp FILE`, e.g.
//! `DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf`): tensors `mtp.0.*`, no
//! metadata read (ds4 reads none), the trunk's embedding and output head
//! shared. It is never looked for: pass it to
//! [`DeepseekV4Model::load_gguf`] or attach it with
//! [`DeepseekV4Model::attach_mtp_gguf`] (`LoadedModel::attach_mtp_head`,
//! what the CLI's `DS4_MTP_HEAD=FILE` calls).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Tensor;
use candle_core::quantized::gguf_file::Value;

use super::config::{AttnKind, DeepseekV4Config, MlpKind, RopeSpec};
use super::model::DeepseekV4Model;
use crate::backend::{Backend, CpuOps, HostWeight};
use crate::error::{EngineError, Result};
use crate::layers::rope::RopeScaling;
use crate::load::binder::WeightSource;
use crate::load::gguf::{GgufFile, value_as_f64, value_as_usize};
use crate::quant::QuantTensor;

/// ds4's `general.architecture` (the prefix of every key it reads).
pub const GGUF_ARCHITECTURE: &str = "deepseek4";

/// ds4 finds the end-of-sequence token by its text.
const EOS_TEXT: &str = "<｜end▁of▁sentence｜>";

/// The compression ratio ds4 gives CSA layers (`ratio == 4`: the lightning
/// indexer and the overlapping compressor); every other non-zero ratio is
/// HCA.
const CSA_RATIO: usize = 4;

impl DeepseekV4Config {
    /// The configuration of ds4's GGUF `g`, from the keys ds4 reads (every
    /// one it requires is required here; errors name the key).
    ///
    /// ds4 accepts only the Flash numbers; this accepts any consistent
    /// shape, and refuses what the family cannot compute: more than one KV
    /// head, `value_length` ≠ `key_length`, shared experts other than one,
    /// group-limited routing, `expert_weights_norm` false, per-layer SwiGLU
    /// clamps that differ. Fixed by ds4's code and so not in the metadata:
    /// sqrt-softplus scores, YaRN (attention factor 1) on the compressed
    /// layers only, untied embeddings.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let key = |k: &str| format!("{GGUF_ARCHITECTURE}.{k}");
        let err = |k: &str, message: String| EngineError::Config {
            path: g.path().to_path_buf(),
            field: key(k),
            message,
        };
        let u = |k: &str| g.usize(&key(k));
        let f = |k: &str| g.f64(&key(k));
        let positive = |k: &str| -> Result<usize> {
            match u(k)? {
                0 => Err(err(k, "must be positive".into())),
                v => Ok(v),
            }
        };

        if let Some(arch) = g.opt_string("general.architecture")?
            && arch != GGUF_ARCHITECTURE
        {
            return Err(EngineError::Config {
                path: g.path().to_path_buf(),
                field: "general.architecture".into(),
                message: format!("`{arch}` is not ds4's DeepSeek-V4 (`{GGUF_ARCHITECTURE}`)"),
            });
        }

        let n = positive("block_count")?;
        let hidden_size = positive("embedding_length")?;
        let vocab_size = positive("vocab_size")?;
        let num_heads = positive("attention.head_count")?;
        let kv_heads = u("attention.head_count_kv")?;
        if kv_heads != 1 {
            return Err(err(
                "attention.head_count_kv",
                format!("DeepSeek-V4 attention has one shared K=V head, not {kv_heads}"),
            ));
        }
        let head_dim = positive("attention.key_length")?;
        let value_dim = u("attention.value_length")?;
        if value_dim != head_dim {
            return Err(err(
                "attention.value_length",
                format!(
                    "the shared K=V head needs key_length ({head_dim}) = value_length ({value_dim})"
                ),
            ));
        }
        let rope_dim = positive("rope.dimension_count")?;
        if rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(err(
                "rope.dimension_count",
                format!(
                    "{rope_dim} rotated dims of a {head_dim}-dim head (needs an even number in 2..={head_dim})"
                ),
            ));
        }
        let q_lora_rank = positive("attention.q_lora_rank")?;
        let o_lora_rank = positive("attention.output_lora_rank")?;
        let o_groups = positive("attention.output_group_count")?;
        if num_heads % o_groups != 0 {
            return Err(err(
                "attention.output_group_count",
                format!("{num_heads} heads do not split into {o_groups} groups"),
            ));
        }
        let n_routed_experts = positive("expert_count")?;
        let num_experts_per_tok = positive("expert_used_count")?;
        if num_experts_per_tok > n_routed_experts {
            return Err(err(
                "expert_used_count",
                format!("{num_experts_per_tok} experts per token of {n_routed_experts}"),
            ));
        }
        let moe_intermediate_size = positive("expert_feed_forward_length")?;
        let shared = u("expert_shared_count")?;
        if shared != 1 {
            return Err(err(
                "expert_shared_count",
                format!("DeepSeek-V4 has one shared expert, not {shared}"),
            ));
        }
        let hash_layers = u("hash_layer_count")?;
        if hash_layers > n {
            return Err(err(
                "hash_layer_count",
                format!("{hash_layers} hash layers of {n}"),
            ));
        }
        for k in ["expert_group_count", "expert_group_used_count"] {
            if let Some(v) = g.opt_usize(&key(k))?
                && v != 0
            {
                return Err(err(
                    k,
                    format!(
                        "group-limited routing is not DeepSeek-V4's (ds4 requires 0, found {v})"
                    ),
                ));
            }
        }
        let sliding_window = u("attention.sliding_window")?;
        if sliding_window < 2 {
            return Err(err("attention.sliding_window", "must be at least 2".into()));
        }
        let index_n_heads = positive("attention.indexer.head_count")?;
        let index_head_dim = positive("attention.indexer.key_length")?;
        let index_topk = positive("attention.indexer.top_k")?;
        let hc_mult = positive("hyper_connection.count")?;
        let hc_sinkhorn_iters = positive("hyper_connection.sinkhorn_iterations")?;

        // Per-layer arrays: ds4 reads the first `block_count` entries.
        let array = |k: &str| -> Result<&[Value]> {
            match g.get(&key(k)) {
                Some(Value::Array(a)) if a.len() >= n => Ok(&a[..n]),
                Some(Value::Array(a)) => Err(err(k, format!("{} entries for {n} layers", a.len()))),
                Some(_) => Err(err(k, "expected an array".into())),
                None => Err(err(k, "missing metadata key".into())),
            }
        };
        let ratios = array("attention.compress_ratios")?
            .iter()
            .map(|v| {
                value_as_usize(v).ok_or_else(|| {
                    err(
                        "attention.compress_ratios",
                        "expected non-negative integers".into(),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let attn: Vec<AttnKind> = ratios
            .iter()
            .map(|&r| match r {
                0 => AttnKind::Sliding,
                CSA_RATIO => AttnKind::Csa,
                _ => AttnKind::Hca,
            })
            .collect();
        let mut hca_rates = ratios.iter().filter(|&&r| r != 0 && r != CSA_RATIO);
        let hca_rate = hca_rates.next().copied().unwrap_or(128);
        if let Some(other) = hca_rates.find(|&&r| r != hca_rate) {
            return Err(err(
                "attention.compress_ratios",
                format!(
                    "HCA layers with ratios {hca_rate} and {other} (one HCA ratio is supported)"
                ),
            ));
        }
        if attn.contains(&AttnKind::Csa) && index_head_dim < rope_dim {
            return Err(err(
                "attention.indexer.key_length",
                format!("the indexer rotates {rope_dim} dims of each {index_head_dim}-dim head"),
            ));
        }
        let clamps = array("swiglu_clamp_exp")?
            .iter()
            .map(|v| {
                value_as_f64(v).ok_or_else(|| err("swiglu_clamp_exp", "expected numbers".into()))
            })
            .collect::<Result<Vec<_>>>()?;
        let swiglu_limit = clamps[0];
        if let Some(other) = clamps.iter().find(|&&c| c != swiglu_limit) {
            return Err(err(
                "swiglu_clamp_exp",
                format!("layers clamp at {swiglu_limit} and {other} (one clamp is supported)"),
            ));
        }

        let original = positive("rope.scaling.original_context_length")?;
        let factor = f("rope.scaling.factor")?;
        if factor < 1.0 {
            return Err(err(
                "rope.scaling.factor",
                format!("YaRN needs a factor >= 1, not {factor}"),
            ));
        }
        let main_rope = RopeSpec {
            theta: f("rope.freq_base")?,
            scaling: RopeScaling::None,
            attention_factor: 1.0,
        };
        let compress_rope = RopeSpec {
            theta: f("attention.compress_rope_freq_base")?,
            scaling: RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: f("rope.scaling.yarn_beta_fast")?,
                beta_slow: f("rope.scaling.yarn_beta_slow")?,
            },
            attention_factor: 1.0,
        };
        let routed_scaling_factor = f("expert_weights_scale")? as f32;
        let rms_norm_eps = f("attention.layer_norm_rms_epsilon")? as f32;
        let hc_eps = f("hyper_connection.epsilon")? as f32;
        match g.get(&key("expert_weights_norm")) {
            Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                return Err(err(
                    "expert_weights_norm",
                    "DeepSeek-V4 renormalises the routing weights (ds4 requires true)".into(),
                ));
            }
            Some(_) => return Err(err("expert_weights_norm", "expected a bool".into())),
            None => return Err(err("expert_weights_norm", "missing metadata key".into())),
        }
        let context_length = match g.opt_usize(&key("context_length"))? {
            Some(0) => return Err(err("context_length", "must be positive".into())),
            Some(c) => c,
            None => 1 << 20,
        };
        let eos_token_id = match g.opt_usize("tokenizer.ggml.eos_token_id")? {
            Some(id) => Some(id as u32),
            None => match g.get("tokenizer.ggml.tokens") {
                Some(Value::Array(tokens)) => tokens
                    .iter()
                    .position(|t| matches!(t, Value::String(s) if s == EOS_TEXT))
                    .map(|i| i as u32),
                _ => None,
            },
        };
        Ok(Self {
            vocab_size,
            hidden_size,
            num_layers: n,
            attn,
            mlp: (0..n)
                .map(|l| {
                    if l < hash_layers {
                        MlpKind::Hash
                    } else {
                        MlpKind::TopK
                    }
                })
                .collect(),
            rms_norm_eps,
            eos_token_id,
            tie_word_embeddings: false,
            context_length,
            num_heads,
            head_dim,
            q_lora_rank,
            rope_dim,
            main_rope,
            compress_rope,
            sliding_window,
            csa_rate: CSA_RATIO,
            hca_rate,
            o_groups,
            o_lora_rank,
            index_n_heads,
            index_head_dim,
            index_topk,
            n_routed_experts,
            num_experts_per_tok,
            moe_intermediate_size,
            routed_scaling_factor,
            sigmoid_scoring: false,
            swiglu_limit: swiglu_limit as f32,
            hc_mult,
            hc_sinkhorn_iters,
            hc_eps,
        })
    }
}

/// Upstream name under `layers.L.` / `mtp.0.` → ds4's name under `blk.L.` /
/// `mtp.0.` (`deepseek4-quantize.c` `layer_map`). The KV norm is bound as
/// `attn.norm.weight` (transformers' saved name, what the family binds);
/// ds4's table reads DeepSeek's `attn.kv_norm.weight`; both map here.
pub const LAYER_MAP: &[(&str, &str)] = &[
    ("hc_attn_base", "hc_attn_base.weight"),
    ("hc_attn_fn", "hc_attn_fn.weight"),
    ("hc_attn_scale", "hc_attn_scale.weight"),
    ("hc_ffn_base", "hc_ffn_base.weight"),
    ("hc_ffn_fn", "hc_ffn_fn.weight"),
    ("hc_ffn_scale", "hc_ffn_scale.weight"),
    ("attn.attn_sink", "attn_sinks.weight"),
    ("attn.wq_a.weight", "attn_q_a.weight"),
    ("attn.wq_b.weight", "attn_q_b.weight"),
    ("attn.q_norm.weight", "attn_q_a_norm.weight"),
    ("attn.wkv.weight", "attn_kv.weight"),
    ("attn.norm.weight", "attn_kv_a_norm.weight"),
    ("attn.kv_norm.weight", "attn_kv_a_norm.weight"),
    ("attn.wo_a.weight", "attn_output_a.weight"),
    ("attn.wo_b.weight", "attn_output_b.weight"),
    ("attn.compressor.ape", "attn_compressor_ape.weight"),
    ("attn.compressor.wkv.weight", "attn_compressor_kv.weight"),
    (
        "attn.compressor.wgate.weight",
        "attn_compressor_gate.weight",
    ),
    ("attn.compressor.norm.weight", "attn_compressor_norm.weight"),
    ("attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"),
    ("attn.indexer.weights_proj.weight", "indexer.proj.weight"),
    (
        "attn.indexer.compressor.ape",
        "indexer_compressor_ape.weight",
    ),
    (
        "attn.indexer.compressor.wkv.weight",
        "indexer_compressor_kv.weight",
    ),
    (
        "attn.indexer.compressor.wgate.weight",
        "indexer_compressor_gate.weight",
    ),
    (
        "attn.indexer.compressor.norm.weight",
        "indexer_compressor_norm.weight",
    ),
    ("attn_norm.weight", "attn_norm.weight"),
    ("ffn_norm.weight", "ffn_norm.weight"),
    ("ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"),
    ("ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"),
    ("ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"),
    ("ffn.gate.weight", "ffn_gate_inp.weight"),
    ("ffn.gate.bias", "exp_probs_b.bias"),
    ("ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"),
];

/// Top-level upstream name → ds4's (`top_map`).
pub const TOP_MAP: &[(&str, &str)] = &[
    ("embed.weight", "token_embd.weight"),
    ("norm.weight", "output_norm.weight"),
    ("head.weight", "output.weight"),
    ("hc_head_base", "output_hc_base.weight"),
    ("hc_head_fn", "output_hc_fn.weight"),
    ("hc_head_scale", "output_hc_scale.weight"),
];

/// The MTP head's own tensors under `mtp.0.` (ds4's `mtp_weights_bind`).
pub const MTP_MAP: &[(&str, &str)] = &[
    ("e_proj.weight", "e_proj.weight"),
    ("h_proj.weight", "h_proj.weight"),
    ("enorm.weight", "enorm.weight"),
    ("hnorm.weight", "hnorm.weight"),
    ("norm.weight", "norm.weight"),
    ("hc_head_base", "hc_head_base.weight"),
    ("hc_head_fn", "hc_head_fn.weight"),
    ("hc_head_scale", "hc_head_scale.weight"),
];

/// Routed expert projection → ds4's stack. (These four tables are also
/// what `ds4server quantize` writes ds4's layout with.)
pub const EXPERT_MAP: &[(&str, &str)] = &[
    ("w1.weight", "ffn_gate_exps.weight"),
    ("w3.weight", "ffn_up_exps.weight"),
    ("w2.weight", "ffn_down_exps.weight"),
];

/// Which of the two files holds a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Main,
    Mtp,
}

/// Where an upstream tensor lives in ds4's files.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    part: Part,
    name: String,
    /// Expert `e` of a `[E, out, in]` stack.
    expert: Option<usize>,
}

fn lookup<'a>(map: &[(&str, &'a str)], name: &str) -> Option<&'a str> {
    map.iter().find(|(up, _)| *up == name).map(|(_, g)| *g)
}

/// ds4's tensor for the upstream name `upstream`, if it has one.
fn target(upstream: &str) -> Option<Target> {
    let plain = |part, name: String| Target {
        part,
        name,
        expert: None,
    };
    if let Some(g) = lookup(TOP_MAP, upstream) {
        return Some(plain(Part::Main, g.to_string()));
    }
    let block = |rest: &str, prefix: &str, part: Part| -> Option<Target> {
        if let Some(x) = rest.strip_prefix("ffn.experts.") {
            let (e, proj) = x.split_once('.')?;
            if e.is_empty()
                || !e.bytes().all(|b| b.is_ascii_digit())
                || (e.len() > 1 && e.starts_with('0'))
            {
                return None;
            }
            return Some(Target {
                part,
                name: format!("{prefix}{}", lookup(EXPERT_MAP, proj)?),
                expert: Some(e.parse().ok()?),
            });
        }
        Some(plain(part, format!("{prefix}{}", lookup(LAYER_MAP, rest)?)))
    };
    if let Some(rest) = upstream.strip_prefix("layers.") {
        let (l, rest) = rest.split_once('.')?;
        if l.is_empty()
            || !l.bytes().all(|b| b.is_ascii_digit())
            || (l.len() > 1 && l.starts_with('0'))
        {
            return None;
        }
        return block(rest, &format!("blk.{l}."), Part::Main);
    }
    if let Some(rest) = upstream.strip_prefix("mtp.0.") {
        if let Some(g) = lookup(MTP_MAP, rest) {
            return Some(plain(Part::Mtp, format!("mtp.0.{g}")));
        }
        return block(rest, "mtp.0.", Part::Mtp);
    }
    None
}

/// A routed expert stack read once; the experts bound so far.
struct Stack {
    tensor: Arc<QuantTensor>,
    taken: Vec<bool>,
}

/// ds4's trunk GGUF and/or its MTP GGUF as a [`WeightSource`] of upstream
/// names (see the module docs).
pub struct Ds4GgufSource {
    main: Option<GgufFile>,
    mtp: Option<GgufFile>,
    n_experts: usize,
    stacks: BTreeMap<(Part, String), Stack>,
}

impl Ds4GgufSource {
    /// The trunk file `main` and the MTP file `mtp` (either may be absent),
    /// for a model of `n_experts` routed experts per layer.
    pub fn new(main: Option<GgufFile>, mtp: Option<GgufFile>, n_experts: usize) -> Self {
        Self {
            main,
            mtp,
            n_experts,
            stacks: BTreeMap::new(),
        }
    }

    fn file(&self, part: Part) -> Option<&GgufFile> {
        match part {
            Part::Main => self.main.as_ref(),
            Part::Mtp => self.mtp.as_ref(),
        }
    }

    fn any_path(&self) -> PathBuf {
        self.main
            .as_ref()
            .or(self.mtp.as_ref())
            .map(|g| g.path().to_path_buf())
            .unwrap_or_default()
    }

    fn target(&self, upstream: &str) -> Result<Target> {
        let t = target(upstream).ok_or_else(|| EngineError::Tensor {
            path: self.any_path(),
            tensor: upstream.to_string(),
            message: "no tensor of ds4's DeepSeek-V4 GGUF layout maps to this name".into(),
        })?;
        if self.file(t.part).is_none() {
            return Err(EngineError::Tensor {
                path: self.any_path(),
                tensor: t.name,
                message: format!(
                    "bound as `{upstream}`: it lives in ds4's {} GGUF, which was not given",
                    match t.part {
                        Part::Main => "main",
                        Part::Mtp => "MTP",
                    }
                ),
            });
        }
        Ok(t)
    }

    /// Every tensor of both files bound, every expert of every stack bound.
    pub fn finish(&self) -> Result<()> {
        for ((part, name), st) in &self.stacks {
            let missing: Vec<usize> = (0..st.taken.len()).filter(|&e| !st.taken[e]).collect();
            if !missing.is_empty() {
                return Err(EngineError::Tensor {
                    path: self
                        .file(*part)
                        .map(|g| g.path().to_path_buf())
                        .unwrap_or_default(),
                    tensor: name.clone(),
                    message: format!("experts {missing:?} of the stack were never bound"),
                });
            }
        }
        for g in [&self.main, &self.mtp].into_iter().flatten() {
            g.finish()?;
        }
        Ok(())
    }
}

/// A file error about a GGUF tensor, with the upstream name it was bound as.
fn bound_as(e: EngineError, upstream: &str) -> EngineError {
    match e {
        EngineError::Tensor {
            path,
            tensor,
            message,
        } if tensor != upstream => EngineError::Tensor {
            path,
            tensor,
            message: format!("{message} (bound as `{upstream}`)"),
        },
        other => other,
    }
}

impl WeightSource for Ds4GgufSource {
    fn file_of(&self, name: &str) -> PathBuf {
        target(name)
            .and_then(|t| self.file(t.part))
            .map(|g| g.path().to_path_buf())
            .unwrap_or_else(|| self.any_path())
    }

    fn has(&self, name: &str) -> bool {
        let Some(t) = target(name) else {
            return false;
        };
        let Some(g) = self.file(t.part) else {
            return false;
        };
        match (t.expert, g.tensor_dims(&t.name)) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(e), Some(dims)) => dims.len() == 3 && e < dims[0],
        }
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        let t = self.target(name)?;
        let Some(e) = t.expert else {
            let g = match t.part {
                Part::Main => self.main.as_mut(),
                Part::Mtp => self.mtp.as_mut(),
            }
            .expect("checked by target()");
            let q = g
                .tensor(&t.name, shape)
                .map_err(|err| bound_as(err, name))?;
            return Ok(HostWeight::Quant(Arc::new(q)));
        };
        let path = self.file_of(name);
        let wrong = |message: String| EngineError::Tensor {
            path: path.clone(),
            tensor: t.name.clone(),
            message: format!("{message} (bound as `{name}`)"),
        };
        let &[out, inp] = shape else {
            return Err(wrong(format!("an expert is a matrix, not {shape:?}")));
        };
        let key = (t.part, t.name.clone());
        if !self.stacks.contains_key(&key) {
            let n = self.n_experts;
            let g = match t.part {
                Part::Main => self.main.as_mut(),
                Part::Mtp => self.mtp.as_mut(),
            }
            .expect("checked by target()");
            let q = g
                .tensor(&t.name, &[n, out, inp])
                .map_err(|err| bound_as(err, name))?;
            self.stacks.insert(
                key.clone(),
                Stack {
                    tensor: Arc::new(q),
                    taken: vec![false; n],
                },
            );
        }
        let st = self.stacks.get_mut(&key).expect("inserted above");
        if st.tensor.dims[1..] != [out, inp] {
            return Err(wrong(format!(
                "wrong shape: experts of {:?}, expected [{out}, {inp}]",
                &st.tensor.dims[1..]
            )));
        }
        if e >= st.taken.len() {
            return Err(wrong(format!(
                "expert {e} of a stack of {}",
                st.taken.len()
            )));
        }
        if st.taken[e] {
            return Err(wrong(format!("expert {e} bound twice")));
        }
        st.taken[e] = true;
        Ok(HostWeight::Quant(Arc::new(
            st.tensor.row_range(e * out, (e + 1) * out),
        )))
    }

    fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.read(name, shape)?.to_f32()
    }

    fn ignore(&mut self, _name: &str) {}

    fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        let t = self.target(name)?;
        let g = match t.part {
            Part::Main => self.main.as_mut(),
            Part::Mtp => self.mtp.as_mut(),
        }
        .expect("checked by target()");
        g.ids(&t.name, shape).map_err(|err| bound_as(err, name))
    }
}

impl DeepseekV4Model<CpuOps> {
    /// Load ds4's GGUF on the CPU, without an MTP head (see
    /// [`Self::load_gguf`]).
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::load_gguf(path, None, CpuOps)
    }
}

impl<B: Backend> DeepseekV4Model<B> {
    /// Load ds4's trunk GGUF `path` onto `ops`, with the MTP head of ds4's
    /// MTP GGUF `mtp` when given (ds4's `-m FILE --mtp FILE`). Every tensor
    /// of both files must be bound.
    pub fn load_gguf(path: &Path, mtp: Option<&Path>, ops: B) -> Result<Self> {
        let main = GgufFile::open(path)?;
        let cfg = DeepseekV4Config::from_gguf(&main)?;
        let mtp = mtp.map(GgufFile::open).transpose()?;
        let with_mtp = mtp.is_some();
        let mut src = Ds4GgufSource::new(Some(main), mtp, cfg.n_routed_experts);
        let model = Self::load_from(&mut src, cfg, false, with_mtp, ops)?;
        src.finish()?;
        Ok(model)
    }

    /// Attach the MTP head of ds4's MTP GGUF `path` (replacing any the
    /// model has). A file that does not fit, or has tensors the head does
    /// not bind, is refused and the model stays as it was.
    pub fn attach_mtp_gguf(&mut self, path: &Path) -> Result<()> {
        let g = GgufFile::open(path)?;
        let mut src = Ds4GgufSource::new(None, Some(g), self.config().n_routed_experts);
        let head = self.bind_mtp(&mut src)?;
        src.finish()?;
        self.set_mtp(head);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> Option<(Part, String, Option<usize>)> {
        target(name).map(|t| (t.part, t.name, t.expert))
    }

    #[test]
    fn upstream_names_map_to_ds4s() {
        let main = |n: &str| Some((Part::Main, n.to_string(), None));
        assert_eq!(t("embed.weight"), main("token_embd.weight"));
        assert_eq!(t("hc_head_fn"), main("output_hc_fn.weight"));
        assert_eq!(
            t("layers.12.attn.wq_a.weight"),
            main("blk.12.attn_q_a.weight")
        );
        assert_eq!(
            t("layers.0.attn.norm.weight"),
            main("blk.0.attn_kv_a_norm.weight")
        );
        assert_eq!(
            t("layers.0.attn.kv_norm.weight"),
            main("blk.0.attn_kv_a_norm.weight")
        );
        assert_eq!(
            t("layers.3.attn.indexer.compressor.wgate.weight"),
            main("blk.3.indexer_compressor_gate.weight")
        );
        assert_eq!(t("layers.1.ffn.gate.bias"), main("blk.1.exp_probs_b.bias"));
        assert_eq!(
            t("layers.42.ffn.experts.255.w3.weight"),
            Some((Part::Main, "blk.42.ffn_up_exps.weight".into(), Some(255)))
        );
        assert_eq!(
            t("mtp.0.hc_head_scale"),
            Some((Part::Mtp, "mtp.0.hc_head_scale.weight".into(), None))
        );
        assert_eq!(
            t("mtp.0.attn.wkv.weight"),
            Some((Part::Mtp, "mtp.0.attn_kv.weight".into(), None))
        );
        assert_eq!(
            t("mtp.0.ffn.experts.7.w2.weight"),
            Some((Part::Mtp, "mtp.0.ffn_down_exps.weight".into(), Some(7)))
        );
        for bad in [
            "model.embed_tokens.weight",
            "layers.01.attn_norm.weight",
            "layers.0.ffn.experts.gate_up_proj",
            "layers.0.ffn.experts.1.w4.weight",
            "mtp.1.e_proj.weight",
            "layers.x.attn_norm.weight",
        ] {
            assert_eq!(t(bad), None, "{bad}");
        }
    }
}
