//! Loading a family onto the CUDA backend: the same loaders as on the CPU
//! (every family is generic over its backend), given a [`CudaOps`].

use std::path::Path;

use super::{FamilyDescriptor, LoadedModel, deepseek_v4, glm5_next, llama, qwen4_exp};
use crate::backend::CudaOps;
use crate::error::{EngineError, Result};
use crate::load::ModelFormat;

/// The model at `path` (already recognised as `family`) on CUDA device
/// `ordinal`.
pub(super) fn load(
    family: &FamilyDescriptor,
    path: &Path,
    format: ModelFormat,
    ordinal: usize,
) -> Result<LoadedModel> {
    let ops = CudaOps::new(ordinal)?;
    if std::ptr::eq(family, &llama::DESCRIPTOR) {
        let m = match format {
            ModelFormat::Gguf => {
                llama::LlamaModel::load_gguf(path, llama::GgufWeights::Quantized, ops)?
            }
            ModelFormat::HfDir => llama::LlamaModel::load_hf(path, ops)?,
        };
        return Ok(LoadedModel::LlamaCuda(Box::new(m)));
    }
    if std::ptr::eq(family, &qwen4_exp::DESCRIPTOR) {
        let m = qwen4_exp::Qwen4ExpModel::load(path, ops)?;
        return Ok(LoadedModel::Qwen4ExpCuda(Box::new(m)));
    }
    if std::ptr::eq(family, &deepseek_v4::DESCRIPTOR) {
        let m = match format {
            ModelFormat::Gguf => deepseek_v4::DeepseekV4Model::load_gguf(path, None, ops)?,
            ModelFormat::HfDir => deepseek_v4::DeepseekV4Model::load(path, ops)?,
        };
        return Ok(LoadedModel::DeepseekV4Cuda(Box::new(m)));
    }
    if std::ptr::eq(family, &glm5_next::DESCRIPTOR) {
        let m = glm5_next::Glm5NextModel::load(path, ops)?;
        return Ok(LoadedModel::Glm5NextCuda(Box::new(m)));
    }
    Err(EngineError::Unsupported(format!(
        "the {} family has no CUDA loader yet",
        family.name
    )))
}
