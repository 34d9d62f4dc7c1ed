//! A synthetic weight source: random weights at a family's real
//! configuration, for benchmarks of models too large to ship (the full
//! `qwen4_exp` is ~65 GB at 4 bits). It sits behind the same
//! [`WeightSource`] contract as a checkpoint, so the family's own loader
//! binds it, with every shape check.
//!
//! Every tensor is a pure function of (seed, tensor name, element index)
//! through a counter-based hash ([`hash64`], SplitMix64's finaliser), so
//! the weights are identical however and wherever they are materialised:
//! projections are Q4_1 blocks ([`SyntheticWeight`], kept as a description
//! until a backend places them: the CPU expands them on the host, CUDA
//! fills them on the device with the same hash, so nothing expert-sized
//! crosses PCIe), small parameters are f32 near zero (zero-centred norms
//! then scale by ~1), and the qwen4_exp n-gram table is generated row by
//! row when gathered ([`SyntheticSource::seed_of`]).
//!
//! Scales: a Q4_1 weight is `u·d + m`, `u` uniform in 0..16, `m = −7.5·d`,
//! so its variance is `d²·255/12`; `d = 1/sqrt(in·255/12)` keeps a row's
//! output at the input's scale, and activations stay finite over 48 layers.
//!
//! [`stored`] makes weights in a checkpoint's real stored types instead
//! (DeepSeek-V4-Flash and GLM-5.3-Flash in antirez/ds4's q2 / q4 recipes),
//! on the host.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::binder::WeightSource;
use crate::backend::HostWeight;
use crate::error::{EngineError, Result};
use crate::quant::{QuantTensor, WeightBytes, WeightType};

#[path = "synthetic_stored.rs"]
pub mod stored;

/// SplitMix64's output for counter `i` of stream `seed`.
pub fn hash64(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform value in [−1, 1) from counter `i` of stream `seed`.
pub fn uniform(seed: u64, i: u64) -> f32 {
    ((hash64(seed, i) >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
}

/// The stream of tensor `name` under the global `seed` (FNV-1a of the name,
/// mixed with the seed).
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    hash64(seed, h)
}

/// How a synthetic tensor's values are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SynthForm {
    /// GGUF Q4_1 blocks: f16 scale `d` and minimum `m` (bits), the same for
    /// every block; quants `hash64(seed, 2b)`, `hash64(seed, 2b + 1)`
    /// little-endian (block `b`'s 16 bytes).
    Q4_1 { d: u16, m: u16 },
    /// f32 `amp·uniform(seed, i)`.
    F32 { amp: f32 },
}

/// A weight described, not yet materialised.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticWeight {
    pub seed: u64,
    pub dims: Vec<usize>,
    pub form: SynthForm,
}

impl SyntheticWeight {
    /// Q4_1 with the variance-preserving scale for rows of `inp` values.
    pub fn q4_1(seed: u64, dims: Vec<usize>) -> Self {
        let inp = *dims.last().unwrap_or(&1) as f32;
        let d = 1.0 / (inp * 255.0 / 12.0).sqrt();
        let d16 = half::f16::from_f32(d);
        let m16 = half::f16::from_f32(-7.5 * d16.to_f32());
        Self {
            seed,
            dims,
            form: SynthForm::Q4_1 {
                d: d16.to_bits(),
                m: m16.to_bits(),
            },
        }
    }

    pub fn elements(&self) -> usize {
        self.dims.iter().product()
    }

    /// Bytes as a backend keeps it (Q4_1: 20 per 32 values; f32: 4).
    pub fn bytes(&self) -> usize {
        match self.form {
            SynthForm::Q4_1 { .. } => self.elements() / 32 * 20,
            SynthForm::F32 { .. } => self.elements() * 4,
        }
    }

    /// The GGUF bytes of a Q4_1 weight (empty for f32).
    pub fn q4_1_data(&self) -> Vec<u8> {
        let SynthForm::Q4_1 { d, m } = self.form else {
            return Vec::new();
        };
        let blocks = self.elements() / 32;
        let mut out = Vec::with_capacity(blocks * 20);
        for b in 0..blocks as u64 {
            out.extend_from_slice(&d.to_le_bytes());
            out.extend_from_slice(&m.to_le_bytes());
            out.extend_from_slice(&hash64(self.seed, 2 * b).to_le_bytes());
            out.extend_from_slice(&hash64(self.seed, 2 * b + 1).to_le_bytes());
        }
        out
    }

