//! Chunked prefill: a long prompt is processed in chunks so memory for the
//! attention scores stays bounded and the caller can report progress (and
//! the server can send keep-alives) while it runs. [`prefill`] extends a
//! bare state; [`prefill_turn`] is the one cancellable prefill loop of the
//! AR and MTP turns.

use std::time::Instant;

use super::media::PromptMedia;
use super::session::LiveSession;
use super::turn::{PrefillProgress, TurnConfig, TurnObserver};
use crate::error::{EngineError, Result};
use crate::model::{ForwardOutput, LogitsRows, MediaChunk, Model, ModelState};

/// Tokens per prefill chunk when the caller does not choose.
pub const DEFAULT_PREFILL_CHUNK: usize = 2048;

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

/// A turn's prefill of `fresh`, the prompt tokens after what the session
/// covers: in chunks of `config.prefill_chunk`, the cancel token checked
/// before each chunk, each chunk recorded in the session as soon as it ran,
/// with its last logits row, and the observer told after each.
/// `forward_chunk` runs one chunk through the model (the MTP loop also
/// through its head) and returns the chunk's last logits row; it gets the
/// chunk's real ids and media from `media` (the prompt then holds keys:
/// [`super::media`]), or the chunk itself and no media.
///
/// Returns the logits row of the last prompt token (the kept row when
/// `fresh` is empty: the session covers the whole prompt), or `None` when
/// cancelled: the session then covers exactly the chunks that ran and keeps
/// the last one's row.
pub(crate) fn prefill_turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    fresh: &[u32],
    config: &TurnConfig,
    observer: &mut dyn TurnObserver,
    media: Option<&PromptMedia<'_>>,
    mut forward_chunk: impl FnMut(&mut LiveSession<M>, &[u32], &MediaChunk<'_>) -> Result<Vec<f32>>,
) -> Result<Option<Vec<f32>>> {
    if fresh.is_empty() {
        // The session covers the whole prompt and kept its last logits.
        return session
            .last_logits()
            .map(|row| Some(row.to_vec()))
            .ok_or_else(|| EngineError::State("the prompt is empty".into()));
    }
    let needed = session.tokens().len() + fresh.len();
    if needed > model.context_length() {
        return Err(EngineError::ContextOverflow {
            needed,
            limit: model.context_length(),
        });
    }
    let chunk = config.prefill_chunk.max(1);
    let start = Instant::now();
    let mut logits = None;
    for (i, piece) in fresh.chunks(chunk).enumerate() {
        if config.cancel.is_cancelled() {
            return Ok(None);
        }
        session.set_last_logits(None);
        let at = session.tokens().len();
        let row = PromptMedia::run(media, at, piece, |ids, chunk| {
            forward_chunk(session, ids, chunk)
        })?;
        session.record(piece);
        session.set_last_logits(Some(row.clone()));
        logits = Some(row);
        observer.prefill(PrefillProgress {
            done: (i * chunk + piece.len()).min(fresh.len()),
            total: fresh.len(),
            elapsed: start.elapsed(),
        });
    }
    logits
        .map(Some)
        .ok_or_else(|| EngineError::State("prefill produced no logits".into()))
}
