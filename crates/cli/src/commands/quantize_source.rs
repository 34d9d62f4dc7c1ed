//! What `ds4server quantize` reads: a Hugging Face directory (F32, BF16,
//! F16, FP8 E4M3 with block scales, DeepSeek's FP4 experts, integer
//! tables) or a GGUF (any type the engine dequantizes), through the
//! engine's own loaders. Tensors are memory-mapped views; the command
//! dequantizes a bounded number of rows at a time and releases each
//! tensor's pages when it is written, so memory stays a few tensors wide
//! whatever the checkpoint's size.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use ds4_engine::backend::HostWeight;
use ds4_engine::load::ModelFormat;
use ds4_engine::load::gguf::GgufFile;
use ds4_engine::load::safetensors::SafetensorsDir;
use ds4_engine::load::stored;
use ds4_engine::quant::QuantTensor;
use ds4_gguf::Value;
use safetensors::Dtype;

/// A source tensor's kind: values to quantize, or integer ids copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Float,
    /// Integer table (DeepSeek's `tid2eid`); the GGML integer type id it
    /// is stored as in the source (26 I32, 27 I64).
    Ids(u32),
}

/// One tensor of the source: logical row-major dims and kind.
#[derive(Debug, Clone)]
pub struct SourceTensor {
    pub dims: Vec<usize>,
    pub kind: Kind,
}

enum Files {
    Dir(SafetensorsDir),
    Gguf(GgufFile),
}

/// An opened source.
pub struct Source {
    pub path: PathBuf,
    pub format: ModelFormat,
    files: Files,
    /// Every value-carrying tensor (scale companions folded into their
    /// weight), by name.
    pub tensors: BTreeMap<String, SourceTensor>,
}

/// Scale companions of a safetensors weight: `<w>_scale_inv` or
/// `<prefix>.scale` beside `<prefix>.weight`.
fn scale_of(name: &str, all: &BTreeMap<String, (Dtype, Vec<usize>)>) -> Option<String> {
    if let Some(w) = name.strip_suffix("_scale_inv")
        && all.contains_key(w)
    {
        return Some(w.to_string());
    }
    let p = name.strip_suffix(".scale")?;
    let w = format!("{p}.weight");
    all.contains_key(&w).then_some(w)
}

impl Source {
    pub fn open(path: &Path) -> Result<Self> {
        let format = ds4_engine::load::detect(path)?;
        let mut tensors = BTreeMap::new();
        let files = match format {
            ModelFormat::HfDir => {
                let dir = SafetensorsDir::open(path)?;
                let all: BTreeMap<String, (Dtype, Vec<usize>)> = dir
                    .entries()
                    .map(|(n, e)| (n.to_string(), (e.dtype, e.shape.clone())))
                    .collect();
                for (name, (dtype, shape)) in &all {
                    if scale_of(name, &all).is_some() {
                        continue;
                    }
                    let (dims, kind) = match dtype {
                        Dtype::F32 | Dtype::BF16 | Dtype::F16 | Dtype::F8_E4M3 | Dtype::F4 => {
                            (shape.clone(), Kind::Float)
                        }
                        // FP4 pairs: two values per byte.
                        Dtype::I8 => {
                            let mut d = shape.clone();
                            if let Some(last) = d.last_mut() {
                                *last *= 2;
                            }
                            (d, Kind::Float)
                        }
                        Dtype::I64 => (shape.clone(), Kind::Ids(27)),
                        Dtype::I32 => (shape.clone(), Kind::Ids(26)),
                        other => bail!(
                            "{}: tensor `{name}` is stored as {other:?}, which quantize does not read (F32, BF16, F16, F8_E4M3 with scales, FP4 as I8/F4 with scales, I32/I64 tables)",
                            dir.file_of(name).display()
                        ),
                    };
                    tensors.insert(name.clone(), SourceTensor { dims, kind });
                }
                Files::Dir(dir)
            }
            ModelFormat::Gguf => {
                let g = GgufFile::open(path)?;
                for name in &g.container().order {
                    let info = &g.container().tensors[name];
                    let kind = match info.ggml_type {
                        26 | 27 => Kind::Ids(info.ggml_type),
                        _ => Kind::Float,
                    };
                    tensors.insert(
                        name.clone(),
                        SourceTensor {
                            dims: info.dims.clone(),
                            kind,
                        },
                    );
                }
                Files::Gguf(g)
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            format,
            files,
            tensors,
        })
    }

