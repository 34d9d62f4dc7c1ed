//! A streaming GGUF v3 writer (`ggml/docs/gguf.md`): the header — metadata
//! of every value type, arrays included, and the tensor directory with
//! offsets precomputed from each tensor's shape and type — is written
//! first, then the tensor data is appended in directory order as it is
//! produced, in chunks of any size. Nothing but the header and the caller's
//! current chunk is ever held in memory, which is what lets `ds4server
//! quantize` turn a 250 GB checkpoint into a GGUF on a small machine.
//!
//! Every tensor starts at a multiple of the alignment (`general.alignment`
//! when the metadata sets it, else 32) and is padded with zeros to the
//! next one, as llama.cpp's `gguf_write_to_file` does, so the file
//! [`crate::Gguf::open`] reads back has exactly the planned offsets.

use std::collections::HashSet;
use std::io::Write;

use crate::{Value, ggml_block, tensor_bytes};

/// The alignment GGUF uses when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;

/// One tensor of the directory: its name, row-major dims (the file stores
/// them reversed, innermost first) and GGML type id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub dims: Vec<usize>,
    pub ggml_type: u32,
}

/// Why a file cannot be planned or written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("writing the GGUF: {0}")]
    Io(#[from] std::io::Error),
    #[error("metadata key {key:?}: {message}")]
    Metadata { key: String, message: String },
    #[error("tensor {name:?}: {message}")]
    Tensor { name: String, message: String },
    #[error("tensor data out of order: {message} (tensors are written whole, in directory order)")]
    Order { message: String },
}

/// A tensor's place in the file, as planned.
#[derive(Debug, Clone)]
struct Slot {
    plan: TensorPlan,
    /// Offset from the start of the data section.
    offset: u64,
    bytes: u64,
}

/// Writes one GGUF into `W`: [`GgufWriter::new`] writes the header, then
/// [`GgufWriter::write`] appends tensor data, [`GgufWriter::finish`] checks
/// every tensor was written whole.
pub struct GgufWriter<W: Write> {
    out: W,
    slots: Vec<Slot>,
    alignment: u64,
    /// The tensor being written, and its bytes written so far.
    current: usize,
    done: u64,
    /// Bytes written to `out` so far.
    position: u64,
    data_start: u64,
}

impl<W: Write> std::fmt::Debug for GgufWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("tensors", &self.slots.len())
            .field("current", &self.current)
            .field("position", &self.position)
            .finish()
    }
}

/// GGUF's value type id of `v`.
fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// The alignment `metadata` asks for.
fn alignment_of(metadata: &[(String, Value)]) -> Result<usize, WriteError> {
    match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Value::U32(a))) if *a > 0 && a.is_power_of_two() => Ok(*a as usize),
        Some((k, v)) => Err(WriteError::Metadata {
            key: k.clone(),
            message: format!("must be a power of two (u32), found {v:?}"),
        }),
    }
}

/// Checks an array is homogeneous (GGUF arrays carry one element type),
/// recursively.
fn check_value(key: &str, v: &Value) -> Result<(), WriteError> {
    if let Value::Array(items) = v {
        if let Some(first) = items.first() {
            let ty = value_type(first);
            if let Some(i) = items.iter().position(|x| value_type(x) != ty) {
                return Err(WriteError::Metadata {
                    key: key.to_string(),
                    message: format!(
                        "array element {i} is of type {} but element 0 of type {ty}: GGUF arrays hold one type",
                        value_type(&items[i])
                    ),
                });
            }
        }
        for x in items {
            check_value(key, x)?;
        }
    }
    Ok(())
}

fn put_string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.push(*x as u8),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(*x as u8),
        Value::String(s) => put_string(b, s),
        Value::Array(items) => {
            // An empty array has no element to take a type from: it is
            // written as an array of strings (what llama.cpp's readers
            // expect of the empty arrays they know, e.g. merges).
            let inner = items.first().map_or(8, value_type);
            b.extend_from_slice(&inner.to_le_bytes());
            b.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for x in items {
                put_value(b, x);
            }
        }
    }
}

/// The header bytes (without the padding to the data section) and the
/// planned slots.
fn header(
    metadata: &[(String, Value)],
    tensors: &[TensorPlan],
    alignment: u64,
) -> Result<(Vec<u8>, Vec<Slot>), WriteError> {
    let mut keys = HashSet::new();
    for (k, v) in metadata {
        if !keys.insert(k.as_str()) {
            return Err(WriteError::Metadata {
                key: k.clone(),
                message: "appears twice".into(),
            });
        }
        check_value(k, v)?;
    }
    let mut names = HashSet::new();
    let mut slots = Vec::with_capacity(tensors.len());
    let mut offset = 0u64;
    for t in tensors {
        let bad = |message: String| WriteError::Tensor {
            name: t.name.clone(),
            message,
        };
        if !names.insert(t.name.as_str()) {
            return Err(bad("appears twice".into()));
        }
        if t.dims.is_empty() || t.dims.len() > 4 {
            return Err(bad(format!(
                "{} dimensions (GGML tensors have 1 to 4)",
                t.dims.len()
            )));
        }
        if ggml_block(t.ggml_type).is_none() {
            return Err(bad(format!("unknown GGML type id {}", t.ggml_type)));
        }
        let bytes = tensor_bytes(t.ggml_type, &t.dims).ok_or_else(|| {
            bad(format!(
                "shape {:?} is not whole blocks of type {} or is too large",
                t.dims, t.ggml_type
            ))
        })? as u64;
        slots.push(Slot {
            plan: t.clone(),
            offset,
            bytes,
        });
        offset = (offset + bytes).div_ceil(alignment) * alignment;
    }

    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_string(&mut b, k);
        b.extend_from_slice(&value_type(v).to_le_bytes());
        put_value(&mut b, v);
    }
    for s in &slots {
        put_string(&mut b, &s.plan.name);
        b.extend_from_slice(&(s.plan.dims.len() as u32).to_le_bytes());
        for d in s.plan.dims.iter().rev() {
            b.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        b.extend_from_slice(&s.plan.ggml_type.to_le_bytes());
        b.extend_from_slice(&s.offset.to_le_bytes());
    }
    Ok((b, slots))
}

