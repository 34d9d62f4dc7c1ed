//! The session cache: one owner for everything that lets a turn start warm
//! — the live session, the in-memory [`SessionBank`] and, optionally, the
//! on-disk [`CheckpointStore`]. `run`, `chat` and the server's engine worker
//! all go through it, so they follow one policy.
//!
//! ## Policy
//!
//! Before a turn ([`SessionCache::prepare`]):
//!
//! 1. If the prompt does not extend the live session, the live state is
//!    *retired*: banked (unless the bank already holds it) and, when it
//!    covers at least `min_tokens`, saved to disk (unless already saved) —
//!    the "eviction of the live state" save trigger. The live session is then
//!    rewound to its longest reusable prefix (attention-only states truncate,
//!    keeping their MTP history; recurrent ones restart cold).
//! 2. The longest exact-prefix state wins: live, then the bank, then disk,
//!    each consulted only if it can beat what the previous ones offer
//!    (no copy or file read otherwise). An MTP turn only counts sessions
//!    whose MTP history is in step (it rebuilds any other from scratch).
//! 3. Otherwise the turn is cold.
//!
//! During a turn on a state that cannot be truncated (recurrent layers),
//! the prefill stops at every `boundary_every`-th prompt token and at the
//! end of the prompt to bank those states before decoding starts, so a
//! later prompt that branches there (a regenerated or edited reply, another
//! question on a shared long prefix) starts warm.
//!
//! After a turn ([`SessionCache::finish`]): the consistent session is banked
//! (a cancelled turn's too: it covers exactly what it processed), and saved
//! to disk when the turn left it [`FinalState::Complete`] and it covers at
//! least `min_tokens` ("end of a turn whose prompt is long enough"). On a
//! clean shutdown ([`SessionCache::shutdown`]) the live session is saved if
//! long enough and not yet on disk.
//!
//! Disk and bank failures never fail a turn: a checkpoint that cannot be
//! written costs a later cold prefill, and is logged and counted.

use std::path::PathBuf;

use super::bank::{SessionBank, common_prefix};
use super::checkpoint::{self, CheckpointStore};
use crate::decode::{
    self, FinalState, LiveSession, PromptMedia, TurnConfig, TurnObserver, TurnRequest, TurnResult,
    TurnTimings,
};
use crate::error::{EngineError, Result};
use crate::model::{LogitsRows, Model, ModelState};

/// Durable checkpoints for a [`SessionCache`].
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// The store's directory (created if missing).
    pub dir: PathBuf,
    /// The model file or directory, fingerprinted into the identity.
    pub model_path: PathBuf,
    /// Disk budget in bytes.
    pub budget: u64,
    /// Save only sessions covering at least this many tokens (shorter ones
    /// are cheaper to prefill than to load).
    pub min_tokens: usize,
}

/// Where a turn's starting state came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheSource {
    Live,
    Bank,
    Disk,
    Cold,
}

impl CacheSource {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheSource::Live => "live",
            CacheSource::Bank => "bank",
            CacheSource::Disk => "disk",
            CacheSource::Cold => "cold",
        }
    }
}

/// What [`SessionCache::prepare`] set up for the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    pub source: CacheSource,
    /// Prompt tokens the turn reuses (equal to the turn's
    /// [`TurnResult::reused_tokens`]).
    pub cached_tokens: usize,
}

/// Counters since the cache was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub live_hits: u64,
    pub bank_hits: u64,
    pub disk_hits: u64,
    pub misses: u64,
    /// Prompt tokens reused, summed over turns.
    pub cached_tokens: u64,
    pub saves: u64,
    pub save_failures: u64,
    /// End-of-prompt states banked for states that cannot be truncated.
    pub prompt_boundaries: u64,
}

impl CacheStats {
    pub fn hits(&self) -> u64 {
        self.live_hits + self.bank_hits + self.disk_hits
    }
}

pub struct SessionCache<M: Model> {
    live: LiveSession<M>,
    bank: SessionBank<M>,
    store: Option<CheckpointStore>,
    min_tokens: usize,
    /// The bank holds the live session as it is now.
    live_banked: bool,
    /// The store holds the live session as it is now (or a longer session
    /// it was truncated from).
    live_saved: bool,
    /// Bank a boundary every this many prompt tokens on states that cannot
    /// be truncated (0: only at the end of each prompt).
    boundary_every: usize,
    /// Whether the model's states have a truncate floor above 0 once they
    /// cover tokens (learned on the first turn that needs it).
    recurrent: Option<bool>,
    stats: CacheStats,
}

