//! `inspect`: what a model file holds, without building the model — format,
//! family, configuration, every tensor with its shape and storage type, the
//! parameter count and a histogram of storage types.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;

use crate::error::Result;
use crate::families::FAMILIES;
use crate::load::gguf::{GgufFile, describe, value_as_f64, value_as_usize};
use crate::load::safetensors::SafetensorsDir;
use crate::load::{ModelFormat, detect};

#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorInfo {
    pub name: String,
    /// Row-major (`[out, in]` for weight matrices), in both formats.
    pub shape: Vec<usize>,
    /// `F32`, `BF16`, `Q4_1`, ...
    pub dtype: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelInfo {
    pub format: ModelFormat,
    /// `general.architecture` (GGUF) or `model_type` (config.json).
    pub architecture: Option<String>,
    /// The family that would load it (None when no family accepts it).
    pub family: Option<&'static str>,
    /// config.json as is, or the GGUF metadata (arrays such as the
    /// vocabulary are summarised as "array of N values").
    pub config: serde_json::Value,
    pub parameter_count: u64,
    /// Sorted by name.
    pub tensors: Vec<TensorInfo>,
    /// Tensor count per storage type.
    pub dtype_histogram: BTreeMap<String, usize>,
}

/// The registered family that recognises `arch` in a file of `format`.
fn family_of(format: ModelFormat, arch: &str) -> Option<&'static str> {
    FAMILIES
        .iter()
        .map(|f| f.descriptor)
        .find(|d| match format {
            ModelFormat::HfDir => d.model_types.contains(&arch),
            ModelFormat::Gguf => d.gguf_architectures.contains(&arch),
        })
        .map(|d| d.name)
}

fn gguf_json(v: &Value) -> serde_json::Value {
    match v {
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Array(_) => serde_json::Value::String(describe(v)),
        Value::F32(_) | Value::F64(_) => value_as_f64(v)
            .and_then(serde_json::Number::from_f64)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null),
        Value::I8(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        other => value_as_usize(other)
            .map(|x| serde_json::Value::from(x as u64))
            .unwrap_or(serde_json::Value::Null),
    }
}

pub fn inspect(path: &Path) -> Result<ModelInfo> {
    let format = detect(path)?;
    let (architecture, config, mut tensors) = match format {
        ModelFormat::Gguf => {
            let g = GgufFile::open(path)?;
            let c = g.content();
            let config: serde_json::Map<String, serde_json::Value> = c
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), gguf_json(v)))
                .collect();
            let tensors: Vec<TensorInfo> = c
                .tensor_infos
                .iter()
                .map(|(name, i)| TensorInfo {
                    name: name.clone(),
                    shape: i.shape.dims().to_vec(),
                    dtype: format!("{:?}", i.ggml_dtype),
                })
                .collect();
            let arch = g.opt_string("general.architecture")?.map(str::to_string);
            (
                arch,
                serde_json::Value::Object(config.into_iter().collect()),
                tensors,
            )
        }
        ModelFormat::HfDir => {
            let st = SafetensorsDir::open(path)?;
            let tensors = st
                .entries()
                .map(|(name, e)| TensorInfo {
                    name: name.to_string(),
                    shape: e.shape.clone(),
                    dtype: format!("{:?}", e.dtype),
                })
                .collect();
            let arch = st
                .config()
                .get("model_type")
                .and_then(|v| v.as_str())
                .map(str::to_string);
            (arch, st.config().clone(), tensors)
        }
    };
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let parameter_count = tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum();
    let mut dtype_histogram = BTreeMap::new();
    for t in &tensors {
        *dtype_histogram.entry(t.dtype.clone()).or_insert(0) += 1;
    }
    Ok(ModelInfo {
        format,
        family: architecture.as_deref().and_then(|a| family_of(format, a)),
        architecture,
        config,
        parameter_count,
        tensors,
        dtype_histogram,
    })
}
