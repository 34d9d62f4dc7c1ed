//! Typed errors at the engine boundary. Each names what is wrong (file,
//! tensor, field) so the CLI and server can print one actionable message.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{path}: tensor `{tensor}`: {message}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        message: String,
    },
    #[error("{path}: config field `{field}`: {message}")]
    Config {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("context overflow: {needed} tokens needed, the model's context holds {limit}")]
    ContextOverflow { needed: usize, limit: usize },
    #[error("token id {token} is outside the vocabulary ({vocab} entries)")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("invalid state operation: {0}")]
    State(String),
    #[error(transparent)]
    Sampling(#[from] ds4_sampling::SampleError),
    #[error("tensor computation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The accelerator failed (driver, kernel compilation, out of memory).
    #[error("device: {0}")]
    Device(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
