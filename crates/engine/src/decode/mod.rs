//! Turning prompts into tokens: chunked prefill, the autoregressive and MTP
//! loops, and the live session that lets a later turn reuse an earlier
//! turn's state. Everything here is family-agnostic: it sees a family only
//! through the [`crate::Model`] contract and its sampling law only through
//! [`ds4_sampling::Sampler`].
//!
//! Module graph (no cycles): `turn` (request, observer, results) ←
//! `exit` (emission and the exit classifier), `mask` (a position's allowed
//! tokens under a constraint), `step` (the per-position sampler: the
//! request's, or its greedy twin where the observer asks, over the row the
//! observer's mask leaves) and
//! `prefill` (the cancellable prefill loop, over `session`) ← `ar`, `mtp` ←
//! [`generate`].

mod ar;
mod draft_stop;
mod exit;
pub mod logprobs;
mod mask;
pub mod media;
mod mtp;
pub mod mtp_pieces;
pub mod prefill;
pub mod session;
mod step;
#[cfg(test)]
mod step_tests;
pub mod turn;

pub use logprobs::{TokenLogprobs, prompt_logprobs, token_logprobs};
pub use mask::TokenMask;
pub use media::{KeyedSpan, PromptMedia, media_keys};
pub use mtp::resolve_mtp_depth;
pub use prefill::{DEFAULT_PREFILL_CHUNK, prefill};
pub use session::{LiveSession, SessionImage};
pub use turn::{
    CallerStop, CancelToken, FinalState, FinishReason, Flow, MtpStats, Observe, PrefillProgress,
    TokenEvent, TokenSource, TurnConfig, TurnObserver, TurnRequest, TurnResult, TurnTimings,
    on_tokens,
};

use crate::error::Result;
use crate::model::Model;

/// Generate a reply to `request.prompt` (the whole conversation so far, as
/// tokens) on `session`, AR or MTP as `request.mtp_depth` resolves
/// ([`resolve_mtp_depth`]; MTP spec and draw order in `mtp.rs`).
///
/// The session's state is rewound to its longest exact prefix with the
/// prompt and only the rest is prefilled, in chunks, checking the cancel
/// token before each. The observer sees prefill progress and every emitted
/// token as it is produced, and may stop the turn.
///
/// Exits and the final commit: on a stop token, a stop string or
/// `max_tokens` the last emitted token gets exactly one final forward, so
/// the session covers exactly `prompt + emitted` and keeps that forward's
/// logits row ([`FinalState::Complete`]). On cancellation no further forward
/// runs and on a full context none can: the session stays consistent but
/// one token short ([`FinalState::Partial`]). If any forward fails the
/// session is reset, so a half-updated state is never reused. A depth the
/// model refuses is an error that leaves the session untouched.
pub fn generate<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    observer: &mut dyn TurnObserver,
) -> Result<TurnResult> {
    generate_with_media(model, session, request, None, observer)
}

/// [`generate`] for a prompt with media: `request.prompt` holds the keys
/// ([`media_keys`]) the session matches, `media` the real ids, image rows
/// and positions the prefill feeds the model.
pub fn generate_with_media<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    media: Option<&PromptMedia<'_>>,
    observer: &mut dyn TurnObserver,
) -> Result<TurnResult> {
    let draft_stop = model.mtp_contract().and_then(|c| c.min_draft_confidence);
    run_turn(model, session, request, draft_stop, media, observer)
}

/// [`generate`] with an explicit draft-stop threshold in place of the
/// family's ([`crate::MtpContract::min_draft_confidence`]; `None` drafts
/// the full depth every cycle): for `bench --mtp`, which measures both
/// policies side by side, and for tests.
pub fn generate_with_draft_stop<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    draft_stop: Option<f32>,
    observer: &mut dyn TurnObserver,
) -> Result<TurnResult> {
    run_turn(model, session, request, draft_stop, None, observer)
}

/// AR or MTP as `request.mtp_depth` resolves.
fn run_turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    draft_stop: Option<f32>,
    media: Option<&PromptMedia<'_>>,
    observer: &mut dyn TurnObserver,
) -> Result<TurnResult> {
    match resolve_mtp_depth(model, request.mtp_depth)? {
        0 => ar::generate(model, session, request, media, observer),
        depth => mtp::generate(model, session, request, depth, draft_stop, media, observer),
    }
}
