//! One strict weight binder over safetensors directories and GGUF files,
//! with scoped prefixes: `w.pp("model.layers.3").pp("mlp").matrix("gate_proj",
//! ..)` binds `model.layers.3.mlp.gate_proj.weight`. Every tensor is checked
//! for shape when bound; the source's `finish` refuses tensors nobody bound.
//! Families receive a [`Binder`] and never see a file format or a device.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::Tensor;

use super::gguf::GgufFile;
use super::safetensors::SafetensorsDir;
use super::synthetic::SyntheticSource;
use crate::backend::{Backend, HostWeight};
use crate::error::{EngineError, Result};
use crate::quant::QuantTensor;

/// A file format that weights are bound from.
pub trait WeightSource {
    /// The file that holds `name` (for error messages).
    fn file_of(&self, name: &str) -> PathBuf;
    fn has(&self, name: &str) -> bool;
    /// Read `name` with row-major `shape`: f32 for float formats, kept
    /// block-quantized for quantized GGUF tensors.
    fn read(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight>;
    /// Read `name` as f32 (dequantized when stored quantized).
    fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor>;
    /// Mark a tensor as deliberately unused (no-op when absent).
    fn ignore(&mut self, name: &str);
    /// An integer tensor (expert ids of hash routing) as `u32` values.
    fn ids(&mut self, name: &str, _shape: &[usize]) -> Result<Vec<u32>> {
        Err(EngineError::Tensor {
            path: self.file_of(name),
            tensor: name.to_string(),
            message: "integer tensors are not read from this source".into(),
        })
    }
    /// `name` as a view of its stored bytes in any element type, f32
    /// included (tables gathered row by row on the host: PLE's n-gram
    /// table is ~95 GiB and must never be copied).
    fn view(&mut self, name: &str, _shape: &[usize]) -> Result<QuantTensor> {
        Err(EngineError::Tensor {
            path: self.file_of(name),
            tensor: name.to_string(),
            message: "this source has no stored bytes to map".into(),
        })
    }
    /// Every tensor name the source holds.
    fn names(&self) -> Vec<String> {
        Vec::new()
    }
    /// The stored shape of `name`, if present.
    fn dims(&self, _name: &str) -> Option<Vec<usize>> {
        None
    }
    /// Strict binding: every tensor taken, or ending in one of `ignored`.
    fn finish(&self, _ignored: &[&str]) -> Result<()> {
        Ok(())
    }
    /// The safetensors directory, for bindings that map shards directly.
    fn safetensors(&mut self) -> Option<&mut SafetensorsDir> {
        None
    }
    /// The synthetic source, for tensors it generates on demand.
    fn synthetic(&mut self) -> Option<&mut SyntheticSource> {
        None
    }
}

impl WeightSource for SafetensorsDir {
    fn file_of(&self, name: &str) -> PathBuf {
        SafetensorsDir::file_of(self, name)
    }

    fn has(&self, name: &str) -> bool {
        SafetensorsDir::has(self, name)
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        super::stored::read(self, name, shape)
    }

    fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        match super::stored::read(self, name, shape)? {
            HostWeight::F32(t) => Ok(t),
            other => other.to_f32(),
        }
    }

    fn ignore(&mut self, name: &str) {
        SafetensorsDir::ignore(self, name)
    }

    fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        SafetensorsDir::ids(self, name, shape)
    }

    fn view(&mut self, name: &str, shape: &[usize]) -> Result<QuantTensor> {
        super::stored::view_any(self, name, shape)
    }

    fn names(&self) -> Vec<String> {
        self.entries().map(|(n, _)| n.to_string()).collect()
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.raw_entry(name).map(|(e, _, _)| e.shape.clone())
    }

    fn finish(&self, ignored: &[&str]) -> Result<()> {
        SafetensorsDir::finish(self, ignored)
    }

    fn safetensors(&mut self) -> Option<&mut SafetensorsDir> {
        Some(self)
    }
}

impl WeightSource for GgufFile {
    fn file_of(&self, _name: &str) -> PathBuf {
        self.path().to_path_buf()
    }

    fn has(&self, name: &str) -> bool {
        self.has_tensor(name)
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        Ok(HostWeight::Quant(Arc::new(self.tensor(name, shape)?)))
    }

    fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        HostWeight::Quant(Arc::new(self.tensor(name, shape)?)).to_f32()
    }

    fn ignore(&mut self, name: &str) {
        GgufFile::ignore(self, name)
    }

    fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        GgufFile::ids(self, name, shape)
    }

    fn view(&mut self, name: &str, shape: &[usize]) -> Result<QuantTensor> {
        self.tensor(name, shape)
    }

    fn names(&self) -> Vec<String> {
        self.container().order.clone()
    }

    fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor_dims(name)
    }

    fn finish(&self, ignored: &[&str]) -> Result<()> {
        GgufFile::finish_except(self, ignored)
    }
}

/// A weight source scoped to a prefix, placing weights on a backend.
pub struct Binder<'a, B: Backend> {
    src: &'a mut dyn WeightSource,
    ops: &'a B,
    prefix: String,
}

impl<'a, B: Backend> Binder<'a, B> {
    pub fn new(src: &'a mut dyn WeightSource, ops: &'a B) -> Self {
        Self {
            src,
            ops,
            prefix: String::new(),
        }
    }