    /// Materialised on the host: a Q4_1 GGUF tensor or an f32 tensor.
    pub fn to_host(&self) -> Result<HostWeight> {
        match self.form {
            SynthForm::Q4_1 { .. } => {
                let q = QuantTensor::new(
                    WeightType::Q4_1,
                    self.dims.clone(),
                    WeightBytes::owned(self.q4_1_data()),
                    None,
                )
                .map_err(|e| EngineError::State(format!("synthetic Q4_1: {e}")))?;
                Ok(HostWeight::Quant(Arc::new(q)))
            }
            SynthForm::F32 { .. } => Ok(HostWeight::F32(self.to_f32()?)),
        }
    }

    /// The values as an f32 host tensor (Q4_1 dequantized as GGUF defines).
    pub fn to_f32(&self) -> Result<Tensor> {
        match self.form {
            SynthForm::F32 { amp } => {
                let v: Vec<f32> = (0..self.elements() as u64)
                    .map(|i| amp * uniform(self.seed, i))
                    .collect();
                Ok(Tensor::from_vec(v, self.dims.clone(), &Device::Cpu)?)
            }
            SynthForm::Q4_1 { .. } => match self.to_host()? {
                HostWeight::Quant(q) => Ok(Tensor::from_vec(
                    q.to_f32_vec(),
                    self.dims.clone(),
                    &Device::Cpu,
                )?),
                other => Err(EngineError::State(format!(
                    "synthetic Q4_1 materialised as {other:?}"
                ))),
            },
        }
    }
}

/// Amplitude of synthetic f32 parameters (norm weights, biases, decays).
const SMALL: f32 = 0.05;

/// Bytes of the weights a source handed out, by tensor name (for the
/// bytes-per-step arithmetic of a benchmark).
pub type Ledger = BTreeMap<String, usize>;

/// Random weights for the tensors a loader asks for.
#[derive(Debug)]
pub struct SyntheticSource {
    seed: u64,
    /// Whether to offer the MTP head (`mtp.*`).
    mtp: bool,
    label: PathBuf,
    ledger: Ledger,
}

impl SyntheticSource {
    pub fn new(seed: u64, mtp: bool, label: &str) -> Self {
        Self {
            seed,
            mtp,
            label: PathBuf::from(format!("synthetic:{label}")),
            ledger: Ledger::new(),
        }
    }

    /// The stream of a tensor this source generates on demand (the
    /// qwen4_exp n-gram table, gathered row by row).
    pub fn seed_of(&self, name: &str) -> u64 {
        tensor_seed(self.seed, name)
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn describe(&mut self, name: &str, shape: &[usize]) -> SyntheticWeight {
        let seed = tensor_seed(self.seed, name);
        // Matrices of whole blocks are 4-bit; everything else is small f32.
        let w = if shape.len() >= 2 && shape[shape.len() - 1].is_multiple_of(32) {
            SyntheticWeight::q4_1(seed, shape.to_vec())
        } else {
            SyntheticWeight {
                seed,
                dims: shape.to_vec(),
                form: SynthForm::F32 { amp: SMALL },
            }
        };
        self.ledger.insert(name.to_string(), w.bytes());
        w
    }
}

impl WeightSource for SyntheticSource {
    fn file_of(&self, _name: &str) -> PathBuf {
        self.label.clone()
    }

    /// Every tensor a loader probes exists (the fused expert layout), except
    /// the MTP head when it is off.
    fn has(&self, name: &str) -> bool {
        self.mtp || !name.starts_with("mtp.")
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        Ok(HostWeight::Synthetic(Arc::new(self.describe(name, shape))))
    }

    fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let mut w = self.describe(name, shape);
        if let SynthForm::Q4_1 { .. } = w.form {
            // Read as f32: kept f32 by the backend.
            self.ledger.insert(name.to_string(), 4 * w.elements());
            return w.to_f32();
        }
        w.form = SynthForm::F32 { amp: SMALL };
        w.to_f32()
    }

    fn ignore(&mut self, _name: &str) {}

    fn synthetic(&mut self) -> Option<&mut SyntheticSource> {
        Some(self)
    }
}

