//! The autoregressive decode loop: one forward per emitted token.

use std::time::Instant;

use super::exit::{CANCELLED, Emitter, cancelled_in_prefill};
use super::media::PromptMedia;
use super::prefill::prefill_turn;
use super::session::LiveSession;
use super::step::{StepSamplers, constrain};
use super::turn::{FinishReason, TokenSource, TurnObserver, TurnRequest, TurnResult, TurnTimings};
use crate::error::Result;
use crate::model::{LogitsRows, Model};

/// An AR turn (the request's `mtp_depth` is not read; see
/// [`super::generate`] for the session handling, exits and final state).
pub(crate) fn generate<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    media: Option<&PromptMedia<'_>>,
    observer: &mut dyn TurnObserver,
) -> Result<TurnResult> {
    let result = run(model, session, request, media, observer);
    if result.is_err() {
        session.reset(model);
    }
    debug_assert!(session.is_consistent());
    result
}

fn run<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    request: TurnRequest<'_>,
    media: Option<&PromptMedia<'_>>,
    observer: &mut dyn TurnObserver,
) -> Result<TurnResult> {
    let TurnRequest {
        prompt,
        sampler,
        config,
        ..
    } = request;
    let reused = session.rewind_for(model, prompt);
    // The AR loop does not keep the MTP history in step.
    *session.mtp_mut() = None;
    let fresh = &prompt[reused..];
    let prefill_start = Instant::now();
    let prefilled = prefill_turn(
        model,
        session,
        fresh,
        &config,
        observer,
        media,
        |s, piece, chunk| {
            Ok(model
                .forward_media(piece, chunk, s.state_mut(), LogitsRows::Last)?
                .last_row()
                .to_vec())
        },
    )?;
    let Some(mut logits) = prefilled else {
        // Cancelled between chunks: the session covers the chunks that ran
        // (with their last logits), nothing was emitted.
        let prefilled = session.tokens().len() - reused;
        return Ok(cancelled_in_prefill(reused, prefilled, prefill_start, None));
    };
    let mut timings = TurnTimings {
        prefill_tokens: fresh.len(),
        prefill: prefill_start.elapsed(),
        ..TurnTimings::default()
    };

    let decode_start = Instant::now();
    let mut out = Emitter::new(&config, observer);
    let mut samplers = StepSamplers::new(sampler);
    // The session keeps the last logits for the next turn; they are handed
    // to it once the loop ends (every exit below leaves `logits` the row
    // of the last token forwarded) rather than copied each step — a copy of
    // the vocabulary a token per stream (an error resets the session).
    session.set_last_logits(None);
    let finish_reason = loop {
        if out.cancelled() {
            // Cancelled before this token was sampled: the session covers
            // `prompt + emitted` but the turn is not claimed.
            break CANCELLED;
        }
        if out.tokens.len() >= config.max_tokens {
            break FinishReason::MaxTokens;
        }
        let greedy = out.observer().greedy_after(&[]);
        let mask = out.observer().allowed_after(&[]);
        let Some(row) = constrain(mask.as_ref(), &logits) else {
            // The constraint admits no token here: the session already
            // covers `prompt + emitted` (the last token was forwarded).
            break FinishReason::NoAllowedToken;
        };
        let sampled = samplers.pick(greedy)?.sample(&row, &out.counts)?;
        let token = sampled.token;
        let exit = out.emit(token, sampled.argmax_fallback, &row, TokenSource::Sampled);
        drop(row);
        if exit == Some(CANCELLED) {
            // Cancelled: no further forward; the state stays one short.
            break CANCELLED;
        }
        if session.tokens().len() + 1 > model.context_length() {
            break exit.unwrap_or(FinishReason::ContextFull);
        }
        // The forward of the token just emitted: the next step's input, or
        // the turn's one final commit when `exit` is set.
        let forward_start = Instant::now();
        logits = model
            .forward(&[token], session.state_mut(), LogitsRows::Last)?
            .logits;
        timings.decode_trunk += forward_start.elapsed();
        session.record(&[token]);
        timings.decode_tokens += 1;
        if let Some(reason) = exit {
            break reason;
        }
    };
    session.set_last_logits(Some(logits));
    timings.decode = decode_start.elapsed();
    Ok(out.finish(
        finish_reason,
        session.tokens().len(),
        prompt.len(),
        reused,
        timings,
        None,
    ))
}
