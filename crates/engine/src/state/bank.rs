//! The in-memory session bank: snapshots of earlier sessions, reused by the
//! longest exact token prefix of a new prompt.
//!
//! A snapshot whose tokens are a prefix of the prompt is reused whole. One
//! that only shares a shorter prefix is reused only if its state can be
//! truncated that far ([`crate::ModelState::truncate_floor`]: any prefix for
//! attention-only families); recurrent (hybrid) states refuse truncation,
//! so for them only stored boundaries — the exact end of a banked session —
//! are restore points. Anything else is a miss.
//!
//! The bank holds deep copies: the live session is never shared with it, so
//! a turn in progress cannot be evicted from under itself.
//!
//! ## Eviction by usefulness
//!
//! When the bank is over its memory budget it drops the entry with the
//! lowest *usefulness*
//!
//! ```text
//! usefulness = (tokens / bytes) × (1 + hits) / (1 + age)
//! ```
//!
//! where `tokens` is the prefix the entry can save a later prompt from
//! prefilling, `bytes` what it costs to keep, `hits` how often it was
//! reused, and `age` the number of bank operations (inserts and hits) since
//! it was last inserted or hit. So a snapshot that keeps paying off outlives
//! a newer one nobody asked for, recency still wins between equally used
//! ones, and per byte a long hybrid snapshot (fixed-size recurrent state) is
//! worth more than a short one. The entry just inserted is never the victim
//! of its own insertion (unless it alone exceeds the budget, when it is not
//! kept at all).

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
        // A snapshot replacing one with the same key keeps its hit count.
        let mut hits = 0;
        self.entries.retain(|e| {
            let same = e.session.tokens() == snap.tokens();
            if same {
                hits = e.hits;
            }
            !same
        });
        self.entries.push(Entry {
            session: snap,
            bytes,
            hits,
            last_used: self.clock,
        });
        while self.total_bytes() > self.budget {
            // The new entry is last; it fits alone (checked above).
            let Some(victim) = self.least_useful(self.entries.len() - 1) else {
                break;
            };
            self.entries.remove(victim);
        }
        true
    }

    /// Usefulness of an entry (see the module docs); higher is kept longer.
    fn usefulness(&self, e: &Entry<M>) -> f64 {
        let tokens = e.session.tokens().len() as f64;
        let bytes = e.bytes.max(1) as f64;
        let age = self.clock.saturating_sub(e.last_used) as f64;
        tokens / bytes * (1.0 + e.hits as f64) / (1.0 + age)
    }

    /// The entry to evict: the least useful one other than `protect`.
    fn least_useful(&self, protect: usize) -> Option<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != protect)
            .map(|(i, e)| (i, self.usefulness(e)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
    }

    /// How often each banked snapshot was reused, by key length (tests,
    /// diagnostics).
    pub fn hits(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.entries
            .iter()
            .map(|e| (e.session.tokens().len(), e.hits))
    }

    /// The best reusable snapshot for `prompt`, as a fresh deep copy rewound
    /// to the reused prefix (see [`LiveSession::rewind_for`]: a session
    /// covering the whole prompt keeps its last logits and samples at once).
    pub fn fetch(&mut self, model: &M, prompt: &[u32]) -> Option<BankHit<M>> {
        self.fetch_better(model, prompt, 0, false)
    }

    /// The longest prefix any banked snapshot shares with `prompt` (an upper
    /// bound on what [`SessionBank::fetch`] can reuse; no copy is made).
    pub fn best_common(&self, prompt: &[u32]) -> usize {
        self.entries
            .iter()
            .map(|e| common_prefix(e.session.tokens(), prompt))
            .max()
            .unwrap_or(0)
    }

    /// Like [`SessionBank::fetch`], but only a hit reusing more than
    /// `better_than` tokens counts (no copy is made of snapshots that cannot
    /// beat it), and with `needs_mtp` only snapshots whose MTP history is in
    /// step with the trunk qualify (an MTP turn rebuilds any other session
    /// from scratch).
    pub fn fetch_better(
        &mut self,
        model: &M,
        prompt: &[u32],
        better_than: usize,
        needs_mtp: bool,
    ) -> Option<BankHit<M>> {
        // Candidates by the prefix they could serve, longest first.
        let mut order: Vec<(usize, usize)> = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| !needs_mtp || e.session.mtp_history().is_some())
            // No copy of a snapshot that cannot be rewound far enough (a
            // recurrent state below its truncate floor would reset).
            .filter(|(_, e)| e.session.reusable_for(prompt) > better_than)
            .map(|(i, e)| (common_prefix(e.session.tokens(), prompt), i))
            .collect();
        order.sort_by(|a, b| b.cmp(a));
        for (_, i) in order {
            let mut session = self.entries[i].session.snapshot();
            // Rewinding truncates an attention-only state to the shared
            // prefix; a recurrent state that would need truncating resets
            // instead (reuse 0), which is a miss for this entry.
            let reused = session.rewind_for(model, prompt);
            let in_step = !needs_mtp || session.mtp_history().is_some();
            if reused > better_than && in_step {
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

/// Length of the longest common prefix of two token lists.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