/// A family's configuration at a named shape: `full` (the real
/// configuration), `tiny` (the tiny fixture's), or a path to a
/// `config.json`.
pub fn shape_config(family: &str, shape: &str) -> Result<serde_json::Value> {
    let text = match (family, shape) {
        ("qwen4_exp", "full") => QWEN4_EXP_FULL.to_string(),
        ("qwen4_exp", "tiny") => QWEN4_EXP_TINY.to_string(),
        ("deepseek_v4", "full") => DEEPSEEK_V4_FULL.to_string(),
        ("deepseek_v4", "tiny") => DEEPSEEK_V4_TINY.to_string(),
        ("glm5_next", "full") => GLM5_NEXT_FULL.to_string(),
        ("glm5_next", "tiny") => GLM5_NEXT_TINY.to_string(),
        (_, path) if path.ends_with(".json") => {
            std::fs::read_to_string(path).map_err(|e| EngineError::File {
                path: PathBuf::from(path),
                message: format!("cannot read: {e}"),
            })?
        }
        (f, s) => {
            return Err(EngineError::Unsupported(format!(
                "no synthetic shape `{s}` for family `{f}` (qwen4_exp, deepseek_v4, glm5_next: full, tiny, or a config.json path)"
            )));
        }
    };
    serde_json::from_str(&text).map_err(|e| EngineError::File {
        path: PathBuf::from(shape),
        message: format!("invalid JSON: {e}"),
    })
}

/// The tiny fixture's configuration (`tests/fixtures/qwen4_exp/tiny_a`).
const QWEN4_EXP_TINY: &str =
    include_str!("../../../../tests/fixtures/qwen4_exp/tiny_a/config.json");

/// The shipped text configuration (`shared/research/arch-qwen4exp.md`, §1).
const QWEN4_EXP_FULL: &str = r#"{
  "model_type": "qwen4_exp_text",
  "vocab_size": 248320, "hidden_size": 2560, "num_hidden_layers": 48,
  "rms_norm_eps": 1e-6, "bos_token_id": 248044, "eos_token_id": 248044,
  "tie_word_embeddings": false, "max_position_embeddings": 262144,
  "num_attention_heads": 24, "num_key_value_heads": 2, "head_dim": 256,
  "linear_num_key_heads": 16, "linear_num_value_heads": 48,
  "linear_key_head_dim": 128, "linear_value_head_dim": 128,
  "linear_conv_kernel_dim": 4, "output_gate_type": "sigmoid", "hidden_act": "silu",
  "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 640,
  "shared_expert_intermediate_size": 640, "norm_topk_prob": true,
  "hc_count": 4, "hc_lowrank": 320,
  "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128,
  "indexer_budget": 2048, "indexer_compress_ratio": 4,
  "ple_layer_ids": [2], "ple_embed_dim": 2560, "ple_conv_kernel_size": 4, "ngram_size": 3,
  "heads_per_ngram": 8, "ngram_vocab_size_base": 20000000,
  "make_ngram_vocab_size_divisible_by": 128, "seed": 1234, "split_ngram_parts": 128,
  "full_attention_interval": 4,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true}
}"#;

/// DeepSeek-V4-Flash (284 B parameters): `deepseek-ai/DeepSeek-V4-Flash`'s
/// `config.json` as published (read in a public copy,
/// `chenwainuo/mtp-tree-attention-evolution@93fc479:configs/deepseek-v4-flash-config.json`,
/// and the same constants in antirez/ds4's `ds4.c`: 43 layers, 4096 wide,
/// vocabulary 129280, 64 heads of 512, q rank 1024, 8 output groups of
/// rank 1024, 256 experts of 2048 with 6 routed, 3 hash layers, window 128,
/// indexer 64 × 128 top 512, 4 streams, 20 Sinkhorn steps). The file's
/// `compress_ratios` has 44 entries (the last is the MTP layer's; the
/// parser keeps the first 43); its flat `rope_scaling` is given here as
/// `rope_parameters`, the form transformers 5 converts it to (YaRN on the
/// compressed layers' rope only), with the quantization keys left out.
const DEEPSEEK_V4_FULL: &str = r#"{
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "attention_bias": false, "bos_token_id": 0, "eos_token_id": 1,
  "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "head_dim": 512, "hidden_act": "silu", "hidden_size": 4096,
  "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512,
  "max_position_embeddings": 1048576, "moe_intermediate_size": 2048,
  "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 64, "num_experts_per_tok": 6, "num_hidden_layers": 43,
  "num_hash_layers": 3, "num_key_value_heads": 1, "num_nextn_predict_layers": 1,
  "o_groups": 8, "o_lora_rank": 1024, "q_lora_rank": 1024, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
    "beta_fast": 32, "beta_slow": 1},
  "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
  "sliding_window": 128, "swiglu_limit": 10.0, "tie_word_embeddings": false,
  "topk_method": "noaux_tc", "vocab_size": 129280, "compress_rope_theta": 160000,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
    4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
    4, 128, 4, 128, 4, 128, 4, 0]
}"#;

