//! Model files: format detection, GGUF and safetensors readers with strict
//! binding, and `inspect` for the CLI.
//!
//! Entry points: [`detect`], [`binder::Binder`]; `crate::inspect` describes
//! a file.

pub mod binder;
pub mod checkpoint;
pub mod config_fields;
pub mod gguf;
pub mod safetensors;
pub mod stored;
pub mod synthetic;

use std::io::Read;
use std::path::Path;

use crate::error::{EngineError, Result};

/// How a model is stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ModelFormat {
    /// A single `.gguf` file (weights, config and tokenizer metadata).
    Gguf,
    /// A Hugging Face directory: `config.json` + `*.safetensors`.
    HfDir,
}

/// Decide the format of `path`: a directory with `config.json`, or a file
/// starting with the GGUF magic.
pub fn detect(path: &Path) -> Result<ModelFormat> {
    let err = |message: String| EngineError::File {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot access: {e}")))?;
    if meta.is_dir() {
        if path.join(safetensors::CONFIG_FILE).is_file() {
            return Ok(ModelFormat::HfDir);
        }
        return Err(err(format!(
            "a model directory needs {}",
            safetensors::CONFIG_FILE
        )));
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if &magic == b"GGUF" {
        Ok(ModelFormat::Gguf)
    } else {
        Err(err(
            "neither a GGUF file nor a Hugging Face model directory".into(),
        ))
    }
}
