//! GGUF reader: typed metadata accessors and strict tensor binding over
//! the memory-mapped file ([`ds4_gguf`]).
//!
//! Tensors come back as [`QuantTensor`] views of the map in their stored
//! type (shape row-major, `[out, in]` for weight matrices): nothing is
//! copied or converted at load, so resident memory is the pages the
//! backends touch. A type this engine does not compute with is refused by
//! name. Every tensor taken is recorded; [`GgufFile::finish`] fails on any
//! tensor the family never asked for, so a file with an unexpected layout
//! cannot load silently.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::Value;
use ds4_gguf::Gguf;

use crate::error::{EngineError, Result};
use crate::quant::{QuantTensor, WeightBytes, WeightType, ggml_type_name};

pub struct GgufFile {
    gguf: Gguf,
    taken: BTreeSet<String>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let gguf = Gguf::open(path).map_err(|e| EngineError::File {
            path: path.to_path_buf(),
            message: match e {
                ds4_gguf::GgufError::Io { source, .. } => format!("cannot read: {source}"),
                other => {
                    // The container error starts with the path; keep the rest.
                    let text = other.to_string();
                    let prefix = format!("{}: ", path.display());
                    text.strip_prefix(&prefix).unwrap_or(&text).to_string()
                }
            },
        })?;
        Ok(Self {
            gguf,
            taken: BTreeSet::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.gguf.path
    }

    /// The parsed container (metadata in file order, the tensor directory).
    pub fn container(&self) -> &Gguf {
        &self.gguf
    }

    fn config_err(&self, key: &str, message: impl Into<String>) -> EngineError {
        EngineError::Config {
            path: self.gguf.path.clone(),
            field: key.to_string(),
            message: message.into(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.gguf.metadata.get(key)
    }
    fn required(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| self.config_err(key, "missing metadata key"))
    }

    /// Any integer type that fits in `usize` (writers differ on u32 / u64 / i32).
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.required(key)?;
        value_as_usize(v).ok_or_else(|| {
            self.config_err(
                key,
                format!("expected a non-negative integer, found {}", describe(v)),
            )
        })
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.usize(key).map(Some),
        }
    }

    /// Any float or integer type, as f64.
    pub fn f64(&self, key: &str) -> Result<f64> {
        let v = self.required(key)?;
        value_as_f64(v).ok_or_else(|| {
            self.config_err(key, format!("expected a number, found {}", describe(v)))
        })
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.f64(key).map(Some),
        }
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        match self.required(key)? {
            Value::String(s) => Ok(s),
            v => Err(self.config_err(key, format!("expected a string, found {}", describe(v)))),
        }
    }

    pub fn opt_string(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.string(key).map(Some),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.gguf.tensors.contains_key(name)
    }

    /// Row-major shape of a tensor, without reading it.
    pub fn tensor_dims(&self, name: &str) -> Option<Vec<usize>> {
        self.gguf.tensors.get(name).map(|i| i.dims.clone())
    }

    /// GGML's name of a tensor's stored type (`IQ2_XXS`, `F16`, ...).
    pub fn tensor_type_name(&self, name: &str) -> Option<&'static str> {
        self.gguf
            .tensors
            .get(name)
            .map(|i| ggml_type_name(i.ggml_type))
    }

    /// Shape (row-major) and stored type of a tensor, without reading it;
    /// the type is `None` when this engine does not compute with it.
    pub fn tensor_meta(&self, name: &str) -> Option<(Vec<usize>, Option<WeightType>)> {
        self.gguf
            .tensors
            .get(name)
            .map(|i| (i.dims.clone(), WeightType::from_ggml_id(i.ggml_type)))
    }

    fn tensor_err(&self, name: &str, message: String) -> EngineError {
        EngineError::Tensor {
            path: self.gguf.path.clone(),
            tensor: name.to_string(),
            message,
        }
    }

    /// The directory entry of `name`, checked against `shape`.
    fn entry(&self, name: &str, shape: &[usize]) -> Result<&ds4_gguf::TensorInfo> {
        let Some(info) = self.gguf.tensors.get(name) else {
            return Err(self.tensor_err(name, format!("missing (expected shape {shape:?})")));
        };
        if info.dims != shape {
            return Err(self.tensor_err(
                name,
                format!("wrong shape: expected {shape:?}, found {:?}", info.dims),
            ));
        }
        Ok(info)
    }

    /// Mark a tensor as deliberately unused (no-op when absent).
    pub fn ignore(&mut self, name: &str) {
        if self.has_tensor(name) {
            self.taken.insert(name.to_string());
        }
    }

    /// Tensor `name` in its stored type, a view of the map (checked against
    /// `shape`), and mark it used.
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<QuantTensor> {
        let info = self.entry(name, shape)?;
        let Some(ty) = WeightType::from_ggml_id(info.ggml_type) else {
            return Err(self.tensor_err(
                name,
                format!(
                    "stored as {}, a type this engine does not read (it reads {})",
                    ggml_type_name(info.ggml_type),
                    readable_types()
                ),
            ));
        };
        let size = ds4_gguf::tensor_bytes(info.ggml_type, &info.dims)
            .expect("the container checked the size");
        let bytes = WeightBytes::range(
            self.gguf.map.clone() as Arc<dyn crate::quant::bytes::WeightOwner>,
            info.offset..info.offset + size,
        )
        .expect("the container checked the range");
        let t = QuantTensor::new(ty, info.dims.clone(), bytes, None)
            .map_err(|e| self.tensor_err(name, e.to_string()))?;
        self.taken.insert(name.to_string());
        Ok(t)
    }

    /// An integer tensor (`I32`, e.g. hash-routing tables) as `u32` values;
    /// negative entries are refused.
    pub fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        let info = self.entry(name, shape)?;
        if info.ggml_type != 26 {
            return Err(self.tensor_err(
                name,
                format!("stored as {}, expected I32", ggml_type_name(info.ggml_type)),
            ));
        }
        let ids = self
            .gguf
            .bytes(info)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect::<Vec<_>>();
        if let Some(bad) = ids.iter().find(|&&v| v < 0) {
            return Err(self.tensor_err(name, format!("negative id {bad}")));
        }
        self.taken.insert(name.to_string());
        Ok(ids.into_iter().map(|v| v as u32).collect())
    }

    /// Strict binding: every tensor in the file must have been taken.
    pub fn finish(&self) -> Result<()> {
        self.finish_except(&[])
    }

    /// Strict binding, except tensors whose names end in one of `ignored`.
    pub fn finish_except(&self, ignored: &[&str]) -> Result<()> {
        let left: Vec<&str> = self
            .gguf
            .order
            .iter()
            .filter(|k| !self.taken.contains(*k) && !ignored.iter().any(|s| k.ends_with(s)))
            .map(String::as_str)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        Err(EngineError::Tensor {
            path: self.gguf.path.clone(),
            tensor: left.join("`, `"),
            message: "present in the file but not used by the model".into(),
        })
    }
}