/// The size of the file `metadata` and `tensors` make, in bytes (header,
/// padding and data), without writing anything.
pub fn planned_size(
    metadata: &[(String, Value)],
    tensors: &[TensorPlan],
) -> Result<u64, WriteError> {
    let alignment = alignment_of(metadata)? as u64;
    let (h, slots) = header(metadata, tensors, alignment)?;
    let data_start = (h.len() as u64).div_ceil(alignment) * alignment;
    let end = slots.last().map_or(0, |s| s.offset + s.bytes);
    Ok(data_start + end.div_ceil(alignment) * alignment)
}

const ZEROS: [u8; 64] = [0; 64];

impl<W: Write> GgufWriter<W> {
    /// Checks the plan (unique keys and names, homogeneous arrays, known
    /// types, whole blocks) and writes the header into `out`.
    pub fn new(
        mut out: W,
        metadata: &[(String, Value)],
        tensors: &[TensorPlan],
    ) -> Result<Self, WriteError> {
        let alignment = alignment_of(metadata)? as u64;
        let (h, slots) = header(metadata, tensors, alignment)?;
        out.write_all(&h)?;
        let mut w = GgufWriter {
            out,
            slots,
            alignment,
            current: 0,
            done: 0,
            position: h.len() as u64,
            data_start: 0,
        };
        w.pad()?;
        w.data_start = w.position;
        w.skip_empty();
        Ok(w)
    }

    fn pad(&mut self) -> Result<(), WriteError> {
        let mut n =
            (self.position.div_ceil(self.alignment) * self.alignment - self.position) as usize;
        self.position += n as u64;
        while n > 0 {
            let k = n.min(ZEROS.len());
            self.out.write_all(&ZEROS[..k])?;
            n -= k;
        }
        Ok(())
    }

    /// Zero-byte tensors (none of GGML's types makes one, but a caller's
    /// plan may) need no data: step over them.
    fn skip_empty(&mut self) {
        while self.current < self.slots.len() && self.slots[self.current].bytes == 0 {
            self.current += 1;
        }
    }

    /// The tensor the next [`Self::write`] continues, and the bytes it still
    /// needs; `None` once every tensor is whole.
    pub fn current(&self) -> Option<(&TensorPlan, u64)> {
        self.slots
            .get(self.current)
            .map(|s| (&s.plan, s.bytes - self.done))
    }

    /// Where each planned tensor starts, from the start of the file.
    pub fn offsets(&self) -> Vec<u64> {
        self.slots
            .iter()
            .map(|s| self.data_start + s.offset)
            .collect()
    }

    /// Appends `bytes` to the current tensor. A chunk never crosses into
    /// the next tensor: the current one's remaining bytes are the most one
    /// call takes. When a tensor is complete, the padding follows and the
    /// next tensor becomes current.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), WriteError> {
        if bytes.is_empty() {
            return Ok(());
        }
        let Some(slot) = self.slots.get(self.current) else {
            return Err(WriteError::Order {
                message: format!("{} bytes after the last tensor", bytes.len()),
            });
        };
        let left = slot.bytes - self.done;
        if bytes.len() as u64 > left {
            return Err(WriteError::Order {
                message: format!(
                    "{} bytes for tensor {:?}, which needs only {left} more",
                    bytes.len(),
                    slot.plan.name
                ),
            });
        }
        self.out.write_all(bytes)?;
        self.position += bytes.len() as u64;
        self.done += bytes.len() as u64;
        if self.done == slot.bytes {
            self.done = 0;
            self.current += 1;
            // Every tensor is padded, the last one too (llama.cpp's and
            // gguf-py's writers do the same).
            self.pad()?;
            self.skip_empty();
        }
        Ok(())
    }

    /// Checks every tensor was written whole, flushes, and hands back the
    /// output (a file is then the caller's to `sync_all` and rename).
    pub fn finish(mut self) -> Result<W, WriteError> {
        if let Some((plan, left)) = self.current() {
            return Err(WriteError::Order {
                message: format!(
                    "tensor {:?} still needs {left} bytes ({} tensors not written)",
                    plan.name,
                    self.slots.len() - self.current
                ),
            });
        }
        self.out.flush()?;
        Ok(self.out)
    }

    /// Bytes written so far (header and padding included).
    pub fn position(&self) -> u64 {
        self.position
    }
}

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;
