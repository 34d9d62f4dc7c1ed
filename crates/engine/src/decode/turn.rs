//! What a turn is asked to do ([`TurnRequest`]), who watches it
//! ([`TurnObserver`]) and what it reports back ([`TurnResult`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ds4_sampling::Sampler;
use serde::Serialize;

use super::logprobs::TokenLogprobs;
use super::mask::TokenMask;

/// A shared flag that stops a turn from outside the decode loop (a client
/// disconnect, Ctrl+C). Cloning shares the flag. The loops check it between
/// prefill chunks and after every emitted token; a cancelled turn leaves the
/// session consistent for exactly what it processed (see
/// [`FinishReason::Caller`] with [`CallerStop::Cancelled`] and
/// [`FinalState::Partial`]).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the turn to stop at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Clear the flag (a token reused for the next turn, as `chat` does).
    pub fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// Limits and stop conditions of one generation turn.
#[derive(Debug, Clone)]
pub struct TurnConfig {
    /// Upper bound on emitted tokens (the stop token, when hit, counts).
    pub max_tokens: usize,
    /// Tokens that end the turn when sampled (the family's end-of-turn ids).
    /// They are reported to the callback but are not part of the text.
    pub stop_token_ids: Vec<u32>,
    /// Prefill chunk size in tokens.
    pub prefill_chunk: usize,
    /// `Some(n)`: every [`TokenEvent`] carries the token's log-probability
    /// and the `n` most likely alternatives (see [`super::logprobs`]).
    /// `None`: nothing is computed.
    pub logprobs: Option<usize>,
    /// Stops the turn between prefill chunks or tokens when set.
    pub cancel: CancelToken,
}

/// One turn: what [`super::generate`] and
/// [`crate::state::warm::SessionCache::decode_turn`] are asked to do.
pub struct TurnRequest<'a> {
    /// The whole conversation so far, as tokens.
    pub prompt: &'a [u32],
    /// The request's sampling law, parameters and stream.
    pub sampler: &'a mut Sampler,
    /// Limits, stop tokens, prefill chunk, logprobs, cancellation.
    pub config: TurnConfig,
    /// Draft depth: `None` takes the family's default (AR for a model
    /// without an MTP head), `Some(0)` is AR, `Some(k)` MTP with `k` drafts
    /// (see [`super::resolve_mtp_depth`]).
    pub mtp_depth: Option<usize>,
}

/// Progress of a turn's prefill, after each chunk.
#[derive(Debug, Clone, Copy)]
pub struct PrefillProgress {
    pub done: usize,
    pub total: usize,
    pub elapsed: Duration,
}

/// Who watches a turn: prefill progress after each chunk, and every emitted
/// token as it is produced (the answer can stop the turn). Both default to
/// doing nothing; `()` is the observer that watches nothing.
pub trait TurnObserver {
    fn prefill(&mut self, progress: PrefillProgress) {
        let _ = progress;
    }
    fn token(&mut self, event: TokenEvent) -> Flow {
        let _ = event;
        Flow::Continue
    }
    /// Whether the token at the next position — after every token emitted
    /// so far, then `pending` (MTP drafts not emitted yet) — is sampled at
    /// temperature 0 (the law's argmax, no draw) instead of with the
    /// request's sampler. The loops ask before every position they sample,
    /// drafts included. The answer must depend only on those tokens: that is
    /// what keeps MTP exact (a draft and the verify row at its position get
    /// the same law). Default: never.
    fn greedy_after(&mut self, pending: &[u32]) -> bool {
        let _ = pending;
        false
    }
    /// The tokens allowed at the next position — after every token emitted
    /// so far, then `pending` — by the request's constraint (a JSON schema,
    /// a grammar, a forced tool call); `None`: every token. The mask is
    /// applied to the logits before the sampling law (a masked token has
    /// probability 0). Asked once per position the loops sample: an MTP
    /// draft and the verify row at its position use the same mask, so a
    /// constrained MTP turn has exactly the distribution of a constrained
    /// AR turn. Like [`Self::greedy_after`] the answer must depend only on
    /// those tokens; a constraint that tracks a state rolls it back itself
    /// when a later call's `pending` no longer extends what it saw (a
    /// rejected draft). A mask that allows no token of the row ends the turn
    /// with [`FinishReason::NoAllowedToken`]. Default: no constraint.
    fn allowed_after(&mut self, pending: &[u32]) -> Option<TokenMask> {
        let _ = pending;
        None
    }
}

impl TurnObserver for () {}

/// An observer made of two closures.
pub struct Observe<P, T> {
    pub prefill: P,
    pub token: T,
}

impl<P: FnMut(PrefillProgress), T: FnMut(TokenEvent) -> Flow> Observe<P, T> {
    pub fn new(prefill: P, token: T) -> Self {
        Self { prefill, token }
    }
}

impl<P: FnMut(PrefillProgress), T: FnMut(TokenEvent) -> Flow> TurnObserver for Observe<P, T> {
    fn prefill(&mut self, progress: PrefillProgress) {
        (self.prefill)(progress)
    }
    fn token(&mut self, event: TokenEvent) -> Flow {
        (self.token)(event)
    }
}

/// An observer of tokens only.
pub fn on_tokens<T: FnMut(TokenEvent) -> Flow>(token: T) -> Observe<fn(PrefillProgress), T> {
    Observe::new(|_| {}, token)
}

