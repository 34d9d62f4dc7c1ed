//! Continuous batching without touching the decode loops: every session's
//! turn runs on its own thread exactly as it runs alone
//! ([`crate::decode::generate`]), on a [`BatchingModel`], whose `forward`
//! meets the other sessions' pending forwards and runs them as one
//! [`Model::forward_batch`]. The kernels are row-independent, so a session's
//! logits — and so its tokens, draws and cache — are those of the same turn
//! served alone, whatever else runs (tested bit for bit).
//!
//! The meeting (a leader / follower rendezvous): a forward queues a ticket
//! and waits. The first waiter that finds no batch running becomes the
//! leader: it waits until every session [`BatchingModel::join`]ed has a
//! ticket queued, or until none arrived for [`BatchConfig::gather`] (at
//! most eight such windows in all), takes the queued
//! tickets in arrival order up to [`BatchConfig::max_tokens`] rows (at
//! least one ticket, so a long prefill chunk runs alone), runs them as one
//! batch while the others wait, posts each result to its ticket and hands
//! the lead on. Arrival order keeps the queue fair: no session's forward
//! waits behind more than the forwards queued before it.
//!
//! Where a batch runs: on the leader's thread, or, inside
//! [`BatchingModel::with_executor`], on one thread kept for it (the leader
//! hands the batch over and waits): the same bits either way, but one warm
//! thread does the host's part of a step in half the time (run 38).
//!
//! An MTP turn's trunk forwards join the batches too: its prefill
//! (`forward_hidden`) and its verify windows (`forward_window`) are
//! tickets like a decode step, and the family's batched pass returns each
//! one's hidden rows and window record ([`BatchWant`]). Its draft steps
//! (`mtp_forward`) are tickets of their own kind: a batch holds one kind,
//! the front ticket's (the others keep their places), and a batch of
//! drafts runs as one [`Model::mtp_forward_batch`], so the sessions' draft
//! steps meet as their windows do. Forwards with media run alone, one at a
//! time with the batches.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::BackendId;
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::model::{
    BatchCall, BatchResult, BatchWant, ForwardOutput, LogitsRows, MediaChunk, Model, ModelState,
    MtpCall, MtpContract, MtpStep, VerifyWindow,
};

/// The leader waits at most this many `gather` windows in all.
const GATHER_ROUNDS: u32 = 8;

/// How the leader forms a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchConfig {
    /// Rows of one batch at most (decode rows and prefill chunks together;
    /// a single larger forward runs alone).
    pub max_tokens: usize,
    /// How long the leader waits for the joined sessions that have no
    /// forward queued yet (they are sampling, or between turns): `gather`
    /// after the last one arrived, at most 8 × `gather` in all.
    pub gather: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_tokens: 512,
            gather: Duration::from_micros(500),
        }
    }
}

/// Counters since the model was wrapped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batches run (a forward alone counts as a batch of one).
    pub batches: u64,
    /// Forwards run in them.
    pub forwards: u64,
    /// The most forwards one batch held.
    pub largest: u64,
    /// Nanoseconds the leaders waited for sessions to queue their
    /// forwards before taking a batch (the gather), all batches together.
    pub gather_ns: u64,
    /// Nanoseconds the batches' forwards ran, all together.
    pub run_ns: u64,
    /// Batches the executor thread ran ([`BatchingModel::with_executor`]).
    pub executed: u64,
    /// MTP verify windows and MTP prefills (forwards that return hidden
    /// rows) run in batches with other forwards.
    pub shared_mtp: u64,
    /// MTP head calls (draft steps) run in batches of two or more.
    pub shared_drafts: u64,
}

/// A model whose forwards from several threads run as batches (module
/// docs). Clones share the batches.
pub struct BatchingModel<'m, M: Model> {
    inner: &'m M,
    hub: Arc<Hub<M>>,
}

impl<M: Model> Clone for BatchingModel<'_, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner,
            hub: self.hub.clone(),
        }
    }
}

/// A queued call. The pointers are the waiting caller's: it blocks until
/// its ticket's result is posted, so they stay valid and unaliased while
/// the leader uses them.
struct Ticket<M: Model> {
    id: u64,
    tokens: *const u32,
    len: usize,
    work: Work<M>,
}

/// What a ticket asks for: a trunk forward, or an MTP head call.
enum Work<M: Model> {
    Trunk {
        state: *mut M::State,
        rows: LogitsRows,
        want: BatchWant,
    },
    Draft {
        hidden: *const M::Hidden,
        history: *mut M::MtpHistory,
    },
}