/// A tiny DeepSeek-V4 whose every stored matrix is whole 256-value blocks
/// (hidden and expert width 256, so ds4's K / IQ expert types apply) and
/// whose Q8_0 inputs are whole 32-blocks: all three attention kinds, hash
/// and learned routing.
const DEEPSEEK_V4_TINY: &str = r#"{
  "model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 256,
  "num_hidden_layers": 5,
  "layer_types": ["sliding_attention", "compressed_sparse_attention",
    "heavily_compressed_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
  "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe"],
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64,
  "partial_rotary_factor": 0.25, "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 32,
  "index_n_heads": 4, "index_head_dim": 32, "index_topk": 16,
  "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
  "sliding_window": 32, "compress_rates": {"compressed_sparse_attention": 4,
    "heavily_compressed_attention": 128},
  "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-06, "rms_norm_eps": 1e-06,
  "max_position_embeddings": 1048576, "eos_token_id": 1,
  "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
  "rope_parameters": {"rope_type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
    "beta_fast": 32, "beta_slow": 1}
}"#;

/// GLM-5.3-Flash (313 B parameters) as its conditional-generation
/// `config.json` nests it (`text_config`; the vision tower's fields left
/// out), with `shared/research/arch-ds4-glm5.md` Part B1's values: vocabulary
/// 154880, 4096 wide, dense MLP 12288, experts 2048; 45 layers; MLA 64
/// heads, q rank 1536, kv rank 512, NoPE heads of 256; DSA indexer 32 × 128,
/// top 2048 in pools of 16; KDA 64 × 128, conv 4, gate bound −5; 288
/// experts top 8, one shared, scaling 2.5; 4 streams. The schedules are
/// the class defaults (`Glm5NextTextConfig.__post_init__`): KDA on layers
/// `i % 4 ≠ 3`, MLA on the other 11; three dense layers, then sparse;
/// every MLA layer its own (full) indexer. Context: GLM's 202752.
const GLM5_NEXT_FULL: &str = r#"{
  "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
  "tie_word_embeddings": false,
  "text_config": {
    "model_type": "glm5_next_text", "vocab_size": 154880, "hidden_size": 4096,
    "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_hidden_layers": 45,
    "rms_norm_eps": 1e-05, "hidden_act": "silu", "attention_bias": false,
    "max_position_embeddings": 202752, "tie_word_embeddings": false,
    "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
    "index_topk": 2048, "index_kpool": 16, "index_n_heads": 32, "index_head_dim": 128,
    "index_kpool_always_select_tail": true,
    "linear_num_heads": 64, "linear_head_dim": 128, "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0,
    "n_routed_experts": 288, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "swiglu_limit": 10.0, "hc_mult": 4, "hc_eps": 1e-06, "hc_sinkhorn_iters": 20
  }
}"#;

