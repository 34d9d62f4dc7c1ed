//! Why a grammar could not be used.

/// A grammar the engine cannot compile, or a vocabulary it cannot build.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConstraintError {
    /// The grammar uses something the engine does not implement (an
    /// unsupported JSON-schema keyword, a Lark feature); the message names it.
    #[error("{0}")]
    Unsupported(String),
    /// The grammar is malformed (a regex or Lark syntax error, a schema that
    /// is not an object).
    #[error("{0}")]
    Invalid(String),
    /// The tokenizer cannot back a constraint (no end-of-turn token, …).
    #[error("the model's vocabulary cannot be constrained: {0}")]
    Vocabulary(String),
}

impl ConstraintError {
    /// Sort an `llguidance` compile error: unimplemented features are
    /// [`ConstraintError::Unsupported`], everything else
    /// [`ConstraintError::Invalid`].
    pub(crate) fn from_compile(message: String) -> Self {
        let unsupported = [
            "Unimplemented",
            "not supported",
            "unsupported",
            "Unknown format",
        ];
        if unsupported.iter().any(|u| message.contains(u)) {
            Self::Unsupported(message)
        } else {
            Self::Invalid(message)
        }
    }
}
