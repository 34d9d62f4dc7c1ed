//! The autoregressive decode loop: one forward per emitted token.

use std::time::Instant;

use ds4_sampling::{Sampler, TokenCounts};

use super::logprobs::token_logprobs;
use super::prefill::{PrefillProgress, prefill};
use super::session::LiveSession;
use super::turn::{
    CallerStop, FinalState, FinishReason, Flow, TokenEvent, TokenSource, TurnConfig, TurnResult,
    TurnTimings,
};
use crate::error::Result;
use crate::model::{LogitsRows, Model};

/// Generate a reply to `prompt` (the whole conversation so far, as tokens).
///
/// The session's state is rewound to its longest exact prefix with `prompt`
/// and only the rest is prefilled. `on_token` sees every emitted token as it
/// is produced and may stop the turn.
///
/// Exits and the final commit: on a stop token, a stop string or
/// `max_tokens` the last emitted token gets exactly one final forward, so
/// the session covers exactly `prompt + emitted` and keeps that forward's
/// logits row ([`FinalState::Complete`]). On cancellation no further forward
/// runs and on a full context none can: the session stays consistent but
/// one token short ([`FinalState::Partial`]). If any forward fails the
/// session is reset, so a half-updated state is never reused.
pub fn generate<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    sampler: &mut Sampler,
    config: &TurnConfig,
    on_prefill: &mut dyn FnMut(PrefillProgress),
    on_token: &mut dyn FnMut(TokenEvent) -> Flow,
) -> Result<TurnResult> {
    let result = run(
        model, session, prompt, sampler, config, on_prefill, on_token,
    );
    if result.is_err() {
        session.reset(model);
    }
    debug_assert!(session.is_consistent());
    result
}

fn run<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    sampler: &mut Sampler,
    config: &TurnConfig,
    on_prefill: &mut dyn FnMut(PrefillProgress),
    on_token: &mut dyn FnMut(TokenEvent) -> Flow,
) -> Result<TurnResult> {
    let reused = session.rewind_for(model, prompt);
    // The AR loop does not keep the MTP history in step.
    *session.mtp_mut() = None;
    let fresh = &prompt[reused..];
    let prefill_start = Instant::now();
    let mut logits = if fresh.is_empty() {
        // The session covers the whole prompt and kept its last logits.
        session
            .last_logits()
            .map(<[f32]>::to_vec)
            .ok_or_else(|| crate::EngineError::State("the prompt is empty".into()))?
    } else {
        match prefill_cancellable(model, session, fresh, config, on_prefill)? {
            Some(logits) => logits,
            None => {
                // Cancelled between chunks: the session covers the chunks
                // that ran (with their last logits), nothing was emitted.
                return Ok(TurnResult {
                    tokens: Vec::new(),
                    finish_reason: FinishReason::Caller(CallerStop::Cancelled),
                    reused_tokens: reused,
                    timings: TurnTimings {
                        prefill_tokens: session.tokens().len() - reused,
                        prefill: prefill_start.elapsed(),
                        ..TurnTimings::default()
                    },
                    argmax_fallbacks: 0,
                    final_state: FinalState::Partial,
                    mtp: None,
                });
            }
        }
    };
    let mut timings = TurnTimings {
        prefill_tokens: fresh.len(),
        prefill: prefill_start.elapsed(),
        ..TurnTimings::default()
    };

    let decode_start = Instant::now();
    let mut counts = TokenCounts::default();
    let mut tokens = Vec::new();
    let mut fallbacks = 0;
    let finish_reason = loop {
        if config.cancel.is_cancelled() {
            // Cancelled before this token was sampled: the session covers
            // `prompt + emitted` but the turn is not claimed.
            break FinishReason::Caller(CallerStop::Cancelled);
        }
        if tokens.len() >= config.max_tokens {
            break FinishReason::MaxTokens;
        }
        let sampled = sampler.sample(&logits, &counts)?;
        let token = sampled.token;
        fallbacks += usize::from(sampled.argmax_fallback);
        counts.add(token);
        tokens.push(token);
        let is_stop_token = config.stop_token_ids.contains(&token);
        let flow = on_token(TokenEvent {
            token,
            index: tokens.len() - 1,
            is_stop_token,
            argmax_fallback: sampled.argmax_fallback,
            logprobs: config
                .logprobs
                .map(|top_n| token_logprobs(&logits, token, top_n)),
            source: TokenSource::Sampled,
        });
        let exit = if is_stop_token {
            Some(FinishReason::StopToken)
        } else if let Flow::Stop(why) = flow {
            Some(FinishReason::Caller(why))
        } else if config.cancel.is_cancelled() {
            Some(FinishReason::Caller(CallerStop::Cancelled))
        } else if tokens.len() >= config.max_tokens {
            Some(FinishReason::MaxTokens)
        } else {
            None
        };
        if exit == Some(FinishReason::Caller(CallerStop::Cancelled)) {
            // Cancelled: no further forward; the state stays one short.
            break FinishReason::Caller(CallerStop::Cancelled);
        }
        if session.tokens().len() + 1 > model.context_length() {
            break exit.unwrap_or(FinishReason::ContextFull);
        }
        // The forward of the token just emitted: the next step's input, or
        // the turn's one final commit when `exit` is set.
        session.set_last_logits(None);
        logits = model
            .forward(&[token], session.state_mut(), LogitsRows::Last)?
            .logits;
        session.record(&[token]);
        session.set_last_logits(Some(logits.clone()));
        timings.decode_tokens += 1;
        if let Some(reason) = exit {
            break reason;
        }
    };
    timings.decode = decode_start.elapsed();
    let final_state = if finish_reason != FinishReason::Caller(CallerStop::Cancelled)
        && session.tokens().len() == prompt.len() + tokens.len()
    {
        FinalState::Complete
    } else {
        FinalState::Partial
    };

    Ok(TurnResult {
        tokens,
        finish_reason,
        reused_tokens: reused,
        timings,
        argmax_fallbacks: fallbacks,
        final_state,
        mtp: None,
    })
}

/// Prefill `fresh` into the session chunk by chunk, recording each chunk as
/// soon as it ran and checking the cancel token before each one. Returns the
/// last logits row, or `None` when cancelled (the session then covers the
/// chunks that ran and keeps the last one's logits row, if any).
fn prefill_cancellable<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    fresh: &[u32],
    config: &TurnConfig,
    on_prefill: &mut dyn FnMut(PrefillProgress),
) -> Result<Option<Vec<f32>>> {
    let needed = session.tokens().len() + fresh.len();
    if needed > model.context_length() {
        return Err(crate::EngineError::ContextOverflow {
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
        let row = prefill(model, session.state_mut(), piece, chunk, &mut |_| {})?
            .last_row()
            .to_vec();
        session.record(piece);
        session.set_last_logits(Some(row.clone()));
        logits = Some(row);
        on_prefill(PrefillProgress {
            done: (i * chunk + piece.len()).min(fresh.len()),
            total: fresh.len(),
            elapsed: start.elapsed(),
        });
    }
    logits
        .map(Some)
        .ok_or_else(|| crate::EngineError::State("prefill produced no logits".into()))
}
