//! Turning prompts into tokens: chunked prefill, the autoregressive loop, and
//! the live session that lets a later turn reuse an earlier turn's state.
//! Everything here is family-agnostic: it sees a family only through the
//! [`crate::Model`] contract and its sampling law only through
//! [`ds4_sampling::Sampler`].

pub mod ar;
pub mod logprobs;
pub mod mtp;
pub mod prefill;
pub mod session;
pub mod turn;

pub use ar::generate;
pub use logprobs::{TokenLogprobs, prompt_logprobs, token_logprobs};
pub use mtp::{MtpStats, generate_auto, generate_mtp, resolve_mtp_depth};
pub use prefill::{DEFAULT_PREFILL_CHUNK, PrefillProgress, prefill};
pub use session::{LiveSession, SessionImage};
pub use turn::{
    CallerStop, CancelToken, FinalState, FinishReason, Flow, TokenEvent, TokenSource, TurnConfig,
    TurnResult, TurnTimings,
};
