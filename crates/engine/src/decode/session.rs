//! The live session: a model state plus the exact tokens it covers, so the
//! next turn can reuse the longest exact token prefix instead of prefilling
//! the whole conversation again.

use crate::error::Result;
use crate::model::{Model, ModelState};

pub struct LiveSession<M: Model> {
    state: M::State,
    /// Exactly the tokens `state` covers, in order.
    tokens: Vec<u32>,
}

impl<M: Model> LiveSession<M> {
    pub fn new(model: &M) -> Self {
        Self {
            state: model.new_state(),
            tokens: Vec::new(),
        }
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn state(&self) -> &M::State {
        &self.state
    }

    /// Forget everything.
    pub fn reset(&mut self, model: &M) {
        self.state = model.new_state();
        self.tokens.clear();
    }

    /// Rewind the state to the longest exact prefix it shares with `prompt`
    /// and return how many prompt tokens it already covers. At least one
    /// prompt token is always left to process: the turn needs fresh logits
    /// for the prompt's last position. A state that cannot be truncated
    /// (recurrent families) is dropped rather than restored at the wrong
    /// point.
    pub fn rewind_for(&mut self, model: &M, prompt: &[u32]) -> usize {
        let mut keep = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        if keep == prompt.len() {
            keep = keep.saturating_sub(1);
        }
        if keep < self.tokens.len() {
            if self.state.truncate(keep).is_err() {
                self.reset(model);
                return 0;
            }
            self.tokens.truncate(keep);
        }
        keep
    }

    /// Run `tokens` through the model after the current state.
    pub(crate) fn record(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    pub(crate) fn state_mut(&mut self) -> &mut M::State {
        &mut self.state
    }

    /// Check the invariant that the token list and the state agree.
    pub fn is_consistent(&self) -> bool {
        self.state.len() == self.tokens.len()
    }

    /// A deep copy (for a session bank or for a test's comparison).
    pub fn snapshot(&self) -> Self {
        Self {
            state: self.state.snapshot(),
            tokens: self.tokens.clone(),
        }
    }

    /// Replace the whole session (e.g. restore a snapshot).
    pub fn restore(&mut self, other: &Self) -> Result<()> {
        *self = other.snapshot();
        Ok(())
    }
}