    /// The same source under `prefix.` (no dot added for an empty `sub`).
    pub fn pp(&mut self, sub: &str) -> Binder<'_, B> {
        let prefix = if sub.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}{sub}.", self.prefix)
        };
        Binder {
            src: &mut *self.src,
            ops: self.ops,
            prefix,
        }
    }

    pub fn ops(&self) -> &B {
        self.ops
    }

    /// The full name of `name` under this scope.
    pub fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub fn has(&self, name: &str) -> bool {
        self.src.has(&self.name(name))
    }

    /// The stored shape of `name` under this scope, if present.
    pub fn dims(&self, name: &str) -> Option<Vec<usize>> {
        self.src.dims(&self.name(name))
    }

    pub fn ignore(&mut self, name: &str) {
        let n = self.name(name);
        self.src.ignore(&n);
    }

    /// A weight matrix `{name}.weight`, `[out, in]`, placed on the backend.
    pub fn matrix(&mut self, name: &str, out: usize, inp: usize) -> Result<B::Matrix> {
        let n = self.name(&format!("{name}.weight"));
        let w = self.src.read(&n, &[out, inp])?;
        crate::observe::read(&n, &[out, inp]);
        self.ops.matrix(w, out, inp).map_err(|e| self.err(&n, e))
    }

    /// A tensor as a flat f32 device buffer.
    pub fn vector(&mut self, name: &str, shape: &[usize]) -> Result<B::Buf> {
        let host = self.host(name, shape)?;
        self.ops.upload(&host)
    }

    /// A tensor's values on the host (small parameters a layer transforms
    /// once at load, e.g. `−exp(A_log)`).
    pub fn host(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.tensor(name, shape)?.flatten_all()?.to_vec1::<f32>()?)
    }

    /// A tensor as a host f32 tensor (for stacking or fusing at load).
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let n = self.name(name);
        crate::observe::read(&n, shape);
        self.src.read_f32(&n, shape)
    }

    /// Several f32 tensors `[rows_i, cols]` stacked by rows into one weight
    /// (e.g. a shared expert's gate and up projections run as one matmul).
    pub fn fused_rows(
        &mut self,
        names: &[&str],
        rows: &[usize],
        cols: usize,
    ) -> Result<HostWeight> {
        if let Some(s) = self.src.synthetic() {
            // One synthetic weight of the fused shape (kept 4-bit).
            let name = names
                .iter()
                .map(|n| format!("{}{n}", self.prefix))
                .collect::<Vec<_>>()
                .join("+");
            return s.read(&name, &[rows.iter().sum(), cols]);
        }
        let parts = names
            .iter()
            .zip(rows)
            .map(|(n, &r)| self.raw(n, &[r, cols]))
            .collect::<Result<Vec<_>>>()?;
        self.join_rows(names, parts, cols)
    }

    /// Weights of one width joined by rows: stored types stay stored (one
    /// type for all, views of the same bytes), anything else is joined in
    /// f32.
    pub fn join_rows(
        &self,
        names: &[&str],
        parts: Vec<HostWeight>,
        cols: usize,
    ) -> Result<HostWeight> {
        let rows: usize = parts
            .iter()
            .map(|p| p.dims().iter().rev().skip(1).product::<usize>())
            .sum();
        let quant: Option<Vec<&QuantTensor>> = parts
            .iter()
            .map(|p| match p {
                HostWeight::Quant(q) => Some(&**q),
                _ => None,
            })
            .collect();
        if let Some(q) = quant {
            if q.iter().all(|t| t.ty == q[0].ty) {
                return QuantTensor::join(vec![rows, cols], &q)
                    .map(|t| HostWeight::Quant(Arc::new(t)))
                    .map_err(|e| self.invalid(names[0], e.to_string()));
            }
            // Different stored types: kept apart, each in its own type.
            return Ok(HostWeight::Rows(parts));
        }
        let f32s = parts
            .into_iter()
            .map(|p| p.to_f32()?.reshape(((), cols)).map_err(Into::into))
            .collect::<Result<Vec<_>>>()?;
        Ok(HostWeight::F32(Tensor::cat(&f32s, 0)?))
    }

    /// A tensor as read (quantized GGUF tensors stay quantized).
    pub fn raw(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        let n = self.name(name);
        crate::observe::read(&n, shape);
        self.src.read(&n, shape)
    }

    /// An embedding table `[rows, width]`.
    pub fn table(&mut self, name: &str, rows: usize, width: usize) -> Result<B::Table> {
        let n = self.name(name);
        let w = self.src.read(&n, &[rows, width])?;
        self.ops.table(w, rows, width).map_err(|e| self.err(&n, e))
    }

    /// An integer tensor as `u32` values.
    pub fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        let n = self.name(name);
        self.src.ids(&n, shape)
    }

    /// An error about the values of tensor `name` under this scope, naming
    /// its file.
    pub fn invalid(&self, name: &str, message: String) -> EngineError {
        let n = self.name(name);
        EngineError::Tensor {
            path: self.src.file_of(&n),
            tensor: n,
            message,
        }
    }

    /// The synthetic source behind this binder, if that is the source.
    pub fn synthetic(&mut self) -> Option<&mut SyntheticSource> {
        self.src.synthetic()
    }

    /// `name` as a view of its stored bytes (see [`WeightSource::view`]).
    pub fn view(&mut self, name: &str, shape: &[usize]) -> Result<QuantTensor> {
        let n = self.name(name);
        self.src.view(&n, shape)
    }

    /// The safetensors directory behind this binder, if that is the format.
    pub fn safetensors(&mut self) -> Option<&mut SafetensorsDir> {
        self.src.safetensors()
    }

    fn err(&self, name: &str, e: EngineError) -> EngineError {
        match e {
            e @ EngineError::Tensor { .. } => e,
            other => EngineError::Tensor {
                path: self.src.file_of(name),
                tensor: name.to_string(),
                message: other.to_string(),
            },
        }
    }
}