/// Default distance between banked prefill boundaries of states that cannot
/// be truncated: a prompt that diverges from an earlier one inside a long
/// shared part reuses up to the last boundary before the divergence.
pub const DEFAULT_BOUNDARY_EVERY: usize = 2048;

impl<M: Model> SessionCache<M> {
    /// A cache with a bank of `bank_budget` bytes and no disk store.
    pub fn new(model: &M, bank_budget: usize) -> Self {
        Self {
            live: LiveSession::new(model),
            bank: SessionBank::new(bank_budget),
            store: None,
            min_tokens: usize::MAX,
            live_banked: false,
            live_saved: false,
            boundary_every: DEFAULT_BOUNDARY_EVERY,
            recurrent: None,
            stats: CacheStats::default(),
        }
    }

    /// Bank a prefill boundary every `n` prompt tokens on states that
    /// cannot be truncated (0: only at the end of each prompt).
    pub fn with_boundary_every(mut self, n: usize) -> Self {
        self.boundary_every = n;
        self
    }

    /// A cache with a bank and, when `checkpoints` is given, the store in
    /// its directory (index rebuilt from the files, identity from the model
    /// path and family).
    pub fn open(
        model: &M,
        bank_budget: usize,
        checkpoints: Option<&CheckpointConfig>,
    ) -> Result<Self> {
        let mut cache = Self::new(model, bank_budget);
        if let Some(c) = checkpoints {
            let id =
                checkpoint::identity(&c.model_path, model.descriptor().name, &model.backend())?;
            let store =
                CheckpointStore::open(&c.dir, id, c.budget).map_err(|e| EngineError::File {
                    path: c.dir.clone(),
                    message: format!("opening the checkpoint store: {e}"),
                })?;
            cache.store = Some(store);
            cache.min_tokens = c.min_tokens;
        }
        Ok(cache)
    }

    /// Use `store` for checkpoints of sessions of at least `min_tokens`.
    pub fn with_store(mut self, store: CheckpointStore, min_tokens: usize) -> Self {
        self.store = Some(store);
        self.min_tokens = min_tokens;
        self
    }

    /// The live session (the turn runs on it after [`SessionCache::prepare`]).
    pub fn live(&self) -> &LiveSession<M> {
        &self.live
    }

    pub fn live_mut(&mut self) -> &mut LiveSession<M> {
        // Whatever the caller does, the copies may no longer match.
        self.live_banked = false;
        self.live_saved = false;
        &mut self.live
    }

    pub fn bank(&self) -> &SessionBank<M> {
        &self.bank
    }

    pub fn store(&self) -> Option<&CheckpointStore> {
        self.store.as_ref()
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Checkpoint files refused so far, by reason (empty without a store).
    pub fn rejections(&self) -> std::collections::BTreeMap<&'static str, u64> {
        self.store
            .as_ref()
            .map(|s| s.rejections().clone())
            .unwrap_or_default()
    }

