//! Qwen3.8-Flash-Next (`qwen4_exp`): a hybrid MoE text model with 4-stream
//! hyper-connections, Gated DeltaNet linear layers, QSA (block-sparse
//! indexed) gated attention, hashed n-gram per-layer embeddings (PLE) and an
//! MTP head. Loads Hugging Face directories (`qwen4_exp_text`, or the VL
//! `qwen4_exp` whose vision tower is ignored), f32/bf16/f16 safetensors,
//! computed in f32 on the CPU.
//!
//! Written against the op inventory ([`crate::backend::Backend`]): the
//! model is generic over its backend. Family modules: [`gated_deltanet`]
//! (projections around the shared delta rule), [`gated_attention`] (QSA
//! attention over the shared indexer), [`ple`], [`moe`] (the shared experts
//! and softmax router plus Qwen's shared expert); [`state`] holds every
//! cache; [`model`] wires the trunk and the MTP head and documents the MTP
//! contract. Norms, hyper-connections, M-RoPE, the delta rule, experts and
//! the indexer are shared layers in [`crate::layers`].

mod batch;
pub mod config;
pub mod gated_attention;
pub mod gated_deltanet;
pub mod model;
pub mod moe;
pub mod ple;
pub mod state;
pub mod vision;

pub use config::Qwen4ExpConfig;
pub use model::{MtpOutput, Qwen4ExpModel, TrunkOutput};
pub use state::{MtpState, Qwen4ExpState, WindowCapture};

use super::FamilyDescriptor;
use ds4_sampling::Law;

pub static DESCRIPTOR: FamilyDescriptor = FamilyDescriptor {
    name: "qwen4_exp",
    model_types: &["qwen4_exp", "qwen4_exp_text"],
    // Qwen4-Exp is served from Hugging Face directories only.
    gguf_architectures: &[],
    law: Law::Nucleus,
    sampling_defaults: Law::Nucleus.default_params(),
};
