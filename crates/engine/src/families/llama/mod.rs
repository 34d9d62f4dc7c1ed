//! The dense Llama family (Llama 2/3, SmolLM, TinyLlama, ...): RMSNorm,
//! RoPE (default, linear, llama3), grouped-query attention, SwiGLU, tied or
//! separate output head. Loads from a GGUF file (quantized weights stay
//! quantized) or a Hugging Face safetensors directory.

mod batch;
pub mod config;
pub mod model;
pub mod mtp;

pub use config::LlamaConfig;
pub use model::{GgufWeights, LlamaModel, LlamaState, LlamaWindow};
pub use mtp::{
    LlamaMtpHistory, MTP_AUTO_DEPTH, MTP_AUTO_DEPTH_FAST, MTP_AUTO_DEPTH_SAMPLED,
    MTP_AUTO_DEPTH_SAMPLED_FAST, MtpHead,
};

/// Load a llama-family model from a `.gguf` file or a Hugging Face
/// directory, on the CPU.
pub fn load_llama(path: &std::path::Path) -> crate::error::Result<LlamaModel> {
    match crate::load::detect(path)? {
        crate::load::ModelFormat::Gguf => LlamaModel::from_gguf(path),
        crate::load::ModelFormat::HfDir => LlamaModel::from_hf_dir(path),
    }
}

use super::FamilyDescriptor;
use ds4_sampling::Law;

pub static DESCRIPTOR: FamilyDescriptor = FamilyDescriptor {
    name: "llama",
    model_types: &["llama"],
    gguf_architectures: &["llama"],
    // The spec binds dense Llama models to the nucleus law with its PCG64
    // stream; the defaults are the law's own.
    law: Law::Nucleus,
    sampling_defaults: Law::Nucleus.default_params(),
};