    /// Set the live session up for a turn on `prompt` (see the module docs)
    /// and report where it came from. `mtp_depth` is the request's, as for
    /// [`decode::generate`].
    pub fn prepare(&mut self, model: &M, prompt: &[u32], mtp_depth: Option<usize>) -> Prepared {
        let needs_mtp = decode::resolve_mtp_depth(model, mtp_depth).is_ok_and(|d| d > 0);
        let in_step = |s: &LiveSession<M>| !needs_mtp || s.mtp_history().is_some();
        let live_len = self.live.tokens().len();
        let common = common_prefix(self.live.tokens(), prompt);
        let extends =
            common == live_len && (common < prompt.len() || self.live.last_logits().is_some());
        if live_len > 0 && !extends {
            self.retire_live();
        }
        let reused = self.live.rewind_for(model, prompt);
        if reused < live_len {
            self.live_banked = false;
            self.live_saved &= reused > 0;
        }
        let mut best = if in_step(&self.live) { reused } else { 0 };
        let mut source = if best > 0 {
            CacheSource::Live
        } else {
            CacheSource::Cold
        };
        if self.bank.best_common(prompt) > best
            && let Some(hit) = self.bank.fetch_better(model, prompt, best, needs_mtp)
        {
            best = hit.reused;
            source = CacheSource::Bank;
            self.live = hit.session;
            self.live_banked = true;
            self.live_saved = false;
        }
        if let Some(store) = self.store.as_mut() {
            let on_disk = store
                .entries()
                .iter()
                .map(|e| common_prefix(&e.tokens, prompt))
                .max()
                .unwrap_or(0);
            if on_disk > best
                && let Some(session) = store.lookup(model, prompt)
                && session.tokens().len() > best
                && in_step(&session)
            {
                best = session.tokens().len();
                source = CacheSource::Disk;
                self.live = session;
                self.live_banked = false;
                self.live_saved = true;
            }
        }
        match source {
            CacheSource::Live => self.stats.live_hits += 1,
            CacheSource::Bank => self.stats.bank_hits += 1,
            CacheSource::Disk => self.stats.disk_hits += 1,
            CacheSource::Cold => self.stats.misses += 1,
        }
        self.stats.cached_tokens += best as u64;
        Prepared {
            source,
            cached_tokens: best,
        }
    }

    /// Bank the finished turn's session and save it when the turn completed
    /// and it is long enough (see the module docs). `None`: the turn failed
    /// (the decode loop reset the session; nothing to keep).
    pub fn finish(&mut self, turn: Option<&TurnResult>) {
        self.live_banked = false;
        self.live_saved = false;
        let Some(turn) = turn else {
            return;
        };
        if self.live.tokens().is_empty() || !self.live.is_consistent() {
            return;
        }
        self.live_banked = self.bank.insert(&self.live);
        if turn.final_state == FinalState::Complete {
            self.save_live();
        }
    }

    /// One turn through the cache: [`SessionCache::prepare`],
    /// [`SessionCache::decode_turn`], [`SessionCache::finish`].
    pub fn generate(
        &mut self,
        model: &M,
        request: TurnRequest<'_>,
        observer: &mut dyn TurnObserver,
    ) -> (Prepared, Result<TurnResult>) {
        let prepared = self.prepare(model, request.prompt, request.mtp_depth);
        let result = self.decode_turn(model, request, observer);
        self.finish(result.as_ref().ok());
        (prepared, result)
    }

    /// The turn itself, on the live session [`SessionCache::prepare`] set
    /// up: [`decode::generate`], except that on a state that cannot be
    /// truncated the prefill boundaries (every `boundary_every` tokens and
    /// the end of the prompt) are banked first (see
    /// `generate_from_prompt_boundary`). Call [`SessionCache::finish`] after.
    pub fn decode_turn(
        &mut self,
        model: &M,
        request: TurnRequest<'_>,
        observer: &mut dyn TurnObserver,
    ) -> Result<TurnResult> {
        self.decode_turn_with_media(model, request, None, observer)
    }

    /// [`SessionCache::decode_turn`] for a prompt with media
    /// ([`decode::generate_with_media`]): `request.prompt` holds the keys
    /// every cache matches, so a prefix is reused only with the same images.
    pub fn decode_turn_with_media(
        &mut self,
        model: &M,
        request: TurnRequest<'_>,
        media: Option<&PromptMedia<'_>>,
        observer: &mut dyn TurnObserver,
    ) -> Result<TurnResult> {
        let prompt = request.prompt;
        let covered = common_prefix(self.live.tokens(), prompt);
        if covered < prompt.len()
            && request.config.max_tokens > 0
            && self.live_is_recurrent(model, media.map_or(prompt, |m| &m.tokens))?
        {
            self.generate_from_prompt_boundary(model, request, media, observer)
        } else {
            decode::generate_with_media(model, &mut self.live, request, media, observer)
        }
    }

