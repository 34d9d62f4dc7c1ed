//! Loading a family onto the CUDA backend: the same loaders as on the CPU
//! (every family is generic over its backend), given a [`CudaOps`].

use std::path::Path;

use super::CudaGroup;
use super::shards::Shards;
use super::{FamilyDescriptor, LoadedModel, deepseek_v4, glm5_next, llama, qwen4_exp};
use crate::backend::CudaOps;
use crate::backend::split::{ExpertSplit, HostCopy, Split};
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

/// The expert-parallel group over `shards`: one [`CudaOps`] per distinct
/// ordinal (a repeated ordinal's parts share it: logical shards of one
/// GPU), routed experts split evenly, buffers moved through the host
/// ([`HostCopy`]; NCCL is to replace it, `docs/ARCHITECTURE.md`).
pub(super) fn group(shards: Shards) -> Result<CudaGroup> {
    let mut opened: Vec<(usize, CudaOps)> = Vec::new();
    let mut parts = Vec::with_capacity(shards.len());
    for o in shards.ordinals() {
        let ops = match opened.iter().find(|(n, _)| *n == o) {
            Some((_, ops)) => ops.clone(),
            None => {
                let ops = CudaOps::new(o)?;
                opened.push((o, ops.clone()));
                ops
            }
        };
        parts.push(ops);
    }
    Split::new(
        parts,
        ExpertSplit::even(shards.len())?,
        std::sync::Arc::new(HostCopy),
    )
}

/// The model at `path` on the group `shards` (the families with routed
/// experts).
pub(super) fn load_group(
    family: &FamilyDescriptor,
    path: &Path,
    format: ModelFormat,
    shards: Shards,
) -> Result<LoadedModel> {
    let ops = group(shards)?;
    if std::ptr::eq(family, &qwen4_exp::DESCRIPTOR) {
        let m = qwen4_exp::Qwen4ExpModel::load(path, ops)?;
        return Ok(LoadedModel::Qwen4ExpCudaGroup(Box::new(m)));
    }
    if std::ptr::eq(family, &deepseek_v4::DESCRIPTOR) {
        let m = match format {
            ModelFormat::Gguf => deepseek_v4::DeepseekV4Model::load_gguf(path, None, ops)?,
            ModelFormat::HfDir => deepseek_v4::DeepseekV4Model::load(path, ops)?,
        };
        return Ok(LoadedModel::DeepseekV4CudaGroup(Box::new(m)));
    }
    if std::ptr::eq(family, &glm5_next::DESCRIPTOR) {
        let m = glm5_next::Glm5NextModel::load(path, ops)?;
        return Ok(LoadedModel::Glm5NextCudaGroup(Box::new(m)));
    }
    Err(EngineError::Unsupported(format!(
        "--devices splits routed experts; the {} family has none (run it with --device cuda)",
        family.name
    )))
}
