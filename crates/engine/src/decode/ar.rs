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
        session.set_last_logits(None);
        prefill(
            model,
            session.state_mut(),
            fresh,
            config.prefill_chunk,
            on_prefill,
        )?
        .logits
    };
    session.record(fresh);
    session.set_last_logits(Some(logits.clone()));
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