/// The GGUF types this engine computes with, for error messages.
fn readable_types() -> String {
    WeightType::ALL
        .iter()
        .filter(|t| t.ggml_id().is_some())
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn value_as_usize(v: &Value) -> Option<usize> {
    match v {
        Value::U8(x) => Some(*x as usize),
        Value::U16(x) => Some(*x as usize),
        Value::U32(x) => Some(*x as usize),
        Value::U64(x) => usize::try_from(*x).ok(),
        Value::I8(x) => usize::try_from(*x).ok(),
        Value::I16(x) => usize::try_from(*x).ok(),
        Value::I32(x) => usize::try_from(*x).ok(),
        Value::I64(x) => usize::try_from(*x).ok(),
        _ => None,
    }
}

pub(crate) fn value_as_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        other => value_as_usize(other).map(|x| x as f64),
    }
}

/// Short human description of a metadata value for error messages and
/// `inspect` (arrays are summarised, never dumped: vocabularies are huge).
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() > 80 => format!("string of {} bytes", s.len()),
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!("array of {} values", a.len()),
        Value::Bool(b) => b.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        other => value_as_usize(other)
            .map(|x| x.to_string())
            .unwrap_or_else(|| format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 file with one tensor `w` of GGML type `ty`, `[rows, cols]`.
    fn one_tensor(ty: u32, rows: usize, cols: usize, data: &[u8]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut f = b"GGUF".to_vec();
        f.extend_from_slice(&3u32.to_le_bytes());
        f.extend_from_slice(&1u64.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        f.extend_from_slice(&1u64.to_le_bytes());
        f.push(b'w');
        f.extend_from_slice(&2u32.to_le_bytes());
        f.extend_from_slice(&(cols as u64).to_le_bytes());
        f.extend_from_slice(&(rows as u64).to_le_bytes());
        f.extend_from_slice(&ty.to_le_bytes());
        f.extend_from_slice(&0u64.to_le_bytes());
        f.resize(f.len().div_ceil(32) * 32, 0);
        f.extend_from_slice(data);
        std::fs::write(dir.path().join("m.gguf"), f).unwrap();
        dir
    }

    /// A type this engine does not compute with is named (GGML's name, not
    /// an id), with the file and the tensor, when the tensor is bound.
    #[test]
    fn unsupported_types_are_named_with_file_and_tensor() {
        // IQ3_S: 110 bytes per 256 values.
        let dir = one_tensor(21, 2, 256, &[0; 220]);
        let path = dir.path().join("m.gguf");
        let mut g = GgufFile::open(&path).unwrap();
        assert_eq!(g.tensor_type_name("w"), Some("IQ3_S"));
        let err = g.tensor("w", &[2, 256]).unwrap_err().to_string();
        assert!(err.contains("m.gguf") && err.contains("`w`"), "{err}");
        assert!(
            err.contains("stored as IQ3_S") && err.contains("IQ2_XXS"),
            "{err}"
        );
    }

    /// A stored tensor comes back as a view in its type; a wrong shape and
    /// a missing tensor are refused by name; strict binding names what is
    /// left.
    #[test]
    fn tensors_are_views_checked_by_shape() {
        // Q8_0: 2 rows of 32 values, d = 1.0 (f16 0x3c00), q = row index.
        let mut data = Vec::new();
        for r in 0..2u8 {
            data.extend_from_slice(&[0x00, 0x3c]);
            data.extend(std::iter::repeat_n(r, 32));
        }
        let dir = one_tensor(8, 2, 32, &data);
        let path = dir.path().join("m.gguf");
        let mut g = GgufFile::open(&path).unwrap();
        let err = g.tensor("w", &[32, 2]).unwrap_err().to_string();
        assert!(err.contains("wrong shape"), "{err}");
        assert!(g.finish().unwrap_err().to_string().contains("`w`"));
        let err = g.tensor("v", &[2, 32]).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        let t = g.tensor("w", &[2, 32]).unwrap();
        assert_eq!(t.ty, WeightType::Q8_0);
        let v = t.to_f32_vec();
        assert!(v[..32].iter().all(|&x| x == 0.0) && v[32..].iter().all(|&x| x == 1.0));
        g.finish().unwrap();
    }
}
