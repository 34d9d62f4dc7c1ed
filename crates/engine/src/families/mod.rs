//! Model families. Each lives in its own module and touches shared code only
//! through the [`crate::Model`] contract and its [`FamilyDescriptor`].

pub mod llama;

use std::path::Path;

use candle_core::Device;
use ds4_sampling::{Law, SamplingParams};

use crate::error::Result;

/// What the rest of the system may know about a family.
#[derive(Debug)]
pub struct FamilyDescriptor {
    pub name: &'static str,
    /// `general.architecture` (GGUF) or `model_type` (config.json) values.
    pub model_types: &'static [&'static str],
    /// The one sampling law this family is bound to.
    pub law: Law,
    /// Defaults for the parameters a request leaves unset.
    pub sampling_defaults: SamplingParams,
}

/// A loaded model of any family. Generic code receives the concrete model
/// through [`with_model!`], so decode loops are monomorphised per family.
pub enum LoadedModel {
    Llama(llama::LlamaModel),
}

impl LoadedModel {
    /// Load the model at `path` (a `.gguf` file or a Hugging Face directory)
    /// on the CPU, choosing the family from its metadata.
    pub fn load(path: &Path) -> Result<Self> {
        Ok(LoadedModel::Llama(crate::load::load_llama(
            path,
            &Device::Cpu,
        )?))
    }

    pub fn descriptor(&self) -> &'static FamilyDescriptor {
        match self {
            LoadedModel::Llama(_) => &llama::DESCRIPTOR,
        }
    }

    pub fn family_name(&self) -> &'static str {
        self.descriptor().name
    }
}

/// Run `$body` with `$model` bound to the concrete model inside a
/// [`LoadedModel`]: `with_model!(&loaded, m => generic_fn(m))`.
#[macro_export]
macro_rules! with_model {
    ($loaded:expr, $model:ident => $body:expr) => {
        match $loaded {
            $crate::families::LoadedModel::Llama($model) => $body,
        }
    };
}
