//! The per-token side of [`super::decode_state`]: generated token ids in,
//! "sample the next token at temperature 0?" out. The decode loop asks before
//! every position, also for MTP drafts not yet emitted
//! ([`StructuralSampling::greedy_after`]); the answer depends only on the
//! tokens before that position.
//!
//! Token text is the tokenizer's decoding with special tokens kept (ds4 uses
//! each token's own text), complete characters only: a character split across
//! tokens reaches the tracker when its last byte does, which cannot change a
//! decision because every DSML literal is made of whole characters.

use super::decode_state::{DsmlState, DsmlTracker};
use crate::tokenizer::Tokenizer;

/// After this many tokens without a complete character, the window is
/// decoded anyway (as the detokenizer does: UTF-8 needs at most 4 bytes).
const MAX_HELD: usize = 8;

/// DSML decode state of one reply, fed token by token.
#[derive(Clone)]
pub struct StructuralSampling<'t> {
    tokenizer: &'t Tokenizer,
    /// The last decoded token (context for the decoder) then the tokens whose
    /// text is not complete yet.
    window: Vec<u32>,
    /// `window[..decoded]` is already text.
    decoded: usize,
    tracker: DsmlTracker,
}

impl std::fmt::Debug for StructuralSampling<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StructuralSampling")
            .field("window", &self.window)
            .field("state", &self.tracker.state())
            .finish_non_exhaustive()
    }
}

impl<'t> StructuralSampling<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        Self {
            tokenizer,
            window: Vec::new(),
            decoded: 0,
            tracker: DsmlTracker::new(),
        }
    }

    /// The state after every token pushed so far.
    pub fn state(&self) -> DsmlState {
        self.tracker.state()
    }

    /// Whether the next token is sampled at temperature 0.
    pub fn greedy(&self) -> bool {
        self.state().greedy()
    }

    /// Whether the token after the pushed ones and then `pending` is sampled
    /// at temperature 0 (MTP drafts that are not emitted yet).
    pub fn greedy_after(&self, pending: &[u32]) -> bool {
        if pending.is_empty() {
            return self.greedy();
        }
        let mut ahead = self.clone();
        pending.iter().for_each(|&t| ahead.push(t));
        ahead.greedy()
    }

    /// One generated token.
    pub fn push(&mut self, token: u32) {
        self.window.push(token);
        // A token the tokenizer cannot decode adds no text (the detokenizer
        // of the reply treats it the same way).
        let Ok(all) = self.tokenizer.decode(&self.window, false) else {
            self.window.pop();
            return;
        };
        let held = self.window.len() - self.decoded;
        if all.ends_with('\u{FFFD}') && held < MAX_HELD {
            return;
        }
        let before = self
            .tokenizer
            .decode(&self.window[..self.decoded], false)
            .unwrap_or_default();
        let new = all.strip_prefix(before.as_str()).map_or_else(
            || all.chars().skip(before.chars().count()).collect(),
            str::to_string,
        );
        self.tracker.push(&new);
        // Keep the last token as context for the next decode.
        let last = self.window.len() - 1;
        self.window.drain(..last);
        self.decoded = 1;
    }
}
