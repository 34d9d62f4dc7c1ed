//! Model families. Each lives in its own module and touches shared code only
//! through the [`crate::Model`] contract and its [`FamilyDescriptor`].

pub mod llama;
pub mod qwen4_exp;

use std::path::Path;

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
    Qwen4Exp(qwen4_exp::Qwen4ExpModel),
}

impl LoadedModel {
    /// Load the model at `path` (a `.gguf` file or a Hugging Face directory)
    /// on the CPU, choosing the family from its metadata.
    pub fn load(path: &Path) -> Result<Self> {
        // A Hugging Face directory names its family in config.json
        // `model_type`; GGUF files and llama model types go to llama.
        if crate::load::detect(path)? == crate::load::ModelFormat::HfDir {
            let config = path.join(crate::load::safetensors::CONFIG_FILE);
            let text = std::fs::read_to_string(&config).map_err(|e| crate::EngineError::File {
                path: config.clone(),
                message: format!("cannot read: {e}"),
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| crate::EngineError::File {
                    path: config.clone(),
                    message: format!("invalid JSON: {e}"),
                })?;
            let model_type = json.get("model_type").and_then(|v| v.as_str());
            if model_type.is_some_and(|t| qwen4_exp::DESCRIPTOR.model_types.contains(&t)) {
                return Ok(LoadedModel::Qwen4Exp(
                    qwen4_exp::Qwen4ExpModel::from_hf_dir(path)?,
                ));
            }
        }
        Ok(LoadedModel::Llama(crate::load::load_llama(path)?))
    }

    pub fn descriptor(&self) -> &'static FamilyDescriptor {
        match self {
            LoadedModel::Llama(_) => &llama::DESCRIPTOR,
            LoadedModel::Qwen4Exp(_) => &qwen4_exp::DESCRIPTOR,
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
            $crate::families::LoadedModel::Qwen4Exp($model) => $body,
        }
    };
}