/// A token the turn just produced.
#[derive(Debug, Clone)]
pub struct TokenEvent {
    pub token: u32,
    /// Position of this token among the turn's emitted tokens (0-based).
    pub index: usize,
    /// True when the token is one of the stop tokens (the turn ends after it).
    pub is_stop_token: bool,
    /// The ds4 law answered a row with no finite logit by its argmax fallback.
    pub argmax_fallback: bool,
    /// Present when [`TurnConfig::logprobs`] asked for it.
    pub logprobs: Option<TokenLogprobs>,
    /// Where the token came from (AR sample, or its role in an MTP cycle).
    pub source: TokenSource,
}

/// How a token was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// Sampled from the last trunk logits (every AR token; an MTP turn's
    /// first primary).
    Sampled,
    /// An MTP draft accepted at depth position `n` (1-based).
    Draft(usize),
    /// The correction drawn from the residual after a rejected draft.
    Residual,
    /// Sampled from the last verify row after every draft was accepted.
    Bonus,
}

/// The streaming callback's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop(CallerStop),
}

/// Why the caller stopped a turn early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerStop {
    /// A stop string matched in the decoded text.
    StopString,
    /// The user or client cancelled (Ctrl+C, disconnect).
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was sampled.
    StopToken,
    /// `max_tokens` tokens were emitted.
    MaxTokens,
    /// The model's context window is full.
    ContextFull,
    /// The callback asked to stop.
    Caller(CallerStop),
    /// The request's constraint allows no token at the next position (see
    /// [`TurnObserver::allowed_after`]): the turn ends instead of sampling.
    NoAllowedToken,
}

impl FinishReason {
    /// The OpenAI-style name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::StopToken | FinishReason::Caller(CallerStop::StopString) => "stop",
            FinishReason::MaxTokens | FinishReason::ContextFull => "length",
            FinishReason::Caller(CallerStop::Cancelled) => "cancelled",
            FinishReason::NoAllowedToken => "no_allowed_token",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct TurnTimings {
    pub prefill_tokens: usize,
    pub prefill: Duration,
    pub decode_tokens: usize,
    pub decode: Duration,
    /// Of `decode`: the trunk's forwards (AR steps; MTP verify windows and
    /// the final forward). The rest of `decode` is the head and the loop's
    /// own work (sampling, acceptance, commit), which `bench --mtp` splits
    /// out to show where a cycle's time goes.
    pub decode_trunk: Duration,
    /// Of `decode`: the MTP head's forwards (drafts and history rows).
    pub decode_head: Duration,
}

impl TurnTimings {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill)
    }
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_tokens, self.decode)
    }
}

fn rate(tokens: usize, time: Duration) -> f64 {
    let secs = time.as_secs_f64();
    if tokens == 0 || secs <= 0.0 {
        0.0
    } else {
        tokens as f64 / secs
    }
}

#[derive(Debug, Clone)]
pub struct TurnResult {
    /// Every emitted token, the final stop token included.
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Prompt tokens served from an earlier state instead of prefilled.
    pub reused_tokens: usize,
    pub timings: TurnTimings,
    /// Rows the ds4 law could only answer by its argmax fallback.
    pub argmax_fallbacks: usize,
    /// What the session covers now (see [`FinalState`]).
    pub final_state: FinalState,
    /// Speculative statistics (MTP turns only).
    pub mtp: Option<MtpStats>,
}

/// What the live session holds when a turn returns `Ok`. (A turn that
/// returns `Err` has reset the session: it holds nothing.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalState {
    /// The session covers exactly `prompt + emitted` (the last emitted token
    /// got its one final forward), its last logits row, and for MTP turns the
    /// MTP history of one row less. Safe to bank under that key.
    Complete,
    /// The session is consistent (its token list says exactly what it
    /// covers) but does not cover every emitted token: the turn was
    /// cancelled (never marked complete, whatever it covers) or the context
    /// was full so the last token could not be forwarded.
    Partial,
}

/// Per-turn speculative statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MtpStats {
    /// Draft depth K the turn ran with.
    pub depth: usize,
    /// Verify cycles run.
    pub cycles: usize,
    /// Drafts proposed at depth position `i + 1`.
    pub drafted: Vec<usize>,
    /// Drafts accepted at depth position `i + 1`.
    pub accepted: Vec<usize>,
    /// Cycles whose drafts were all accepted and sampled a bonus token.
    pub bonus: usize,
    /// Trunk rows forwarded in verify windows.
    pub verify_rows: usize,
}

impl MtpStats {
    pub(crate) fn new(depth: usize) -> Self {
        Self {
            depth,
            drafted: vec![0; depth],
            accepted: vec![0; depth],
            ..Self::default()
        }
    }

    pub fn drafted_total(&self) -> usize {
        self.drafted.iter().sum()
    }

    pub fn accepted_total(&self) -> usize {
        self.accepted.iter().sum()
    }

    /// Accepted drafts over drafted ones (0 when none were drafted).
    pub fn acceptance_rate(&self) -> f64 {
        let d = self.drafted_total();
        if d == 0 {
            0.0
        } else {
            self.accepted_total() as f64 / d as f64
        }
    }

    /// Mean accepted drafts per cycle.
    pub fn mean_accepted_len(&self) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            self.accepted_total() as f64 / self.cycles as f64
        }
    }
}
