//! GGUF reader: typed metadata accessors and strict tensor binding.
//!
//! Tensors come back as candle [`QTensor`]s (shape row-major, `[out, in]` for
//! weight matrices, as candle reverses GGUF's dimension order). Every tensor
//! taken is recorded; [`GgufFile::finish`] fails on any tensor the family
//! never asked for, so a file with an unexpected layout cannot load silently.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};

use crate::error::{EngineError, Result};

pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: Tracked<BufReader<File>>,
    taken: BTreeSet<String>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| EngineError::File {
            path: path.to_path_buf(),
            message: format!("cannot open: {e}"),
        })?;
        let mut reader = Tracked::at_start(BufReader::new(file));
        let content = Content::read(&mut reader).map_err(|e| EngineError::File {
            path: path.to_path_buf(),
            message: format!("not a readable GGUF file: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
            taken: BTreeSet::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn content(&self) -> &Content {
        &self.content
    }

    fn config_err(&self, key: &str, message: impl Into<String>) -> EngineError {
        EngineError::Config {
            path: self.path.clone(),
            field: key.to_string(),
            message: message.into(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
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
        self.content.tensor_infos.contains_key(name)
    }

    /// Shape (row-major) and storage type of a tensor, without reading it.
    pub fn tensor_meta(&self, name: &str) -> Option<(Vec<usize>, GgmlDType)> {
        self.content
            .tensor_infos
            .get(name)
            .map(|i| (i.shape.dims().to_vec(), i.ggml_dtype))
    }

    /// Read tensor `name`, checking its shape, and mark it used.
    pub fn tensor(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<QTensor> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(EngineError::Tensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                message: format!("missing (expected shape {shape:?})"),
            });
        };
        if info.shape.dims() != shape {
            return Err(EngineError::Tensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                message: format!(
                    "wrong shape: expected {shape:?}, found {:?}",
                    info.shape.dims()
                ),
            });
        }
        let t = info
            .read(&mut self.reader, self.content.tensor_data_offset, device)
            .map_err(|e| EngineError::Tensor {
                path: self.path.clone(),
                tensor: name.to_string(),
                message: format!("cannot read: {e}"),
            })?;
        self.taken.insert(name.to_string());
        Ok(t)
    }

    /// Strict binding: every tensor in the file must have been taken.
    pub fn finish(&self) -> Result<()> {
        let mut left: Vec<&str> = self
            .content
            .tensor_infos
            .keys()
            .filter(|k| !self.taken.contains(*k))
            .map(String::as_str)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        left.sort_unstable();
        Err(EngineError::Tensor {
            path: self.path.clone(),
            tensor: left.join("`, `"),
            message: "present in the file but not used by the model".into(),
        })
    }
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

/// A reader that knows its own position. candle's GGUF parser asks for the
/// position before every length-prefixed value (a bounds check), and a
/// `BufReader<File>` answers with an `lseek` system call each time: about
/// 98,000 for the default model's vocabulary and merges, per parse.
#[derive(Debug)]
struct Tracked<R> {
    inner: R,
    pos: u64,
}

impl<R> Tracked<R> {
    /// `inner` positioned at its start (a freshly opened file).
    fn at_start(inner: R) -> Self {
        Self { inner, pos: 0 }
    }
}

impl<R: Read> Read for Tracked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Seek> Seek for Tracked<R> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        if to == SeekFrom::Current(0) {
            return Ok(self.pos);
        }
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }

    fn stream_position(&mut self) -> std::io::Result<u64> {
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cached position follows every read and seek of the inner reader.
    #[test]
    fn tracked_position_follows_reads_and_seeks() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut r = Tracked::at_start(BufReader::with_capacity(64, std::io::Cursor::new(data)));
        let mut buf = [0u8; 37];
        let check = |r: &mut Tracked<BufReader<std::io::Cursor<Vec<u8>>>>, want: u64| {
            assert_eq!(r.stream_position().unwrap(), want);
            // The seek form of the question, which readers may ask too.
            #[allow(clippy::seek_from_current)]
            let by_seek = r.seek(SeekFrom::Current(0)).unwrap();
            assert_eq!(by_seek, want);
            assert_eq!(r.inner.stream_position().unwrap(), want);
        };
        r.read_exact(&mut buf).unwrap();
        check(&mut r, 37);
        assert_eq!(buf[36], 36);
        r.seek(SeekFrom::Start(500)).unwrap();
        check(&mut r, 500);
        r.read_exact(&mut buf[..1]).unwrap();
        assert_eq!(buf[0], (500 % 256) as u8);
        r.seek(SeekFrom::Current(-101)).unwrap();
        check(&mut r, 400);
        assert_eq!(r.seek(SeekFrom::End(-10)).unwrap(), 990);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert_eq!(rest.len(), 10);
        check(&mut r, 1000);
    }
}
