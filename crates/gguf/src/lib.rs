//! The GGUF container (`ggml/docs/gguf.md`): header, metadata and the tensor
//! directory, parsed from a memory map with every length and offset checked
//! against the file before anything is allocated or read. It knows tensor
//! types only as GGML ids (the engine decides which it computes with), so a
//! file with types another reader lacks (IQ2_XXS, MXFP4) still opens, and
//! the text crate can read a model's tokenizer from any GGUF.
//!
//! Metadata values use candle's `gguf_file::Value`, the type the engine and
//! the tokenizer already read.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use candle_core::quantized::gguf_file::Value;

pub mod write;
use memmap2::Mmap;
pub use write::{GgufWriter, TensorPlan, WriteError};

/// Where and what one tensor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Row-major shape (GGUF stores the innermost dimension first; this is
    /// reversed, so a weight matrix is `[out, in]`).
    pub dims: Vec<usize>,
    /// The GGML type id.
    pub ggml_type: u32,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
}

/// Why a file is not a readable GGUF; shown with the file's path.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (the magic is {found:?}, expected \"GGUF\")")]
    Magic { path: PathBuf, found: [u8; 4] },
    #[error("{path}: GGUF version {version} is not supported (2 and 3 are)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: malformed GGUF at byte {at}: {message}")]
    Malformed {
        path: PathBuf,
        at: usize,
        message: String,
    },
}

/// A parsed GGUF file; the map stays open for in-place tensor reads.
pub struct Gguf {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: HashMap<String, Value>,
    /// Keys in file order (for `inspect` and writers that copy metadata).
    pub keys: Vec<String>,
    pub tensors: BTreeMap<String, TensorInfo>,
    /// Tensor names in file order.
    pub order: Vec<String>,
    pub alignment: usize,
    /// Start of the tensor data section.
    pub data_offset: usize,
    pub map: Arc<Mmap>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// GGML's block geometry per type id, for the byte size of a tensor whose
/// type the engine may not compute with: (values per block, bytes per
/// block). `None` for ids GGML never defined.
pub fn ggml_block(ty: u32) -> Option<(usize, usize)> {
    Some(match ty {
        0 => (1, 4),
        1 => (1, 2),
        2 => (32, 18),
        3 => (32, 20),
        6 => (32, 22),
        7 => (32, 24),
        8 => (32, 34),
        9 => (32, 36),
        10 => (256, 84),
        11 => (256, 110),
        12 => (256, 144),
        13 => (256, 176),
        14 => (256, 210),
        15 => (256, 292),
        16 => (256, 66),
        17 => (256, 74),
        18 => (256, 98),
        19 => (256, 50),
        20 => (32, 18),
        21 => (256, 110),
        22 => (256, 82),
        23 => (256, 136),
        24 => (1, 1),
        25 => (1, 2),
        26 => (1, 4),
        27 => (1, 8),
        28 => (1, 8),
        29 => (256, 56),
        30 => (1, 2),
        34 => (256, 54),
        35 => (256, 66),
        39 => (32, 17),
        _ => return None,
    })
}

/// Bytes of a tensor of `dims` (row-major) and type `ty`; `None` when the
/// rows are not whole blocks, the type is unknown or the size overflows.
pub fn tensor_bytes(ty: u32, dims: &[usize]) -> Option<usize> {
    let (block, bytes) = ggml_block(ty)?;
    let cols = dims.last().copied().unwrap_or(1);
    if !cols.is_multiple_of(block) {
        return None;
    }
    let rows = dims[..dims.len().saturating_sub(1)]
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))?;
    rows.checked_mul(cols / block)?.checked_mul(bytes)
}

const MAX_DIMS: u32 = 8;

