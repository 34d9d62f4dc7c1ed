//! A checkpoint in Hugging Face's tensor names and configuration: a
//! safetensors directory, or a single GGUF file in the same names with the
//! `config.json` text embedded under [`HF_CONFIG_KEY`] (this project's GGUF
//! layout for families llama.cpp and ds4 have no layout for; documented in
//! `docs/GGUF-LAYOUTS.md`). A family's loader binds either the same way and
//! never sees the container.

use std::path::{Path, PathBuf};

use super::binder::WeightSource;
use super::gguf::GgufFile;
use super::safetensors::{CONFIG_FILE, SafetensorsDir};
use super::{ModelFormat, detect};
use crate::error::{EngineError, Result};

/// The GGUF metadata key holding the checkpoint's `config.json` text.
pub const HF_CONFIG_KEY: &str = "ds4server.hf_config";

enum Source {
    Dir(SafetensorsDir),
    Gguf(GgufFile),
}

/// A checkpoint opened for binding.
pub struct HfCheckpoint {
    source: Source,
    config: serde_json::Value,
    config_path: PathBuf,
}

impl HfCheckpoint {
    /// Open a directory or a GGUF file in Hugging Face names.
    pub fn open(path: &Path) -> Result<Self> {
        match detect(path)? {
            ModelFormat::HfDir => {
                let st = SafetensorsDir::open(path)?;
                Ok(Self {
                    config: st.config().clone(),
                    config_path: st.config_path(),
                    source: Source::Dir(st),
                })
            }
            ModelFormat::Gguf => {
                let g = GgufFile::open(path)?;
                let config = embedded_config(&g)?.ok_or_else(|| EngineError::Config {
                    path: path.to_path_buf(),
                    field: HF_CONFIG_KEY.into(),
                    message: format!(
                        "missing: a GGUF in Hugging Face names carries its {CONFIG_FILE} under this key"
                    ),
                })?;
                Ok(Self {
                    config,
                    config_path: path.to_path_buf(),
                    source: Source::Gguf(g),
                })
            }
        }
    }

    pub fn config(&self) -> &serde_json::Value {
        &self.config
    }

    /// What configuration errors name: `config.json`, or the GGUF file.
    pub fn config_path(&self) -> PathBuf {
        self.config_path.clone()
    }

    pub fn source(&mut self) -> &mut dyn WeightSource {
        match &mut self.source {
            Source::Dir(d) => d,
            Source::Gguf(g) => g,
        }
    }

    pub fn has(&self, name: &str) -> bool {
        match &self.source {
            Source::Dir(d) => d.has(name),
            Source::Gguf(g) => g.has_tensor(name),
        }
    }

    /// Mark every tensor whose name starts with `prefix` as unused on
    /// purpose (a vision tower beside a text model).
    pub fn ignore_prefix(&mut self, prefix: &str) {
        let names: Vec<String> = self
            .source()
            .names()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .collect();
        for n in names {
            self.source().ignore(&n);
        }
    }

    /// Strict binding (see [`WeightSource::finish`]).
    pub fn finish(&mut self, ignored: &[&str]) -> Result<()> {
        self.source().finish(ignored)
    }
}

/// The embedded `config.json` of a GGUF in Hugging Face names, if any.
pub fn embedded_config(g: &GgufFile) -> Result<Option<serde_json::Value>> {
    let Some(text) = g.opt_string(HF_CONFIG_KEY)? else {
        return Ok(None);
    };
    let config: serde_json::Value =
        serde_json::from_str(text).map_err(|e| EngineError::Config {
            path: g.path().to_path_buf(),
            field: HF_CONFIG_KEY.into(),
            message: format!("invalid JSON: {e}"),
        })?;
    if !config.is_object() {
        return Err(EngineError::Config {
            path: g.path().to_path_buf(),
            field: HF_CONFIG_KEY.into(),
            message: "expected a JSON object".into(),
        });
    }
    Ok(Some(config))
}
