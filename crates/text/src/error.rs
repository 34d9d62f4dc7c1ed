//! Typed errors for everything in this crate. Each names the file, key or template at fault,
//! so a message reaching the user says what to fix.

use std::path::PathBuf;

/// Every error `ds4-text` returns.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot read GGUF metadata from {path}: {message}")]
    GgufRead { path: PathBuf, message: String },
    #[error("{path}: GGUF metadata key `{key}` is missing")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: GGUF metadata key `{key}` has the wrong type: expected {expected}")]
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
    },
    #[error("{path}: unsupported `{key}` = {value:?} (supported: {supported})")]
    Unsupported {
        path: PathBuf,
        key: String,
        value: String,
        supported: String,
    },
    #[error("{path}: `{key}` is invalid: {message}")]
    InvalidMetadata {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{path}: cannot build the tokenizer: {message}")]
    Build { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template syntax error: {0}")]
    TemplateSyntax(String),
    /// The template called `raise_exception(message)`: `message` is the template author's text.
    #[error("chat template rejected the conversation: {0}")]
    TemplateRaised(String),
    #[error("chat template failed to render: {0}")]
    TemplateRender(String),
}

/// `Result` with [`TextError`].
pub type Result<T, E = TextError> = std::result::Result<T, E>;

impl TextError {
    pub(crate) fn tokenizer(err: impl std::fmt::Display) -> Self {
        TextError::Tokenizer(err.to_string())
    }
}