    /// Whether the live state, once the turn extends it, can no longer be
    /// truncated back to the prompt boundaries ([`ModelState::truncate_floor`]
    /// above 0: recurrent layers). An empty state's floor is 0 whatever the
    /// family, so for one the answer is learned once, from a one-token
    /// forward of `prompt` on a scratch state (its bits are not used).
    fn live_is_recurrent(&mut self, model: &M, prompt: &[u32]) -> Result<bool> {
        let state = self.live.state();
        if !state.is_empty() {
            let recurrent = state.truncate_floor() > 0;
            self.recurrent = Some(recurrent);
            return Ok(recurrent);
        }
        if let Some(recurrent) = self.recurrent {
            return Ok(recurrent);
        }
        let mut probe = model.new_state();
        model.forward(&prompt[..1], &mut probe, LogitsRows::Last)?;
        let recurrent = probe.truncate_floor() > 0;
        self.recurrent = Some(recurrent);
        Ok(recurrent)
    }

    /// A turn on a state that cannot be truncated, in steps: prefill the
    /// prompt as zero-token turns that stop at every `boundary_every`-th
    /// token and at the end of the prompt, banking each of those boundary
    /// states, then decode from the last. A later prompt that branches at
    /// one of them (a regenerated or edited reply, or a shared long prefix)
    /// starts there instead of cold. The decode step finds the whole prompt
    /// and its last logits in the session and prefills nothing; the kernels
    /// are row-independent, so the tokens and bits are a one-step turn's.
    fn generate_from_prompt_boundary(
        &mut self,
        model: &M,
        request: TurnRequest<'_>,
        media: Option<&PromptMedia<'_>>,
        observer: &mut dyn TurnObserver,
    ) -> Result<TurnResult> {
        let TurnRequest {
            prompt,
            sampler,
            config,
            mtp_depth,
        } = request;
        let reused = common_prefix(self.live.tokens(), prompt);
        let started = std::time::Instant::now();
        let n = self.boundary_every;
        let mut ends: Vec<usize> = match reused.checked_div(n) {
            Some(whole) => ((whole + 1) * n..prompt.len()).step_by(n).collect(),
            None => Vec::new(),
        };
        ends.push(prompt.len());
        for end in ends {
            // A zero-token turn: it prefills and emits nothing.
            let prefill_only = TurnRequest {
                prompt: &prompt[..end],
                sampler: &mut *sampler,
                config: TurnConfig {
                    max_tokens: 0,
                    ..config.clone()
                },
                mtp_depth,
            };
            let step =
                decode::generate_with_media(model, &mut self.live, prefill_only, media, observer)?;
            if step.final_state != FinalState::Complete {
                // Cancelled during the prefill: that is this turn.
                return Ok(TurnResult {
                    reused_tokens: reused,
                    timings: TurnTimings {
                        prefill_tokens: self.live.tokens().len() - reused,
                        prefill: started.elapsed(),
                        ..TurnTimings::default()
                    },
                    ..step
                });
            }
            if self.live.is_consistent() {
                self.bank.insert(&self.live);
                self.stats.prompt_boundaries += 1;
            }
        }
        let prefill = started.elapsed();
        let request = TurnRequest {
            prompt,
            sampler,
            config,
            mtp_depth,
        };
        let mut turn =
            decode::generate_with_media(model, &mut self.live, request, media, observer)?;
        turn.reused_tokens = reused;
        turn.timings.prefill_tokens = prompt.len() - reused;
        turn.timings.prefill = prefill;
        Ok(turn)
    }

    /// Clean shutdown: save the live session if it is long enough and not
    /// on disk yet.
    pub fn shutdown(&mut self) {
        if self.live.is_consistent() {
            self.save_live();
        }
    }

    /// The live session is about to be replaced: keep it in the bank and,
    /// if long enough, on disk.
    fn retire_live(&mut self) {
        if !self.live.is_consistent() {
            return;
        }
        if !self.live_banked {
            self.live_banked = self.bank.insert(&self.live);
        }
        self.save_live();
    }

    fn save_live(&mut self) {
        let Some(store) = self.store.as_mut() else {
            return;
        };
        if self.live_saved || self.live.tokens().len() < self.min_tokens.max(1) {
            return;
        }
        match store.save(&self.live) {
            Ok(_) => {
                self.stats.saves += 1;
                self.live_saved = true;
            }
            Err(e) => {
                self.stats.save_failures += 1;
                tracing::warn!("checkpoint not saved: {e}");
            }
        }
    }
}
