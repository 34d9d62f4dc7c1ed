//! The in-memory session bank: snapshots of earlier sessions, reused by the
//! longest exact token prefix of a new prompt.
//!
//! A snapshot whose tokens are a prefix of the prompt is reused whole. One
//! that only shares a shorter prefix is reused only if its state can be
//! truncated (attention-only families); recurrent (hybrid) states refuse
//! truncation, so for them only stored boundaries — the exact end of a
//! banked session — are restore points. Anything else is a miss.
//!
//! The bank holds deep copies: the live session is never shared with it, so
//! a turn in progress cannot be evicted from under itself.

use crate::decode::{LiveSession, prefill};
use crate::error::Result;
use crate::model::Model;

struct Entry<M: Model> {
    session: LiveSession<M>,
    bytes: usize,
    hits: u64,
    last_used: u64,
}

pub struct SessionBank<M: Model> {
    entries: Vec<Entry<M>>,
    budget: usize,
    clock: u64,
}

/// What a lookup found.
pub struct BankHit<M: Model> {
    /// A deep copy, already rewound to the reused prefix.
    pub session: LiveSession<M>,
    /// Prompt tokens it covers.
    pub reused: usize,
}

impl<M: Model> SessionBank<M> {
    /// A bank holding at most `budget` bytes of snapshots.
    pub fn new(budget: usize) -> Self {
        Self {
            entries: Vec::new(),
            budget,
            clock: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn total_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Token keys of the banked snapshots.
    pub fn keys(&self) -> impl Iterator<Item = &[u32]> {
        self.entries.iter().map(|e| e.session.tokens())
    }

    /// Bank a deep copy of `session` (replacing a snapshot with the same
    /// key), then evict to the budget. Empty or inconsistent sessions are
    /// not banked. Returns whether it was kept.
    pub fn insert(&mut self, session: &LiveSession<M>) -> bool {
        if session.tokens().is_empty() || !session.is_consistent() {
            return false;
        }
        self.clock += 1;
        let snap = session.snapshot();
        let bytes = snap.byte_size();
        if bytes > self.budget {
            return false;
        }
        self.entries.retain(|e| e.session.tokens() != snap.tokens());
        self.entries.push(Entry {
            session: snap,
            bytes,
            hits: 0,
            last_used: self.clock,
        });
        while self.total_bytes() > self.budget {
            self.evict_one();
        }
        true
    }

    /// Drop the least useful snapshot: fewest hits per byte among the least
    /// recently used half breaks ties toward keeping snapshots that keep
    /// paying off; recency dominates.
    fn evict_one(&mut self) {
        let victim = self
            .entries
            .iter()
            .enumerate()
            .min_by_key(|(_, e)| (e.last_used, e.hits))
            .map(|(i, _)| i);
        if let Some(i) = victim {
            self.entries.remove(i);
        }
    }

    /// The best reusable snapshot for `prompt`, as a fresh deep copy rewound
    /// to the reused prefix (see [`LiveSession::rewind_for`]: a session
    /// covering the whole prompt keeps its last logits and samples at once).
    pub fn fetch(&mut self, model: &M, prompt: &[u32]) -> Option<BankHit<M>> {
        // Candidates by the prefix they could serve, longest first.
        let mut order: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let common = e
                    .session
                    .tokens()
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                (common, i)
            })
            .filter(|&(c, _)| c > 0)
            .collect();
        order.sort_by(|a, b| b.cmp(a));
        for (_, i) in order {
            let mut session = self.entries[i].session.snapshot();
            // Rewinding truncates an attention-only state to the shared
            // prefix; a recurrent state that would need truncating resets
            // instead (reuse 0), which is a miss for this entry.
            let reused = session.rewind_for(model, prompt);
            if reused > 0 {
                self.clock += 1;
                let e = &mut self.entries[i];
                e.hits += 1;
                e.last_used = self.clock;
                return Some(BankHit { session, reused });
            }
        }
        None
    }

    /// Extend `session` with `tokens` (no sampling), banking a boundary
    /// snapshot whenever the session length reaches a multiple of `every`
    /// and at the end. For hybrid families these boundaries are the only
    /// restore points inside a long prompt, so a later prompt that diverges
    /// part way still reuses all but less than `every` tokens. The MTP
    /// history is not kept in step here (the session drops it, as an AR
    /// turn does). On error the session is reset.
    pub fn prefill_with_boundaries(
        &mut self,
        model: &M,
        session: &mut LiveSession<M>,
        tokens: &[u32],
        every: usize,
        chunk: usize,
    ) -> Result<()> {
        let every = every.max(1);
        *session.mtp_mut() = None;
        let mut rest = tokens;
        while !rest.is_empty() {
            let len = session.tokens().len();
            let next = (len / every + 1) * every;
            let (seg, tail) = rest.split_at((next - len).min(rest.len()));
            match prefill(model, session.state_mut(), seg, chunk, &mut |_| {}) {
                Ok(out) => {
                    session.record(seg);
                    session.set_last_logits(Some(out.last_row().to_vec()));
                }
                Err(e) => {
                    session.reset(model);
                    return Err(e);
                }
            }
            self.insert(session);
            rest = tail;
        }
        Ok(())
    }
}
