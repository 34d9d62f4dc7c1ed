//! Completion token counts, the input of the nucleus law's penalties.

use std::collections::HashMap;

/// How often each token appeared in the completion so far (prompt excluded).
/// Empty by default and cheap to check, so laws without penalties pay nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenCounts {
    counts: HashMap<u32, u32>,
}

impl TokenCounts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Count one more occurrence of `token`.
    pub fn add(&mut self, token: u32) {
        let c = self.counts.entry(token).or_insert(0);
        *c = c.saturating_add(1);
    }

    /// Set the count of `token` (0 removes it).
    pub fn set(&mut self, token: u32, count: u32) {
        if count == 0 {
            self.counts.remove(&token);
        } else {
            self.counts.insert(token, count);
        }
    }

    /// Forget everything (a new completion).
    pub fn clear(&mut self) {
        self.counts.clear();
    }

    /// Occurrences of `token` (0 if never seen).
    pub fn get(&self, token: u32) -> u32 {
        self.counts.get(&token).copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Seen tokens with their (non-zero) counts, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.counts.iter().map(|(&t, &c)| (t, c))
    }
}