impl Gguf {
    /// Map and parse `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a file changed underneath by another
        // process is outside what any model reader can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Arc::new(map))
    }

    fn parse(path: &Path, map: Arc<Mmap>) -> Result<Self, GgufError> {
        let mut c = Cursor {
            b: &map[..],
            at: 0,
            path,
        };
        let magic: [u8; 4] = c.take(4)?.try_into().expect("4 bytes");
        if &magic != b"GGUF" {
            return Err(GgufError::Magic {
                path: path.to_path_buf(),
                found: magic,
            });
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        // Each entry takes at least 8 bytes: a count larger than the file
        // is malformed, and no vector is sized from it before that check.
        c.plausible(n_tensors, 8, "tensor count")?;
        c.plausible(n_kv, 8, "metadata count")?;
        let mut metadata = HashMap::new();
        let mut keys = Vec::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let ty = c.u32()?;
            let v = c.value(ty, 0)?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(c.err(format!("metadata key {key:?} appears twice")));
            }
            keys.push(key);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(Value::U32(a)) if *a > 0 && a.is_power_of_two() => *a as usize,
            Some(v) => {
                return Err(c.err(format!(
                    "general.alignment must be a power of two (u32), found {v:?}"
                )));
            }
        };
        let mut raw = Vec::new();
        for _ in 0..n_tensors {
            let name = c.string()?;
            let nd = c.u32()?;
            if nd > MAX_DIMS {
                return Err(c.err(format!("tensor {name:?} has {nd} dimensions")));
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                let d = c.u64()?;
                dims.push(usize::try_from(d).map_err(|_| c.err(format!("dimension {d}")))?);
            }
            dims.reverse();
            let ty = c.u32()?;
            let off = c.u64()?;
            raw.push((name, dims, ty, off));
        }
        let data_offset = c.at.div_ceil(alignment) * alignment;
        let mut tensors = BTreeMap::new();
        let mut order = Vec::with_capacity(raw.len());
        for (name, dims, ty, off) in raw {
            let at = c.at;
            let bad = |message: String| GgufError::Malformed {
                path: path.to_path_buf(),
                at,
                message: format!("tensor {name:?}: {message}"),
            };
            if ggml_block(ty).is_none() {
                return Err(bad(format!("unknown GGML type id {ty}")));
            }
            let size = tensor_bytes(ty, &dims).ok_or_else(|| {
                bad(format!(
                    "shape {dims:?} is not whole blocks of its type or is too large"
                ))
            })?;
            let start = usize::try_from(off)
                .ok()
                .and_then(|o| o.checked_add(data_offset))
                .ok_or_else(|| bad(format!("offset {off}")))?;
            if off % alignment as u64 != 0 {
                return Err(bad(format!("offset {off} is not aligned to {alignment}")));
            }
            let end = start
                .checked_add(size)
                .ok_or_else(|| bad(format!("offset {off}")))?;
            if end > map.len() {
                return Err(bad(format!(
                    "data ends at byte {end}, past the end of the file ({} bytes): the file is truncated",
                    map.len()
                )));
            }
            let info = TensorInfo {
                dims,
                ggml_type: ty,
                offset: start,
            };
            if tensors.insert(name.clone(), info).is_some() {
                return Err(bad("appears twice".into()));
            }
            order.push(name);
        }
        Ok(Gguf {
            path: path.to_path_buf(),
            version,
            metadata,
            keys,
            tensors,
            order,
            alignment,
            data_offset,
            map,
        })
    }

    /// The stored bytes of `info` (whose range `open` checked).
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        let size = tensor_bytes(info.ggml_type, &info.dims).expect("checked at open");
        &self.map[info.offset..info.offset + size]
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    path: &'a Path,
}

impl Cursor<'_> {
    fn err(&self, message: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            at: self.at,
            message,
        }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], GgufError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                self.err(format!(
                    "needs {n} more bytes, the file ends at {}: truncated",
                    self.b.len()
                ))
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn plausible(&self, n: u64, min_bytes: u64, what: &str) -> Result<(), GgufError> {
        let left = (self.b.len() - self.at) as u64;
        if n.saturating_mul(min_bytes) > left {
            return Err(self.err(format!("{what} {n} cannot fit in the {left} bytes left")));
        }
        Ok(())
    }

    fn u8(&mut self) -> Result<u8, GgufError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.u64()?;
        let n = usize::try_from(n).map_err(|_| self.err(format!("string of {n} bytes")))?;
        let at = self.at;
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::Malformed {
            path: self.path.to_path_buf(),
            at,
            message: "a string is not UTF-8".into(),
        })
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.u8()?),
            1 => Value::I8(self.u8()? as i8),
            2 => Value::U16(self.u16()?),
            3 => Value::I16(self.u16()? as i16),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(self.u32()? as i32),
            6 => Value::F32(f32::from_bits(self.u32()?)),
            7 => match self.u8()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("bool value {b}"))),
            },
            8 => Value::String(self.string()?),
            9 => {
                if depth > 2 {
                    return Err(self.err("arrays nested too deeply".into()));
                }
                let inner = self.u32()?;
                let n = self.u64()?;
                self.plausible(n, 1, "array length")?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            t => return Err(self.err(format!("unknown metadata value type {t}"))),
        })
    }
}

#[cfg(test)]
mod tests;
