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
    /// Stored bytes (what a load maps or uploads).
    pub bytes: u64,
}

/// Tensors whose names differ only in layer or expert indices, with their
/// storage types and bytes: what a recipe chose for each group.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TensorGroup {
    /// The name with every index replaced by `*` (`blk.*.ffn_gate_exps.weight`).
    pub group: String,
    pub tensors: usize,
    /// Storage types in the group (one, for files made by one recipe).
    pub dtypes: Vec<String>,
    pub bytes: u64,
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
    /// Per tensor group, sorted by name.
    pub groups: Vec<TensorGroup>,
    /// Stored bytes of all weights: what a load keeps resident on the CPU
    /// (GGUF weights are read in place from the map; safetensors weights
    /// keep their stored type) or uploads to a GPU, before caches.
    pub weight_bytes: u64,
}

/// `name` with every all-digit dot-separated segment replaced by `*`.
pub fn group_of(name: &str) -> String {
    name.split('.')
        .map(|seg| {
            if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
                "*"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn groups(tensors: &[TensorInfo]) -> Vec<TensorGroup> {
    let mut by: BTreeMap<String, TensorGroup> = BTreeMap::new();
    for t in tensors {
        let key = group_of(&t.name);
        let g = by.entry(key.clone()).or_insert_with(|| TensorGroup {
            group: key,
            tensors: 0,
            dtypes: Vec::new(),
            bytes: 0,
        });
        g.tensors += 1;
        g.bytes += t.bytes;
        if !g.dtypes.contains(&t.dtype) {
            g.dtypes.push(t.dtype.clone());
        }
    }
    by.into_values().collect()
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
            let c = g.container();
            let config: serde_json::Map<String, serde_json::Value> = c
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), gguf_json(v)))
                .collect();
            let tensors: Vec<TensorInfo> = c
                .tensors
                .iter()
                .map(|(name, i)| TensorInfo {
                    name: name.clone(),
                    shape: i.dims.clone(),
                    dtype: crate::quant::ggml_type_name(i.ggml_type).to_string(),
                    bytes: ds4_gguf::tensor_bytes(i.ggml_type, &i.dims).unwrap_or(0) as u64,
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
                    bytes: SafetensorsDir::range_of(e).len() as u64,
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
    let weight_bytes = tensors.iter().map(|t| t.bytes).sum();
    Ok(ModelInfo {
        groups: groups(&tensors),
        weight_bytes,
        format,
        // The loader's own recognition (a GGUF in Hugging Face names is
        // recognised by its embedded config).
        family: crate::families::detect(path)
            .ok()
            .map(|(f, _)| f.descriptor.name)
            .or_else(|| architecture.as_deref().and_then(|a| family_of(format, a))),
        architecture,
        config,
        parameter_count,
        tensors,
        dtype_histogram,
    })
}
