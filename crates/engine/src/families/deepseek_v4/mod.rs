//! DeepSeek-V4-Flash (`deepseek_v4`): mHC hyper-connections (four streams,
//! Sinkhorn mixing, a learned `hc_head`), shared-K=V attention over a
//! sliding window with sinks, compressed sparse attention (CSA: ratio-4
//! entries chosen by a lightning indexer) and heavily compressed attention
//! (HCA: ratio-128 entries), two RoPE bases (YaRN on the compressed
//! layers), a grouped low-rank output projection, MoE with sqrt-softplus
//! scores, hash routing by token id on the first layers and clamped SwiGLU,
//! and a one-layer MTP head. Loads Hugging Face directories (transformers'
//! saved names or the upstream ones), f32/bf16/f16, computed in f32, and
//! antirez/ds4's GGUF files ([`gguf`]: `general.architecture` `deepseek4`,
//! stored types kept, the MTP head from ds4's separate MTP GGUF).
//!
//! Written against the op inventory: [`attention`] (window + compressed
//! entries + the lightning indexer, over the shared compressor layer),
//! [`moe`] (the shared scored router and experts), [`state`] (every cache,
//! with bounded raw rows), [`model`] (trunk, `hc_head`, MTP head).
//! Sampling: the ds4 law (xorshift64*), as antirez/ds4 serves the model.

pub mod attention;
mod batch;
pub mod config;
pub mod gguf;
pub mod model;
pub mod moe;
pub mod state;

pub use config::DeepseekV4Config;
pub use model::{DeepseekV4Model, LayerTrace, TrunkOutput};
pub use state::{DeepseekV4State, MtpState, WindowMark};

use super::FamilyDescriptor;
use ds4_sampling::Law;

pub static DESCRIPTOR: FamilyDescriptor = FamilyDescriptor {
    name: "deepseek_v4",
    model_types: &["deepseek_v4"],
    gguf_architectures: &[gguf::GGUF_ARCHITECTURE],
    law: Law::Ds4,
    sampling_defaults: Law::Ds4.default_params(),
};