/// The tiny fixture's model (`tests/fixtures/glm5_next/tiny_a`: its six
/// layers' KDA / MLA, dense / sparse and full / shared indexer schedules,
/// 8 experts top 3 in 4 groups keeping 2) at widths whose stored matrices
/// are whole blocks, as DeepSeek's tiny shape is: hidden, dense and expert
/// width 256 (ds4's K / IQ expert types), every other input a multiple of
/// 32 (Q8_0). The fixture's own 16-wide config loads too, in F16.
const GLM5_NEXT_TINY: &str = r#"{
  "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
  "tie_word_embeddings": false,
  "text_config": {
    "model_type": "glm5_next_text", "vocab_size": 512, "hidden_size": 256,
    "intermediate_size": 256, "moe_intermediate_size": 256, "num_hidden_layers": 6,
    "layer_types": ["linear_attention", "indexed_attention", "indexed_attention",
      "linear_attention", "linear_attention", "indexed_attention"],
    "mlp_layer_types": ["dense", "dense", "sparse", "sparse", "sparse", "sparse"],
    "indexer_types": ["full", "full", "shared", "full", "full", "full"],
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 64,
    "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 0, "v_head_dim": 32,
    "index_topk": 16, "index_kpool": 8, "index_n_heads": 4, "index_head_dim": 32,
    "index_kpool_always_select_tail": true,
    "linear_num_heads": 2, "linear_head_dim": 32, "linear_conv_kernel_dim": 4,
    "linear_lower_bound": -5.0,
    "n_routed_experts": 8, "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "swiglu_limit": 10.0, "hc_mult": 4, "hc_eps": 1e-06, "hc_sinkhorn_iters": 20,
    "rms_norm_eps": 1e-05, "max_position_embeddings": 4096, "eos_token_id": 1,
    "pad_token_id": 0
  }
}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_q4_1_is_deterministic_and_centred() {
        let w = SyntheticWeight::q4_1(tensor_seed(7, "a.weight"), vec![64, 256]);
        assert_eq!(w.q4_1_data(), w.q4_1_data());
        let other = SyntheticWeight::q4_1(tensor_seed(8, "a.weight"), vec![64, 256]);
        assert_ne!(w.q4_1_data(), other.q4_1_data());
        let v = w
            .to_f32()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(v.len(), 64 * 256);
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32;
        // Row outputs keep the input's scale: Σ over 256 inputs of w² ≈ 1.
        assert!(mean.abs() < 2e-3, "mean {mean}");
        assert!(
            (var * 256.0 - 1.0).abs() < 0.1,
            "row variance {}",
            var * 256.0
        );
    }

    #[test]
    fn synthetic_shapes_parse() {
        for s in ["full", "tiny"] {
            let j = shape_config("qwen4_exp", s).unwrap();
            crate::families::qwen4_exp::Qwen4ExpConfig::from_hf(std::path::Path::new(s), &j)
                .unwrap();
        }
        assert!(shape_config("qwen4_exp", "huge").is_err());
        for s in ["full", "tiny"] {
            let j = shape_config("deepseek_v4", s).unwrap();
            let c = crate::families::deepseek_v4::DeepseekV4Config::from_hf(
                std::path::Path::new(s),
                &j,
            )
            .unwrap();
            assert_eq!(c.attn.len(), c.num_layers);
        }
        let full = crate::families::deepseek_v4::DeepseekV4Config::from_hf(
            std::path::Path::new("full"),
            &shape_config("deepseek_v4", "full").unwrap(),
        )
        .unwrap();
        assert_eq!(
            (
                full.num_layers,
                full.hidden_size,
                full.n_routed_experts,
                full.rope_dim
            ),
            (43, 4096, 256, 64)
        );
        for s in ["full", "tiny"] {
            let j = shape_config("glm5_next", s).unwrap();
            let c =
                crate::families::glm5_next::Glm5NextConfig::from_hf(std::path::Path::new(s), &j)
                    .unwrap();
            assert_eq!(c.layer_kinds.len(), c.num_layers);
        }
        let gpu20: serde_json::Value = serde_json::from_str(include_str!(
            "../../../../tools/gpu/glm5_next_full_20_layers.json"
        ))
        .unwrap();
        let c = crate::families::glm5_next::Glm5NextConfig::from_hf(
            std::path::Path::new("glm5_next_full_20_layers.json"),
            &gpu20,
        )
        .unwrap();
        let full = crate::families::glm5_next::Glm5NextConfig::from_hf(
            std::path::Path::new("full"),
            &shape_config("glm5_next", "full").unwrap(),
        )
        .unwrap();
        // The full shape, cut after 20 layers (same schedules).
        assert_eq!(c.num_layers, 20);
        assert_eq!(c.layer_kinds[..], full.layer_kinds[..20]);
        assert_eq!(c.mlp_kinds[..], full.mlp_kinds[..20]);
        let cut = crate::families::glm5_next::Glm5NextConfig {
            num_layers: 20,
            layer_kinds: c.layer_kinds.clone(),
            mlp_kinds: c.mlp_kinds.clone(),
            indexer_kinds: c.indexer_kinds.clone(),
            ..full
        };
        assert_eq!(c, cut);
        let full = crate::families::deepseek_v4::DeepseekV4Config::from_hf(
            std::path::Path::new("full"),
            &shape_config("deepseek_v4", "full").unwrap(),
        )
        .unwrap();
        assert!(matches!(
            full.compress_rope.scaling,
            crate::layers::rope::RopeScaling::Yarn { .. }
        ));
    }
}
