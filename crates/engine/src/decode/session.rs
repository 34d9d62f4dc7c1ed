//! The live session: a model state plus the exact tokens it covers, so the
//! next turn can reuse the longest exact token prefix instead of prefilling
//! the whole conversation again.
//!
//! After a turn the session covers exactly `prompt + emitted` (see
//! [`super::turn::FinalState`]) and keeps the logits row of its last
//! position, so a next turn whose prompt only appends prefills just the new
//! tokens, and one whose prompt equals the covered tokens samples at once.
//! A session used by the MTP loop also keeps the MTP history (one row less
//! than the trunk: row `t` needs the token at `t + 1`) and the trunk hidden
//! of the last position (the input of the next MTP row).

use crate::error::Result;
use crate::model::{Hidden, Model, ModelState, MtpHistory};

/// The MTP side of a session: `history.len() + 1 == tokens.len()` and
/// `hidden` is the trunk hidden of the last covered position (both empty for
/// an empty session).
pub(crate) struct MtpSide {
    pub history: Box<dyn MtpHistory>,
    pub hidden: Option<Hidden>,
}

impl MtpSide {
    fn snapshot(&self) -> Self {
        Self {
            history: self.history.boxed_clone(),
            hidden: self.hidden.clone(),
        }
    }
}

pub struct LiveSession<M: Model> {
    state: M::State,
    /// Exactly the tokens `state` covers, in order.
    tokens: Vec<u32>,
    /// Logits row of the last covered position, when known.
    last_logits: Option<Vec<f32>>,
    /// Present only while the MTP history is in step with the trunk.
    mtp: Option<MtpSide>,
}

impl<M: Model> LiveSession<M> {
    pub fn new(model: &M) -> Self {
        Self {
            state: model.new_state(),
            tokens: Vec::new(),
            last_logits: None,
            mtp: None,
        }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn state(&self) -> &M::State {
        &self.state
    }

    /// Logits row of the last covered position (kept at the end of a turn).
    pub fn last_logits(&self) -> Option<&[f32]> {
        self.last_logits.as_deref()
    }

    /// The MTP history, when the last turn kept it in step with the trunk.
    pub fn mtp_history(&self) -> Option<&dyn MtpHistory> {
        self.mtp.as_ref().map(|m| m.history.as_ref())
    }

    /// Trunk hidden of the last covered position (MTP sessions).
    pub fn mtp_hidden(&self) -> Option<&Hidden> {
        self.mtp.as_ref().and_then(|m| m.hidden.as_ref())
    }

    /// Forget everything.
    pub fn reset(&mut self, model: &M) {
        self.state = model.new_state();
        self.tokens.clear();
        self.last_logits = None;
        self.mtp = None;
    }

    /// Rewind the state to the longest exact prefix it shares with `prompt`
    /// and return how many prompt tokens it already covers.
    ///
    /// When the session is a prefix of `prompt` nothing is dropped; if it
    /// covers all of `prompt` it must hold the last logits row (else one
    /// token is dropped so the turn gets fresh logits). Dropping tokens also
    /// drops the kept logits and the MTP side. A state that cannot be
    /// truncated (recurrent families) is reset rather than restored at the
    /// wrong point.
    pub fn rewind_for(&mut self, model: &M, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        if common == self.tokens.len()
            && (common < prompt.len() || (self.last_logits.is_some() && !prompt.is_empty()))
        {
            return common;
        }
        let keep = common.min(prompt.len().saturating_sub(1));
        self.last_logits = None;
        self.mtp = None;
        if self.state.truncate(keep).is_err() {
            self.reset(model);
            return 0;
        }
        self.tokens.truncate(keep);
        keep
    }

    /// Note that `tokens` were run through the model after the current state.
    pub(crate) fn record(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    pub(crate) fn set_last_logits(&mut self, logits: Option<Vec<f32>>) {
        self.last_logits = logits;
    }

    pub(crate) fn state_mut(&mut self) -> &mut M::State {
        &mut self.state
    }

    pub(crate) fn mtp_mut(&mut self) -> &mut Option<MtpSide> {
        &mut self.mtp
    }

    /// Check the invariant that the token list and the state agree (and the
    /// MTP history is one row behind the trunk).
    pub fn is_consistent(&self) -> bool {
        let mtp_ok = self.mtp.as_ref().is_none_or(|m| {
            m.history.len() + 1 == self.tokens.len().max(1)
                && (m.hidden.is_some() != self.tokens.is_empty())
        });
        self.state.len() == self.tokens.len() && mtp_ok
    }

    /// A deep copy (for a session bank or for a test's comparison).
    pub fn snapshot(&self) -> Self {
        Self {
            state: self.state.snapshot(),
            tokens: self.tokens.clone(),
            last_logits: self.last_logits.clone(),
            mtp: self.mtp.as_ref().map(MtpSide::snapshot),
        }
    }

    /// Replace the whole session (e.g. restore a snapshot).
    pub fn restore(&mut self, other: &Self) -> Result<()> {
        *self = other.snapshot();
        Ok(())
    }
}
