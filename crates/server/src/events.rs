//! What a running turn tells its client: the events the engine side sends
//! down each job's channel. A leaf module, so that the output side
//! (`output`) reads them without knowing who runs the turn.

use ds4_engine::decode::TokenLogprobs;

use crate::summary::TurnSummary;

/// A generated token with what the client may want to know about it.
#[derive(Debug, Clone)]
pub struct TokenOut {
    pub id: u32,
    pub logprobs: Option<TokenLogprobs>,
}

#[derive(Debug)]
pub enum WorkEvent {
    /// The turn began; `cached_tokens` prompt tokens were reused.
    Started {
        cached_tokens: usize,
    },
    PromptLogprobs(Vec<Option<TokenLogprobs>>),
    /// Text that is final (stop strings already removed) and the token that
    /// released it (text may be empty while a token is held back).
    Delta {
        text: String,
        token: TokenOut,
    },
    /// Text released at the end of the turn (held-back tail).
    Tail(String),
    Finished(TurnSummary),
    /// The turn failed inside the engine.
    Failed(String),
}
