//! Token embedding: the vocabulary check every family makes before a
//! forward touches its state, then the table lookup.

use crate::backend::Backend;
use crate::error::{EngineError, Result};

/// Rows `tokens` of `table` (`[vocab, width]`); a token outside the
/// vocabulary is refused before anything runs.
pub fn embed_tokens<B: Backend>(
    ops: &B,
    table: &B::Table,
    tokens: &[u32],
    vocab: usize,
) -> Result<B::Buf> {
    if let Some(&token) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(EngineError::TokenOutOfRange { token, vocab });
    }
    ops.gather_rows(table, tokens)
}
