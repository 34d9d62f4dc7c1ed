//! GLM-5.3-Flash (`glm5_next`): a hybrid MoE text model with 4-stream mHC
//! hyper-connections (collapsed by a plain mean), Kimi delta attention
//! (KDA) on three layers of four, NoPE MLA with a DeepSeek-style sparse
//! indexer over pooled keys on the fourth (shared-indexer layers reuse the
//! previous layer's selection), dense clamped-SwiGLU layers first, then a
//! sigmoid-routed, group-limited MoE with a shared expert, and a NextN MTP
//! layer. Loads Hugging Face directories (the conditional-generation
//! `glm5_next` wrapper, whose vision tower is ignored, or the text-only
//! layouts).
//!
//! GLM is bound to the ds4 sampling law and keeps its own cache rules; it
//! shares layers with Qwen and DeepSeek but none of their policies.

pub mod config;
mod fields;

#[cfg(test)]
mod config_tests;

pub use config::Glm5NextConfig;
