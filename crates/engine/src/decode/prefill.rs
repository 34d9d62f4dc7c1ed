//! Chunked prefill: a long prompt is processed in chunks so memory for the
//! attention scores stays bounded and the caller can report progress (and
//! the server can send keep-alives) while it runs.

use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};
use crate::model::{ForwardOutput, LogitsRows, Model, ModelState};

/// Tokens per prefill chunk when the caller does not choose.
pub const DEFAULT_PREFILL_CHUNK: usize = 2048;

#[derive(Debug, Clone, Copy)]
pub struct PrefillProgress {
    pub done: usize,
    pub total: usize,
    pub elapsed: Duration,
}

/// Extend `state` with `tokens` in chunks of `chunk` tokens and return the
/// logits of the last token. `tokens` must not be empty: a turn needs the
/// logits of its last prompt token to sample the first output.
pub fn prefill<M: Model>(
    model: &M,
    state: &mut M::State,
    tokens: &[u32],
    chunk: usize,
    progress: &mut dyn FnMut(PrefillProgress),
) -> Result<ForwardOutput> {
    if tokens.is_empty() {
        return Err(EngineError::State(
            "prefill needs at least one new token".into(),
        ));
    }
    let needed = state.len() + tokens.len();
    if needed > model.context_length() {
        return Err(EngineError::ContextOverflow {
            needed,
            limit: model.context_length(),
        });
    }
    let chunk = chunk.max(1);
    let start = Instant::now();
    let mut last = None;
    for (i, piece) in tokens.chunks(chunk).enumerate() {
        last = Some(model.forward(piece, state, LogitsRows::Last)?);
        progress(PrefillProgress {
            done: (i * chunk + piece.len()).min(tokens.len()),
            total: tokens.len(),
            elapsed: start.elapsed(),
        });
    }
    last.ok_or_else(|| EngineError::State("prefill produced no logits".into()))
}
