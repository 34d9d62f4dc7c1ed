//! The autoregressive decode loop: one forward per emitted token.

use std::time::Instant;

use ds4_sampling::{Sampler, TokenCounts};

use super::logprobs::token_logprobs;
use super::prefill::{PrefillProgress, prefill};
use super::session::LiveSession;
use super::turn::{FinishReason, Flow, TokenEvent, TurnConfig, TurnResult, TurnTimings};
use crate::error::Result;
use crate::model::{LogitsRows, Model};

/// Generate a reply to `prompt` (the whole conversation so far, as tokens).
///
/// The session's state is rewound to its longest exact prefix with `prompt`
/// and only the rest is prefilled. `on_token` sees every emitted token as it
/// is produced and may stop the turn. When the turn returns, the session
/// covers the prompt plus every emitted token except the last one (which was
/// never fed back: its logits are not needed). If any forward fails the
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
    let fresh = &prompt[reused..];
    let prefill_start = Instant::now();
    let mut logits = prefill(
        model,
        session.state_mut(),
        fresh,
        config.prefill_chunk,
        on_prefill,
    )?
    .logits;
    session.record(fresh);
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
        });
        if is_stop_token {
            break FinishReason::StopToken;
        }
        if let Flow::Stop(why) = flow {
            break FinishReason::Caller(why);
        }
        if tokens.len() >= config.max_tokens {
            break FinishReason::MaxTokens;
        }
        if session.tokens().len() + 1 > model.context_length() {
            break FinishReason::ContextFull;
        }
        logits = model
            .forward(&[token], session.state_mut(), LogitsRows::Last)?
            .logits;
        session.record(&[token]);
        timings.decode_tokens += 1;
    };
    timings.decode = decode_start.elapsed();

    Ok(TurnResult {
        tokens,
        finish_reason,
        reused_tokens: reused,
        timings,
        argmax_fallbacks: fallbacks,
    })
}
