//! A model state (or MTP history, or a whole session) as a table of named
//! host tensors: what a checkpoint file stores and what
//! [`crate::ModelState::import`] rebuilds a state from.
//!
//! Importers take tensors in the order the exporter wrote them and check
//! each name and length against the fresh state of the same model, so a
//! table from another architecture is refused instead of misread.

use std::collections::VecDeque;

use crate::error::{EngineError, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

impl TensorData {
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::U32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl NamedTensor {
    pub fn f32(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> Self {
        Self {
            name: name.into(),
            shape,
            data: TensorData::F32(data),
        }
    }

    pub fn u32(name: impl Into<String>, shape: Vec<usize>, data: Vec<u32>) -> Self {
        Self {
            name: name.into(),
            shape,
            data: TensorData::U32(data),
        }
    }

    /// Bytes of payload (both dtypes are 4 bytes wide).
    pub fn byte_len(&self) -> usize {
        4 * self.data.len()
    }

    /// The same tensor under `prefix` + its name.
    pub fn prefixed(mut self, prefix: &str) -> Self {
        self.name = format!("{prefix}{}", self.name);
        self
    }
}

/// Tensors consumed in order by an importer.
pub struct TableReader {
    items: VecDeque<NamedTensor>,
    what: &'static str,
}

impl TableReader {
    pub fn new(items: Vec<NamedTensor>, what: &'static str) -> Self {
        Self {
            items: items.into(),
            what,
        }
    }

    fn next(&mut self, name: &str, len: usize) -> Result<NamedTensor> {
        let t = self.items.pop_front().ok_or_else(|| {
            EngineError::State(format!("{}: state table ends before `{name}`", self.what))
        })?;
        if t.name != name {
            return Err(EngineError::State(format!(
                "{}: state table has `{}` where `{name}` was expected",
                self.what, t.name
            )));
        }
        let elems = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if t.data.len() != len || elems != Some(len) {
            return Err(EngineError::State(format!(
                "{}: `{name}` holds {} values with shape {:?}, the model needs {len}",
                self.what,
                t.data.len(),
                t.shape
            )));
        }
        Ok(t)
    }

    pub fn f32(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        match self.next(name, len)?.data {
            TensorData::F32(v) => Ok(v),
            TensorData::U32(_) => Err(EngineError::State(format!(
                "{}: `{name}` is u32, f32 expected",
                self.what
            ))),
        }
    }

    pub fn u32(&mut self, name: &str, len: usize) -> Result<Vec<u32>> {
        match self.next(name, len)?.data {
            TensorData::U32(v) => Ok(v),
            TensorData::F32(_) => Err(EngineError::State(format!(
                "{}: `{name}` is f32, u32 expected",
                self.what
            ))),
        }
    }

    /// Shape of the next tensor, without consuming it.
    pub fn peek_shape(&self) -> Option<&[usize]> {
        self.items.front().map(|t| t.shape.as_slice())
    }

    /// Leading dimension of the next tensor (the importer's row count),
    /// without consuming it.
    pub fn peek_rows(&self, name: &str) -> Result<usize> {
        match self.items.front() {
            Some(t) if t.name == name => Ok(t.shape.first().copied().unwrap_or(0)),
            Some(t) => Err(EngineError::State(format!(
                "{}: state table has `{}` where `{name}` was expected",
                self.what, t.name
            ))),
            None => Err(EngineError::State(format!(
                "{}: state table ends before `{name}`",
                self.what
            ))),
        }
    }

    /// Every tensor was consumed.
    pub fn finish(self) -> Result<()> {
        match self.items.front() {
            None => Ok(()),
            Some(t) => Err(EngineError::State(format!(
                "{}: unexpected extra tensor `{}` in the state table",
                self.what, t.name
            ))),
        }
    }
}
