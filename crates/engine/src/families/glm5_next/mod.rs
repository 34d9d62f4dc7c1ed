//! GLM-5.3-Flash (`glm5_next`): a hybrid MoE text model with 4-stream mHC
//! hyper-connections (collapsed by a plain mean), Kimi delta attention
//! (KDA) on three layers of four, NoPE MLA with a DeepSeek-style sparse
//! indexer over pooled keys on the fourth (shared-indexer layers reuse the
//! previous layer's selection), dense clamped-SwiGLU layers first, then a
//! sigmoid-routed, group-limited MoE with a shared expert, and a NextN MTP
//! layer. Loads Hugging Face directories (the conditional-generation
//! `glm5_next` wrapper, whose vision tower is ignored, or the text-only
//! layouts), f32/bf16/f16 safetensors, computed in f32.
//!
//! Written against the op inventory; KDA, MLA, the pooled indexer, mHC,
//! the experts and the scored router are shared layers in
//! [`crate::layers`]. Family modules: [`config`], [`ffn`] (dense and sparse
//! blocks), [`layer`] (one decoder layer), [`state`] (every cache, verify
//! window capture and commit), [`mtp`] (the NextN head and its contract),
//! [`model`].
//!
//! GLM is bound to the ds4 sampling law ([`DESCRIPTOR`]) and keeps its own
//! cache rules; it shares layers with Qwen and DeepSeek but none of their
//! policies.

mod batch;
pub mod config;
pub mod ffn;
mod fields;
pub mod layer;
pub mod model;
pub mod mtp;
mod schedule;
pub mod state;

#[cfg(test)]
mod config_tests;

pub use config::Glm5NextConfig;
pub use model::{Glm5NextModel, TrunkOutput};
pub use state::{Glm5NextState, MtpState, WindowCapture};

use super::FamilyDescriptor;
use ds4_sampling::Law;

pub static DESCRIPTOR: FamilyDescriptor = FamilyDescriptor {
    name: "glm5_next",
    model_types: &["glm5_next", "glm5_next_text"],
    // GLM-5 is served from Hugging Face directories only.
    gguf_architectures: &[],
    law: Law::Ds4,
    sampling_defaults: Law::Ds4.default_params(),
};
