//! Hugging Face checkpoint directory: `config.json` plus either one
//! `model.safetensors` or shards listed by `model.safetensors.index.json`.
//!
//! Files are memory-mapped; a tensor's bytes are read from the map only when
//! the family binds it and are converted to f32 on the way (f32, bf16 and f16
//! are accepted; CPU kernels are fastest in f32, and the copy is needed anyway
//! because candle's CPU storage owns its buffer). Binding is strict: a missing
//! tensor, a wrong shape or a tensor nobody used (outside a documented
//! ignore set) is an error naming the file and the tensor.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{Device, Tensor};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{EngineError, Result};

pub const CONFIG_FILE: &str = "config.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Where one tensor lives.
#[derive(Debug, Clone)]
pub struct StEntry {
    /// Index into the shard list.
    file: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the mapped file.
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    map: Arc<Mmap>,
}

pub struct SafetensorsDir {
    dir: PathBuf,
    config: serde_json::Value,
    shards: Vec<Shard>,
    entries: BTreeMap<String, StEntry>,
    taken: BTreeSet<String>,
}

fn file_err(path: &Path, message: impl Into<String>) -> EngineError {
    EngineError::File {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl SafetensorsDir {
    pub fn open(dir: &Path) -> Result<Self> {
        let config_path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path)
            .map_err(|e| file_err(&config_path, format!("cannot read: {e}")))?;
        let config: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| file_err(&config_path, format!("invalid JSON: {e}")))?;
        if !config.is_object() {
            return Err(file_err(&config_path, "expected a JSON object"));
        }

        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        // `weight_map` of the index, when sharded: checked against the shards.
        let (files, weight_map) = if index_path.exists() {
            let text = std::fs::read_to_string(&index_path)
                .map_err(|e| file_err(&index_path, format!("cannot read: {e}")))?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| file_err(&index_path, format!("invalid JSON: {e}")))?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| EngineError::Config {
                    path: index_path.clone(),
                    field: "weight_map".into(),
                    message: "missing or not an object".into(),
                })?;
            let mut weight_map = BTreeMap::new();
            let mut files = BTreeSet::new();
            for (name, file) in map {
                let file = file.as_str().ok_or_else(|| EngineError::Config {
                    path: index_path.clone(),
                    field: format!("weight_map.{name}"),
                    message: "expected a file name string".into(),
                })?;
                if file.contains('/') || file.contains('\\') || file == ".." {
                    return Err(EngineError::Config {
                        path: index_path.clone(),
                        field: format!("weight_map.{name}"),
                        message: format!("shard name `{file}` must be a plain file name"),
                    });
                }
                files.insert(file.to_string());
                weight_map.insert(name.clone(), file.to_string());
            }
            (files.into_iter().collect::<Vec<_>>(), Some(weight_map))
        } else if single_path.exists() {
            (vec![SINGLE_FILE.to_string()], None)
        } else {
            return Err(file_err(
                dir,
                format!("neither {SINGLE_FILE} nor {INDEX_FILE} found"),
            ));
        };

        let mut shards = Vec::with_capacity(files.len());
        let mut entries = BTreeMap::new();
        for (i, name) in files.iter().enumerate() {
            let path = dir.join(name);
            let file =
                File::open(&path).map_err(|e| file_err(&path, format!("cannot open: {e}")))?;
            // SAFETY: the map is read-only; a checkpoint rewritten while we
            // run is outside what any loader can defend against.
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| file_err(&path, format!("cannot memory-map: {e}")))?;
            let (header_len, metadata) = SafeTensors::read_metadata(&map)
                .map_err(|e| file_err(&path, format!("not a valid safetensors file: {e}")))?;
            let data_start = 8 + header_len;
            for (tname, info) in metadata.tensors() {
                let (s, e) = info.data_offsets;
                let (start, end) = (data_start + s, data_start + e);
                if end > map.len() || start > end {
                    return Err(EngineError::Tensor {
                        path: path.clone(),
                        tensor: tname,
                        message: "data offsets outside the file".into(),
                    });
                }
                if let Some(prev) = entries.get(&tname) {
                    let prev: &StEntry = prev;
                    return Err(EngineError::Tensor {
                        path: path.clone(),
                        tensor: tname,
                        message: format!("also stored in {}", files[prev.file]),
                    });
                }
                entries.insert(
                    tname,
                    StEntry {
                        file: i,
                        dtype: info.dtype,
                        shape: info.shape.clone(),
                        start,
                        end,
                    },
                );
            }
            shards.push(Shard {
                path,
                map: Arc::new(map),
            });
        }

        if let Some(weight_map) = weight_map {
            for (tname, file) in &weight_map {
                match entries.get(tname) {
                    Some(e) if files[e.file] == *file => {}
                    Some(e) => {
                        return Err(EngineError::Tensor {
                            path: index_path.clone(),
                            tensor: tname.clone(),
                            message: format!("index says {file}, found in {}", files[e.file]),
                        });
                    }
                    None => {
                        return Err(EngineError::Tensor {
                            path: dir.join(file),
                            tensor: tname.clone(),
                            message: format!("listed in {INDEX_FILE} but missing from the shard"),
                        });
                    }
                }
            }
            for tname in entries.keys() {
                if !weight_map.contains_key(tname) {
                    return Err(EngineError::Tensor {
                        path: index_path.clone(),
                        tensor: tname.clone(),
                        message: "stored in a shard but not listed in the index".into(),
                    });
                }
            }
        }

        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            shards,
            entries,
            taken: BTreeSet::new(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// All tensors with their metadata, sorted by name.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &StEntry)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The file holding `name` (the directory when absent).
    pub fn file_of(&self, name: &str) -> PathBuf {
        self.entries
            .get(name)
            .map(|e| self.shards[e.file].path.clone())
            .unwrap_or_else(|| self.dir.clone())
    }

    /// Bind tensor `name` as f32 on `device`, checking its shape.
    pub fn tensor(&mut self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        let Some(entry) = self.entries.get(name) else {
            return Err(EngineError::Tensor {
                path: self.dir.clone(),
                tensor: name.to_string(),
                message: format!("missing from every safetensors file (expected shape {shape:?})"),
            });
        };
        let shard = &self.shards[entry.file];
        let err = |message: String| EngineError::Tensor {
            path: shard.path.clone(),
            tensor: name.to_string(),
            message,
        };
        if entry.shape != shape {
            return Err(err(format!(
                "wrong shape: expected {shape:?}, found {:?}",
                entry.shape
            )));
        }
        let bytes = &shard.map[entry.start..entry.end];
        let n: usize = shape.iter().product();
        let width = match entry.dtype {
            Dtype::F32 => 4,
            Dtype::BF16 | Dtype::F16 => 2,
            other => return Err(err(format!("unsupported dtype {other:?} (f32, bf16, f16)"))),
        };
        if bytes.len() != n * width {
            return Err(err(format!(
                "{} data bytes for {n} {:?} elements",
                bytes.len(),
                entry.dtype
            )));
        }
        // The map gives no alignment guarantee for the element type, so
        // decode from little-endian byte chunks rather than casting.
        let data: Vec<f32> = match entry.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        let t = Tensor::from_vec(data, shape, device).map_err(|e| err(e.to_string()))?;
        self.taken.insert(name.to_string());
        Ok(t)
    }

    /// An integer tensor (i64 / i32, e.g. a hash-routing table) as `u32`
    /// values; a negative or larger value is refused naming the tensor.
    pub fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        let Some(entry) = self.entries.get(name) else {
            return Err(EngineError::Tensor {
                path: self.dir.clone(),
                tensor: name.to_string(),
                message: format!("missing from every safetensors file (expected shape {shape:?})"),
            });
        };
        let shard = &self.shards[entry.file];
        let err = |message: String| EngineError::Tensor {
            path: shard.path.clone(),
            tensor: name.to_string(),
            message,
        };
        if entry.shape != shape {
            return Err(err(format!(
                "wrong shape: expected {shape:?}, found {:?}",
                entry.shape
            )));
        }
        let bytes = &shard.map[entry.start..entry.end];
        let n: usize = shape.iter().product();
        let values: Vec<i64> = match entry.dtype {
            Dtype::I64 if bytes.len() == 8 * n => bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect(),
            Dtype::I32 if bytes.len() == 4 * n => bytes
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
                .collect(),
            other => {
                return Err(err(format!(
                    "expected {n} i64 or i32 values, found {} bytes of {other:?}",
                    bytes.len()
                )));
            }
        };
        let ids = values
            .iter()
            .map(|&v| u32::try_from(v).map_err(|_| err(format!("value {v} is not an index"))))
            .collect::<Result<Vec<u32>>>()?;
        self.taken.insert(name.to_string());
        Ok(ids)
    }

    /// A tensor's entry, its shard's path and map (for the stored-weight
    /// reader, `super::stored`).
    pub(crate) fn raw_entry(&self, name: &str) -> Option<(&StEntry, &Path, &Arc<Mmap>)> {
        self.entries.get(name).map(|e| {
            let shard = &self.shards[e.file];
            (e, shard.path.as_path(), &shard.map)
        })
    }

    /// The byte range of an entry in its shard's map.
    pub fn range_of(e: &StEntry) -> std::ops::Range<usize> {
        e.start..e.end
    }

    /// Mark a tensor as used (the stored-weight reader binds tensors and
    /// their scale companions without going through [`Self::tensor`]).
    pub(crate) fn take(&mut self, name: &str) {
        self.taken.insert(name.to_string());
    }

    /// Mark a tensor as deliberately unused (it must exist).
    pub fn ignore(&mut self, name: &str) {
        if self.entries.contains_key(name) {
            self.taken.insert(name.to_string());
        }
    }

    /// Strict binding: every tensor must have been bound, or match one of
    /// `ignored` (suffixes of tensors that carry no information we need).
    pub fn finish(&self, ignored: &[&str]) -> Result<()> {
        let left: Vec<&String> = self
            .entries
            .keys()
            .filter(|k| !self.taken.contains(*k) && !ignored.iter().any(|s| k.ends_with(s)))
            .collect();
        let Some(first) = left.first() else {
            return Ok(());
        };
        let names: Vec<&str> = left.iter().map(|s| s.as_str()).collect();
        Err(EngineError::Tensor {
            path: self.file_of(first),
            tensor: names.join("`, `"),
            message: "present in the checkpoint but not used by the model".into(),
        })
    }
}
