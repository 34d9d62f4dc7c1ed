//! One request's grammar state: a `llguidance` matcher plus the tokens it
//! has consumed, answering "which tokens may come after `emitted +
//! pending`" for the decode loops.

use std::time::{Duration, Instant};

use ds4_engine::decode::TokenMask;
use llguidance::{Matcher, TokenParser};

/// How `llguidance` names a state no token can extend.
const NO_EXTENSION: &str = "NoExtensionBias";

/// Time spent computing masks (what `llguidance` costs per position).
#[derive(Debug, Clone, Default)]
pub struct MaskTimings {
    /// One entry per mask computed (rollback and consumption included).
    pub per_mask: Vec<Duration>,
}

/// A compiled grammar and where the reply stands in it. Per request: it is
/// never part of a session or a checkpoint, so a warm turn under a grammar
/// starts it exactly as a cold one does.
pub struct Constraint {
    matcher: Matcher,
    /// The matcher before any token: a dead end (no token allowed) leaves
    /// `llguidance`'s matcher stopped for good, so the state is rebuilt
    /// from here and the tokens replayed.
    fresh: Matcher,
    /// Tokens the matcher has consumed: the emitted ones, then the pending
    /// ones of the last question.
    fed: Vec<u32>,
    /// Tokens emitted so far in the turn.
    emitted: Vec<u32>,
    stop_ids: Vec<u32>,
    len: usize,
    /// The first internal error (a token the matcher refused, which the
    /// masks should have prevented): every later position admits nothing.
    error: Option<String>,
    timings: MaskTimings,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("emitted", &self.emitted.len())
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl Constraint {
    pub(crate) fn new(parser: TokenParser, stop_ids: &[u32], len: usize) -> Self {
        let matcher = Matcher::new(Ok(parser));
        Self {
            fresh: matcher.clone(),
            matcher,
            fed: Vec::new(),
            emitted: Vec::new(),
            stop_ids: stop_ids.to_vec(),
            len,
            error: None,
            timings: MaskTimings::default(),
        }
    }

    /// An emitted token (the decode loop's observer sees each in order).
    pub fn push(&mut self, token: u32) {
        self.emitted.push(token);
    }

    /// The tokens emitted so far.
    pub fn emitted(&self) -> &[u32] {
        &self.emitted
    }

    /// The tokens allowed after the emitted tokens and then `pending`. The
    /// matcher is rolled back to the longest common prefix of what it
    /// consumed and `emitted + pending` and fed the rest, so the answer
    /// depends on those tokens alone (a rejected MTP draft is undone here).
    /// After a stop token nothing is allowed (the turn has ended there).
    /// When the grammar is complete only the stop ids are allowed; when it
    /// can end or go on, the stop ids join its mask.
    pub fn allowed_after(&mut self, pending: &[u32]) -> TokenMask {
        let start = Instant::now();
        let mask = self.compute(pending);
        self.timings.per_mask.push(start.elapsed());
        mask
    }

    fn compute(&mut self, pending: &[u32]) -> TokenMask {
        let none = TokenMask::none(self.len);
        if self.error.is_some() {
            return none;
        }
        let target: Vec<u32> = self.emitted.iter().chain(pending).copied().collect();
        if target.iter().any(|t| self.stop_ids.contains(t)) {
            return none;
        }
        let common = self
            .fed
            .iter()
            .zip(&target)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.fed.len() {
            if let Err(e) = self.matcher.rollback(self.fed.len() - common) {
                return self.fail(format!("rollback: {e}"));
            }
            self.fed.truncate(common);
        }
        if common < target.len() {
            if let Err(e) = self.matcher.consume_tokens(&target[common..]) {
                return self.fail(format!("token refused by the grammar: {e}"));
            }
            self.fed.extend_from_slice(&target[common..]);
        }
        if self.matcher.is_stopped() {
            return match self.matcher.get_error() {
                Some(e) => self.fail(e),
                None => TokenMask::from_tokens(self.len, self.stop_ids.iter().copied()),
            };
        }
        match self.matcher.compute_mask() {
            Ok(vob) => {
                let can_end = self.stop_ids.iter().any(|&t| vob.is_allowed(t));
                let mask = TokenMask::from_words(vob.as_slice().to_vec(), self.len);
                if can_end {
                    let mut ids: Vec<u32> = Vec::new();
                    vob.iter_set_entries(|t| ids.push(t as u32));
                    ids.extend(&self.stop_ids);
                    TokenMask::from_tokens(self.len, ids)
                } else {
                    mask
                }
            }
            // No token can extend the text: a dead end of the grammar, not
            // an internal error. The matcher stays stopped, so start over
            // from the fresh one (a rejected MTP draft may lead elsewhere).
            // (`llguidance` reports it as an error with that stop reason.)
            Err(e) if format!("{e}").contains(NO_EXTENSION) => {
                self.matcher = self.fresh.clone();
                self.fed.clear();
                TokenMask::none(self.len)
            }
            Err(e) => self.fail(format!("mask: {e}")),
        }
    }

    fn fail(&mut self, message: String) -> TokenMask {
        self.error.get_or_insert(message);
        TokenMask::none(self.len)
    }

    /// The internal error that ended the grammar, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Whether the emitted text is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        let emitted = self.emitted.clone();
        let ended = emitted.last().is_some_and(|t| self.stop_ids.contains(t));
        let body = if ended {
            &emitted[..emitted.len() - 1]
        } else {
            &emitted[..]
        };
        let common = self
            .fed
            .iter()
            .zip(body)
            .take_while(|(a, b)| a == b)
            .count();
        if self.matcher.rollback(self.fed.len() - common).is_err() {
            return false;
        }
        self.fed.truncate(common);
        if self.matcher.consume_tokens(&body[common..]).is_err() {
            return false;
        }
        self.fed.extend_from_slice(&body[common..]);
        self.matcher.is_stopped() && self.matcher.get_error().is_none()
            || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Mask computation times so far.
    pub fn timings(&self) -> &MaskTimings {
        &self.timings
    }
}
