//! What a finished turn reports: the worker sends it with the last event,
//! the routes build their usage and finish reasons from it, and the
//! metrics count it.

use std::time::Duration;

use ds4_engine::decode::{FinishReason, MtpStats};

#[derive(Debug, Clone)]
pub struct TurnSummary {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Whether the last token was a stop token (not text).
    pub stop_token: bool,
    /// The stop string that ended the turn, if one did.
    pub stop_sequence: Option<String>,
    pub prefill_tokens: usize,
    pub prefill: Duration,
    pub decode_tokens: usize,
    pub decode: Duration,
    /// From dequeue to the first token.
    pub first_token: Option<Duration>,
    /// Speculative statistics when the turn ran MTP.
    pub mtp: Option<MtpStats>,
}
