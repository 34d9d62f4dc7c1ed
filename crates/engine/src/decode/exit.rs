//! What the AR and MTP loops share about emitted tokens and how a turn
//! ends: the [`Emitter`] counts each token, hands it to the observer and
//! classifies the exit (stop token, then the observer's answer, then the
//! cancel token, then `max_tokens`); [`final_state`] says what the session
//! covers at the end; [`cancelled_in_prefill`] is the result of a turn
//! cancelled before its first token.

use std::time::Instant;

use ds4_sampling::TokenCounts;

use super::logprobs::token_logprobs;
use super::turn::{
    CallerStop, FinalState, FinishReason, Flow, MtpStats, TokenEvent, TokenSource, TurnConfig,
    TurnObserver, TurnResult, TurnTimings,
};

/// The finish reason of a cancelled turn.
pub(crate) const CANCELLED: FinishReason = FinishReason::Caller(CallerStop::Cancelled);

/// The emitted tokens of a turn and the observer that sees them.
pub(crate) struct Emitter<'a> {
    pub config: &'a TurnConfig,
    observer: &'a mut dyn TurnObserver,
    /// Every emitted token, in order.
    pub tokens: Vec<u32>,
    /// Penalty counts of the emitted tokens.
    pub counts: TokenCounts,
    /// Rows answered by the ds4 law's argmax fallback.
    pub fallbacks: usize,
}

impl<'a> Emitter<'a> {
    pub fn new(config: &'a TurnConfig, observer: &'a mut dyn TurnObserver) -> Self {
        Self {
            config,
            observer,
            tokens: Vec::new(),
            counts: TokenCounts::default(),
            fallbacks: 0,
        }
    }

    pub fn observer(&mut self) -> &mut dyn TurnObserver {
        &mut *self.observer
    }

    /// Whether the cancel token is set.
    pub fn cancelled(&self) -> bool {
        self.config.cancel.is_cancelled()
    }

    /// Emit one token sampled from `row`: count it, hand it to the observer,
    /// and say whether the turn ends here — the one exit classifier of the
    /// AR and MTP loops: a stop token, then the observer's answer, then the
    /// cancel token, then `max_tokens`.
    pub fn emit(
        &mut self,
        token: u32,
        argmax_fallback: bool,
        row: &[f32],
        source: TokenSource,
    ) -> Option<FinishReason> {
        self.counts.add(token);
        self.tokens.push(token);
        self.fallbacks += usize::from(argmax_fallback);
        let is_stop_token = self.config.stop_token_ids.contains(&token);
        let flow = self.observer.token(TokenEvent {
            token,
            index: self.tokens.len() - 1,
            is_stop_token,
            argmax_fallback,
            logprobs: self
                .config
                .logprobs
                .map(|top_n| token_logprobs(row, token, top_n)),
            source,
        });
        if is_stop_token {
            Some(FinishReason::StopToken)
        } else if let Flow::Stop(why) = flow {
            Some(FinishReason::Caller(why))
        } else if self.cancelled() {
            Some(CANCELLED)
        } else if self.tokens.len() >= self.config.max_tokens {
            Some(FinishReason::MaxTokens)
        } else {
            None
        }
    }

    /// The turn's result once its loop ended with `reason` and the session
    /// covers `covered` tokens.
    pub fn finish(
        self,
        reason: FinishReason,
        covered: usize,
        prompt_len: usize,
        reused_tokens: usize,
        timings: TurnTimings,
        mtp: Option<MtpStats>,
    ) -> TurnResult {
        let final_state = final_state(reason, covered, prompt_len + self.tokens.len());
        TurnResult {
            tokens: self.tokens,
            finish_reason: reason,
            reused_tokens,
            timings,
            argmax_fallbacks: self.fallbacks,
            final_state,
            mtp,
        }
    }
}

/// [`FinalState::Complete`] when the session covers exactly `prompt +
/// emitted` (`want` tokens) and the turn was not cancelled (a cancelled
/// turn never claims it), else [`FinalState::Partial`].
pub(crate) fn final_state(reason: FinishReason, covered: usize, want: usize) -> FinalState {
    if reason != CANCELLED && covered == want {
        FinalState::Complete
    } else {
        FinalState::Partial
    }
}

/// A turn cancelled during its prefill: nothing was emitted, the session
/// covers the `prefilled` tokens of the chunks that ran.
pub(crate) fn cancelled_in_prefill(
    reused_tokens: usize,
    prefilled: usize,
    started: Instant,
    mtp: Option<MtpStats>,
) -> TurnResult {
    TurnResult {
        tokens: Vec::new(),
        finish_reason: CANCELLED,
        reused_tokens,
        timings: TurnTimings {
            prefill_tokens: prefilled,
            prefill: started.elapsed(),
            ..TurnTimings::default()
        },
        argmax_fallbacks: 0,
        final_state: FinalState::Partial,
        mtp,
    }
}