impl<M: Model> Work<M> {
    fn is_draft(&self) -> bool {
        matches!(self, Work::Draft { .. })
    }
}

/// A ticket's result.
enum Output<M: Model> {
    Trunk(BatchResult<M>),
    Draft(MtpStep<M::Hidden>),
}

// SAFETY: a ticket is only dereferenced by the leader while its owner
// waits in `BatchingModel::queue` (see `Ticket`); states, hidden rows and
// histories are `Send` (hidden rows also `Sync`).
unsafe impl<M: Model> Send for Ticket<M> {}

struct Queue<M: Model> {
    pending: VecDeque<Ticket<M>>,
    done: HashMap<u64, Result<Output<M>>>,
    leading: bool,
    next: u64,
    joined: usize,
}

/// A batch's tickets and, in order, their results.
type Ran<M> = (Vec<Ticket<M>>, Vec<Result<Output<M>>>);

/// A hand-off's outcome: the batch run, or the batch back (no executor).
type Handed<M> = std::result::Result<Ran<M>, Vec<Ticket<M>>>;

/// The executor's hand-off ([`BatchingModel::with_executor`]): a leader's
/// batch to run, its results, and whether an executor runs.
struct Handoff<M: Model> {
    job: Option<Vec<Ticket<M>>>,
    done: Option<Ran<M>>,
    running: bool,
    closed: bool,
}

struct Hub<M: Model> {
    queue: Mutex<Queue<M>>,
    handoff: Mutex<Handoff<M>>,
    /// The executor: a job posted or the executor closed; the leader: its
    /// results posted.
    handed: Condvar,
    /// Followers: results posted, or the lead free.
    wake: Condvar,
    /// The gathering leader: a ticket queued, or a session left. Apart
    /// from `wake` so that 64 arrivals do not wake 64 waiting followers
    /// each (on one mutex, that took milliseconds a step).
    arrive: Condvar,
    /// One batch, or one unbatched call, at a time.
    exec: Mutex<()>,
    config: BatchConfig,
    batches: AtomicU64,
    forwards: AtomicU64,
    largest: AtomicU64,
    gather_ns: AtomicU64,
    run_ns: AtomicU64,
    executed: AtomicU64,
    shared_mtp: AtomicU64,
    shared_drafts: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere never leaves the queue half-updated (see
    // `LeadGuard`), so a poisoned lock's data is sound.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registration of a session that will call `forward` again soon (a turn
/// in progress): the leader waits for it. Dropped at the end of the turn.
pub struct Joined<M: Model> {
    hub: Arc<Hub<M>>,
}

impl<M: Model> Drop for Joined<M> {
    fn drop(&mut self) {
        let mut q = lock(&self.hub.queue);
        q.joined = q.joined.saturating_sub(1);
        self.hub.arrive.notify_all();
    }
}

/// Posts an error to the tickets a leader took if its batch panicked, and
/// hands the lead on, so no follower waits forever.
struct LeadGuard<'a, M: Model> {
    hub: &'a Hub<M>,
    ids: Vec<u64>,
    armed: bool,
}

impl<M: Model> Drop for LeadGuard<'_, M> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut q = lock(&self.hub.queue);
        for id in self.ids.drain(..) {
            q.done
                .entry(id)
                .or_insert_with(|| Err(EngineError::State("a batched forward panicked".into())));
        }
        q.leading = false;
        self.hub.wake.notify_all();
    }
}

impl<'m, M: Model> BatchingModel<'m, M> {
    /// Batch the forwards of `inner` (the threads sharing it run in a
    /// scope that borrows it).
    pub fn new(inner: &'m M, config: BatchConfig) -> Self {
        Self {
            inner,
            hub: Arc::new(Hub {
                queue: Mutex::new(Queue {
                    pending: VecDeque::new(),
                    done: HashMap::new(),
                    leading: false,
                    next: 0,
                    joined: 0,
                }),
                wake: Condvar::new(),
                arrive: Condvar::new(),
                handoff: Mutex::new(Handoff {
                    job: None,
                    done: None,
                    running: false,
                    closed: false,
                }),
                handed: Condvar::new(),
                exec: Mutex::new(()),
                config,
                batches: AtomicU64::new(0),
                forwards: AtomicU64::new(0),
                largest: AtomicU64::new(0),
                gather_ns: AtomicU64::new(0),
                run_ns: AtomicU64::new(0),
                executed: AtomicU64::new(0),
                shared_mtp: AtomicU64::new(0),
                shared_drafts: AtomicU64::new(0),
            }),
        }
    }