    /// The file a tensor lives in (for errors).
    pub fn file_of(&self, name: &str) -> PathBuf {
        match &self.files {
            Files::Dir(d) => d.file_of(name),
            Files::Gguf(_) => self.path.clone(),
        }
    }

    /// The config.json of a directory.
    pub fn hf_config(&self) -> Option<&serde_json::Value> {
        match &self.files {
            Files::Dir(d) => Some(d.config()),
            Files::Gguf(_) => None,
        }
    }

    /// The GGUF's metadata in file order.
    pub fn gguf_metadata(&self) -> Option<Vec<(String, Value)>> {
        match &self.files {
            Files::Dir(_) => None,
            Files::Gguf(g) => {
                let c = g.container();
                Some(
                    c.keys
                        .iter()
                        .map(|k| (k.clone(), c.metadata[k].clone()))
                        .collect(),
                )
            }
        }
    }

    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.files {
            Files::Gguf(g) => Some(g),
            Files::Dir(_) => None,
        }
    }

    /// `name` as a stored tensor view (scales attached), checked against
    /// its listed dims.
    pub fn values(&mut self, name: &str) -> Result<QuantTensor> {
        let dims = self.dims(name)?;
        match &mut self.files {
            Files::Dir(d) => {
                let dtype = d.entries().find(|(n, _)| *n == name).map(|(_, e)| e.dtype);
                let w = match dtype {
                    Some(Dtype::F32 | Dtype::BF16 | Dtype::F16) => {
                        stored::view_any(d, name, &dims)?
                    }
                    _ => match stored::read(d, name, &dims)? {
                        HostWeight::Quant(q) => Arc::unwrap_or_clone(q),
                        _ => bail!(
                            "{}: tensor `{name}`: not a stored weight",
                            d.file_of(name).display()
                        ),
                    },
                };
                Ok(w)
            }
            Files::Gguf(g) => Ok(g.tensor(name, &dims)?),
        }
    }

    /// An integer table as i64 values.
    pub fn ids(&mut self, name: &str) -> Result<Vec<i64>> {
        // A missing tensor is refused by name here.
        self.dims(name)?;
        match &mut self.files {
            // The stored integers as they are (not only indices: Qwen's
            // PLE multipliers are I64 too).
            Files::Dir(d) => {
                use std::io::{Read, Seek, SeekFrom};
                let e = d
                    .entries()
                    .find(|(n, _)| *n == name)
                    .map(|(_, e)| e.clone())
                    .with_context(|| format!("no tensor `{name}`"))?;
                let path = d.file_of(name);
                let range = SafetensorsDir::range_of(&e);
                let mut b = vec![0u8; range.len()];
                let mut f = std::fs::File::open(&path)
                    .with_context(|| format!("{}: cannot open", path.display()))?;
                f.seek(SeekFrom::Start(range.start as u64))?;
                f.read_exact(&mut b)
                    .with_context(|| format!("{}: `{name}`: cannot read", path.display()))?;
                Ok(le_ints(&b, e.dtype == Dtype::I64))
            }
            // The GGUF's own integer bytes (I32 or I64), as stored.
            Files::Gguf(g) => {
                let c = g.container();
                let info = &c.tensors[name];
                let b = c.bytes(info);
                // GGML type 27 is I64, else I32.
                Ok(le_ints(b, info.ggml_type == 27))
            }
        }
    }

    fn dims(&self, name: &str) -> Result<Vec<usize>> {
        Ok(self
            .tensors
            .get(name)
            .with_context(|| format!("{}: no tensor `{name}`", self.path.display()))?
            .dims
            .clone())
    }
}

/// Little-endian integers, 8 bytes each (`wide`) or 4, as i64.
fn le_ints(b: &[u8], wide: bool) -> Vec<i64> {
    if wide {
        b.chunks_exact(8)
            .map(|x| i64::from_le_bytes(x.try_into().expect("8 bytes")))
            .collect()
    } else {
        b.chunks_exact(4)
            .map(|x| i32::from_le_bytes(x.try_into().expect("4 bytes")) as i64)
            .collect()
    }
}