    /// The wrapped model.
    pub fn inner(&self) -> &'m M {
        self.inner
    }

    /// Register a session whose turn is running (hold the guard for the
    /// turn): batches wait briefly for its forwards.
    pub fn join(&self) -> Joined<M> {
        lock(&self.hub.queue).joined += 1;
        Joined {
            hub: self.hub.clone(),
        }
    }

    pub fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.hub.batches.load(Ordering::Relaxed),
            forwards: self.hub.forwards.load(Ordering::Relaxed),
            largest: self.hub.largest.load(Ordering::Relaxed),
            gather_ns: self.hub.gather_ns.load(Ordering::Relaxed),
            run_ns: self.hub.run_ns.load(Ordering::Relaxed),
            executed: self.hub.executed.load(Ordering::Relaxed),
            shared_mtp: self.hub.shared_mtp.load(Ordering::Relaxed),
            shared_drafts: self.hub.shared_drafts.load(Ordering::Relaxed),
        }
    }

    /// Run `f` alone, between batches.
    fn alone<T>(&self, f: impl FnOnce(&M) -> T) -> T {
        let _exec = lock(&self.hub.exec);
        f(self.inner)
    }

    /// The leader's part: gather, take a batch, run it, post the results.
    fn lead(&self, mut q: MutexGuard<'_, Queue<M>>) -> MutexGuard<'_, Queue<M>> {
        let hub = &*self.hub;
        q.leading = true;
        // Wait while the missing sessions keep arriving: `gather` after the
        // last arrival, `GATHER_ROUNDS × gather` in all. A fixed window
        // from the lead split 64 streams into two alternating half batches
        // (their threads wake and sample one after another after each
        // batch, which took longer than one window).
        let start = Instant::now();
        let cap = start + hub.config.gather * GATHER_ROUNDS;
        let (mut seen, mut deadline) = (q.pending.len(), start + hub.config.gather);
        while q.pending.len() < q.joined {
            let now = Instant::now();
            let until = deadline.min(cap);
            if now >= until {
                break;
            }
            q = hub
                .arrive
                .wait_timeout(q, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if q.pending.len() > seen {
                seen = q.pending.len();
                deadline = Instant::now() + hub.config.gather;
            }
        }
        let ran_from = Instant::now();
        // The front ticket's kind: every queued ticket of that kind in
        // order, up to `max_tokens` rows (the others keep their places).
        let drafts = q.pending.front().is_some_and(|t| t.work.is_draft());
        let mut batch = Vec::new();
        let mut rest = VecDeque::with_capacity(q.pending.len());
        let mut rows = 0;
        while let Some(t) = q.pending.pop_front() {
            if t.work.is_draft() != drafts {
                rest.push_back(t);
                continue;
            }
            if !batch.is_empty() && rows + t.len > hub.config.max_tokens {
                rest.push_back(t);
                rest.extend(q.pending.drain(..));
                break;
            }
            rows += t.len;
            batch.push(t);
        }
        q.pending = rest;
        drop(q);
        let mut guard = LeadGuard {
            hub,
            ids: batch.iter().map(|t| t.id).collect(),
            armed: true,
        };
        let (batch, results) = match self.hand_off(batch) {
            Ok(done) => done,
            Err(batch) => {
                let results = self.run_batch(&batch);
                (batch, results)
            }
        };
        guard.armed = false;
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        hub.gather_ns
            .fetch_add(nanos(ran_from - start), Ordering::Relaxed);
        hub.run_ns
            .fetch_add(nanos(ran_from.elapsed()), Ordering::Relaxed);
        let n = batch.len() as u64;
        if n > 1 {
            let (mtp, drafts) = batch.iter().fold((0, 0), |(m, d), t| match t.work {
                Work::Trunk { want, .. } => (m + u64::from(want != BatchWant::Logits), d),
                Work::Draft { .. } => (m, d + 1),
            });
            hub.shared_mtp.fetch_add(mtp, Ordering::Relaxed);
            hub.shared_drafts.fetch_add(drafts, Ordering::Relaxed);
        }
        hub.batches.fetch_add(1, Ordering::Relaxed);
        hub.forwards.fetch_add(n, Ordering::Relaxed);
        hub.largest.fetch_max(n, Ordering::Relaxed);
        let mut q = lock(&hub.queue);
        let mut results = results.into_iter();
        for t in &batch {
            let r = results.next().unwrap_or_else(|| {
                Err(EngineError::State(
                    "a batched forward returned too few results".into(),
                ))
            });
            q.done.insert(t.id, r);
        }
        q.leading = false;
        hub.wake.notify_all();
        q
    }
}

impl<M: Model> BatchingModel<'_, M> {
    /// Queue a forward of `tokens` after `state` and wait for its result:
    /// run by this thread as the leader of a batch, or by another leader.
    fn queued(
        &self,
        tokens: &[u32],
        state: &mut M::State,
        rows: LogitsRows,
        want: BatchWant,
    ) -> Result<BatchResult<M>> {
        let work = Work::Trunk { state, rows, want };
        match self.queue(tokens, work)? {
            Output::Trunk(out) => Ok(out),
            Output::Draft(_) => Err(mixed()),
        }
    }

    /// Queue `work` on `tokens` and wait for its result.
    fn queue(&self, tokens: &[u32], work: Work<M>) -> Result<Output<M>> {
        let hub = &*self.hub;
        let mut q = lock(&hub.queue);
        let id = q.next;
        q.next += 1;
        q.pending.push_back(Ticket {
            id,
            tokens: tokens.as_ptr(),
            len: tokens.len(),
            work,
        });
        hub.arrive.notify_all();
        loop {
            if let Some(r) = q.done.remove(&id) {
                return r;
            }
            q = if q.leading {
                hub.wake.wait(q).unwrap_or_else(|e| e.into_inner())
            } else {
                self.lead(q)
            };
        }
    }

    /// Run `batch` (tickets of one kind) on this thread.
    fn run_batch(&self, batch: &[Ticket<M>]) -> Vec<Result<Output<M>>> {
        let _exec = lock(&self.hub.exec);
        // SAFETY: see `Ticket`: each owner waits until its result is posted
        // (by the leader, after this returns), and every ticket's state or
        // history is a distinct session's.
        let mut calls = Vec::new();
        let mut drafts = Vec::new();
        for t in batch {
            let tokens = unsafe { std::slice::from_raw_parts(t.tokens, t.len) };
            match t.work {
                Work::Trunk { state, rows, want } => calls.push(BatchCall {
                    tokens,
                    state: unsafe { &mut *state },
                    rows,
                    want,
                }),
                Work::Draft { hidden, history } => drafts.push(MtpCall {
                    tokens,
                    hidden: unsafe { &*hidden },
                    history: unsafe { &mut *history },
                }),
            }
        }
        if !calls.is_empty() && !drafts.is_empty() {
            return batch.iter().map(|_| Err(mixed())).collect();
        }
        if drafts.is_empty() {
            let out = self.inner.forward_batch(&mut calls);
            out.into_iter().map(|r| r.map(Output::Trunk)).collect()
        } else {
            let out = self.inner.mtp_forward_batch(&mut drafts);
            out.into_iter().map(|r| r.map(Output::Draft)).collect()
        }
    }

    /// Hand `batch` to the executor and wait for its results; the batch
    /// back when no executor runs.
    fn hand_off(&self, batch: Vec<Ticket<M>>) -> Handed<M> {
        let hub = &*self.hub;
        let mut h = lock(&hub.handoff);
        if !h.running || h.closed {
            return Err(batch);
        }
        h.job = Some(batch);
        hub.handed.notify_all();
        loop {
            if let Some(done) = h.done.take() {
                return Ok(done);
            }
            h = hub.handed.wait(h).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The executor's loop: run each batch a leader hands off until closed
    /// (a job posted before the close still runs). A panicking forward
    /// posts an error to each of its tickets.
    fn execute(&self) {
        let hub = &*self.hub;
        let mut h = lock(&hub.handoff);
        h.running = true;
        hub.handed.notify_all();
        loop {
            if let Some(batch) = h.job.take() {
                drop(h);
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    self.run_batch(&batch)
                }));
                let results = run.unwrap_or_else(|_| {
                    batch
                        .iter()
                        .map(|_| Err(EngineError::State("a batched forward panicked".into())))
                        .collect()
                });
                hub.executed.fetch_add(1, Ordering::Relaxed);
                h = lock(&hub.handoff);
                h.done = Some((batch, results));
                hub.handed.notify_all();
                continue;
            }
            if h.closed {
                h.running = false;
                return;
            }
            h = hub.handed.wait(h).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<M: Model + Sync> BatchingModel<'_, M>
where
    M::State: Send,
{
    /// Run `f` (the threads that share this model) with one thread of its
    /// own, `batch-executor`, running every batch: the leaders hand their
    /// batches to it. The forwards' bits are the same on any thread; the
    /// host's time is not: a leader is whichever session queued first, so
    /// without it each batch ran on another thread, with cold caches and a
    /// cold allocator arena (run 38: the SmolLM2 shape's 64-session CUDA
    /// step, 10.1 ms on one thread, took 18.1 ms on a thread a step and
    /// 23.7 ms under `bench --streams`). Without a thread to spare (the
    /// spawn failed) the leaders run their batches as before.
    pub fn with_executor<R>(&self, f: impl FnOnce() -> R) -> R {
        /// Closes the executor when `f` returns or unwinds, so the scope
        /// can join it.
        struct Close<'a, M: Model>(&'a Hub<M>);
        impl<M: Model> Drop for Close<'_, M> {
            fn drop(&mut self) {
                lock(&self.0.handoff).closed = true;
                self.0.handed.notify_all();
            }
        }
        std::thread::scope(|s| {
            let _close = Close(&self.hub);
            let _executor = std::thread::Builder::new()
                .name("batch-executor".into())
                .spawn_scoped(s, || self.execute());
            // Wait until it runs, so the first batches are handed to it.
            let mut h = lock(&self.hub.handoff);
            while _executor.is_ok() && !h.running && !h.closed {
                h = self
                    .hub
                    .handed
                    .wait_timeout(h, Duration::from_millis(1))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            drop(h);
            f()
        })
    }
}

impl<M: Model> Model for BatchingModel<'_, M> {
    type State = M::State;
    type MtpHistory = M::MtpHistory;
    type Hidden = M::Hidden;

    fn descriptor(&self) -> &'static FamilyDescriptor {
        self.inner.descriptor()
    }

    fn backend(&self) -> BackendId {
        self.inner.backend()
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn context_length(&self) -> usize {
        self.inner.context_length()
    }

    fn new_state(&self) -> M::State {
        self.inner.new_state()
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut M::State,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self.queued(tokens, state, rows, BatchWant::Logits)?.logits)
    }

    fn forward_batch(&self, calls: &mut [BatchCall<'_, M::State>]) -> Vec<Result<BatchResult<M>>> {
        self.alone(|m| m.forward_batch(calls))
    }

    fn forward_media(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut M::State,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        if media.is_empty() {
            return self.forward(tokens, state, rows);
        }
        self.alone(|m| m.forward_media(tokens, media, state, rows))
    }

    fn forward_hidden_media(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut M::State,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, M::Hidden)> {
        if media.is_empty() {
            return self.forward_hidden(tokens, state, rows);
        }
        self.alone(|m| m.forward_hidden_media(tokens, media, state, rows))
    }

    fn mtp_contract(&self) -> Option<MtpContract> {
        self.inner.mtp_contract()
    }

    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut M::State,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, M::Hidden)> {
        self.queued(tokens, state, rows, BatchWant::Hidden)?
            .into_hidden()
    }

    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut M::State,
    ) -> Result<VerifyWindow<<M::State as ModelState>::Window, M::Hidden>> {
        self.queued(tokens, state, LogitsRows::All, BatchWant::Window)?
            .into_window()
    }

    fn hidden_from_host(&self, rows: usize, width: usize, data: Vec<f32>) -> Result<M::Hidden> {
        self.inner.hidden_from_host(rows, width, data)
    }

    fn new_mtp_history(&self) -> Option<M::MtpHistory> {
        self.inner.new_mtp_history()
    }

    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &M::Hidden,
        history: &mut M::MtpHistory,
    ) -> Result<MtpStep<M::Hidden>> {
        let work = Work::Draft { hidden, history };
        match self.queue(tokens, work)? {
            Output::Draft(step) => Ok(step),
            Output::Trunk(_) => Err(mixed()),
        }
    }

    fn mtp_forward_batch(
        &self,
        calls: &mut [MtpCall<'_, M::Hidden, M::MtpHistory>],
    ) -> Vec<Result<MtpStep<M::Hidden>>> {
        self.alone(|m| m.mtp_forward_batch(calls))
    }
}

/// A ticket answered with the other kind's result (a bug, reported
/// rather than panicking in a session's thread).
fn mixed() -> EngineError {
    EngineError::State("a batch mixed trunk forwards and MTP head calls".into())
}
