//! Lanes: several turns at once (`serve --max-batch N`, N above 1).
//!
//! The worker thread wraps the model in one [`BatchingModel`] and runs N
//! lane threads in a scope, each a [`Worker`] with its own
//! [`SessionCache`] (the bank budget split evenly; only lane 0 opens the
//! checkpoint store: several stores on one directory would fight over its
//! files). A lane holds [`BatchingModel::join`] for the whole of a turn, so
//! its forwards meet the other lanes' in batches; a session's bits are
//! those of the same turn served alone (the engine's batching contract).
//!
//! The worker thread is the dispatcher: it waits until some lane is idle,
//! only then takes the next message off the bounded queue (so the server
//! holds the running turns plus `--max-queue` waiting ones, and admission's
//! 503 stays a full queue), and hands the job to the idle lane whose live
//! session shares the longest prefix with the prompt (ties: the lowest
//! lane), so a conversation's next turn goes back to its lane and starts
//! warm. Lanes publish their live tokens and busy flag on the [`Board`]
//! at the end of every turn — before the client hears of it, so its next
//! turn finds the lane free — and their cache reports, which the board sums into
//! the metrics. On shutdown (or when every handle is gone) the dispatcher
//! stops taking jobs; each lane finishes its turn, saves its live session
//! and ends, and the scope waits for all of them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use ds4_engine::Model;
use ds4_engine::batching::{BatchConfig, BatchingModel};
use ds4_engine::state::warm::{CacheStats, SessionCache};
use ds4_text::Tokenizer;
use tokio::sync::mpsc;

use crate::metrics::{CacheContents, Metrics, StoreContents};
use crate::worker::{CacheSettings, Job, Msg, Worker};

/// What every lane's worker borrows from the worker thread.
pub(crate) struct Shared<'a> {
    pub tokenizer: &'a Tokenizer,
    pub prefill_chunk: usize,
    /// Rows one batched forward takes at most (`--max-batch-tokens`).
    pub batch_tokens: usize,
    pub metrics: &'a Metrics,
    pub stopping: &'a AtomicBool,
    pub vision: Option<&'a crate::vision::Vision>,
}

/// Run `lanes` lanes on `model` until shutdown (see the module docs).
/// `ready` gets the start's outcome: a checkpoint store that cannot be
/// opened fails it.
pub(crate) fn run<M: Model>(
    model: &M,
    lanes: usize,
    settings: &CacheSettings,
    shared: Shared<'_>,
    mut queue: mpsc::Receiver<Msg>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let bm = BatchingModel::new(
        model,
        BatchConfig {
            max_tokens: shared.batch_tokens.max(1),
            ..BatchConfig::default()
        },
    );
    let bank_budget = settings.bank_budget / lanes;
    let mut caches = Vec::with_capacity(lanes);
    for i in 0..lanes {
        let store = if i == 0 {
            settings.checkpoints.as_ref()
        } else {
            None
        };
        match SessionCache::open(&bm, bank_budget, store) {
            Ok(c) => caches.push(c.with_boundary_every(settings.boundary_every)),
            Err(e) => {
                let _ = ready.send(Err(e.to_string()));
                return;
            }
        }
    }
    let board = Board::new(lanes, shared.metrics);
    let done = std::thread::scope(|s| {
        let mut inboxes = Vec::with_capacity(lanes);
        for (index, cache) in caches.into_iter().enumerate() {
            let mut worker = Worker {
                model: &bm,
                cache,
                tokenizer: shared.tokenizer,
                prefill_chunk: shared.prefill_chunk,
                metrics: shared.metrics,
                stopping: shared.stopping,
                saves_seen: 0,
                vision: shared.vision,
                lane: Some(Slot {
                    board: &board,
                    index,
                    idle: true,
                }),
            };
            // Before the server answers: checkpoint files refused while
            // opening the store are in /metrics at once.
            worker.report_cache();
            let (tx, rx) = std::sync::mpsc::channel();
            inboxes.push(tx);
            let bm = &bm;
            let board = &board;
            std::thread::Builder::new()
                .name(format!("engine-lane-{index}"))
                .spawn_scoped(s, move || lane(worker, bm, board, index, rx))
                .expect("starting an engine lane");
        }
        let _ = ready.send(Ok(()));
        dispatch(
            &mut queue,
            &board,
            &inboxes,
            shared.metrics,
            shared.stopping,
        )
        // The inboxes drop here: each lane ends after its turn, and the
        // scope waits for every one.
    });
    if let Some(done) = done {
        let _ = done.send(());
    }
}

/// Take jobs off the queue while a lane is idle and hand each to the best
/// idle lane. Returns on shutdown (with its reply) or when every handle or
/// every lane is gone.
fn dispatch(
    queue: &mut mpsc::Receiver<Msg>,
    board: &Board<'_>,
    inboxes: &[std::sync::mpsc::Sender<Box<Job>>],
    metrics: &Metrics,
    stopping: &AtomicBool,
) -> Option<tokio::sync::oneshot::Sender<()>> {
    loop {
        // A job leaves the queue only when a lane can start it.
        if !board.wait_idle() {
            return None;
        }
        match queue.blocking_recv()? {
            Msg::Job(job) if job.events.is_closed() || stopping.load(Ordering::Relaxed) => {
                // The client left while the job waited, or the server is
                // stopping.
                metrics.cancelled();
            }
            Msg::Job(job) => {
                let index = board.claim(&job.prompt)?;
                if inboxes[index].send(job).is_err() {
                    // The lane ended (a panic); the job's events channel
                    // closed with it.
                    board.gone(index);
                }
            }
            Msg::Shutdown(done) => return Some(done),
        }
    }
}

/// One lane: run the jobs it is given, each turn joined to the batches;
/// when the dispatcher is done, save the live session and end.
fn lane<M: Model>(
    mut worker: Worker<'_, BatchingModel<'_, M>>,
    bm: &BatchingModel<'_, M>,
    board: &Board<'_>,
    index: usize,
    inbox: std::sync::mpsc::Receiver<Box<Job>>,
) {
    // Marks the lane gone however it ends (a panicking turn included), so
    // the dispatcher never waits for it.
    struct Gone<'b, 'm>(&'b Board<'m>, usize);
    impl Drop for Gone<'_, '_> {
        fn drop(&mut self) {
            self.0.gone(self.1);
        }
    }
    let _gone = Gone(board, index);
    for job in inbox {
        if let Some(slot) = &mut worker.lane {
            slot.idle = false;
        }
        {
            let _joined = bm.join();
            worker.turn(*job);
        }
        worker.metrics.batching(bm.stats());
        // A turn that ended before decoding (a failed prompt logprobs or
        // image) did not publish itself.
        worker.lane_idle();
    }
    worker.cache.shutdown();
    worker.report_cache();
}

/// What the dispatcher and the lanes share: each lane's state, and the
/// metrics they sum into.
pub(crate) struct Board<'a> {
    lanes: Mutex<Vec<Lane>>,
    changed: Condvar,
    metrics: &'a Metrics,
}

#[derive(Default)]
struct Lane {
    busy: bool,
    /// Ended (shutdown or a panic): never given a job again.
    gone: bool,
    /// The live session's tokens after the lane's last turn.
    tokens: Vec<u32>,
    stats: CacheStats,
    rejections: BTreeMap<&'static str, u64>,
    contents: CacheContents,
}

impl Lane {
    fn free(&self) -> bool {
        !self.busy && !self.gone
    }
}

/// A lane's place on the board (what its worker reports through).
pub(crate) struct Slot<'a> {
    board: &'a Board<'a>,
    index: usize,
    /// The lane's end of turn is published (the dispatcher may have
    /// claimed it again since).
    idle: bool,
}

impl Slot<'_> {
    /// The turn is over and the live session covers `tokens`: the lane is
    /// free (once per turn).
    pub(crate) fn idle(&mut self, tokens: &[u32]) {
        if !self.idle {
            self.idle = true;
            self.board.idle(self.index, tokens);
        }
    }

    /// Record this lane's cache counters and contents; publish the sums
    /// over every lane.
    pub(crate) fn report(
        &self,
        stats: CacheStats,
        rejections: BTreeMap<&'static str, u64>,
        contents: CacheContents,
    ) {
        let mut lanes = self.board.lock();
        let lane = &mut lanes[self.index];
        lane.stats = stats;
        lane.rejections = rejections;
        lane.contents = contents;
        let (stats, rejections, contents) = sums(&lanes);
        self.board.metrics.cache(&stats, &rejections);
        self.board.metrics.contents(contents);
    }
}

impl<'a> Board<'a> {
    fn new(lanes: usize, metrics: &'a Metrics) -> Self {
        Self {
            lanes: Mutex::new((0..lanes).map(|_| Lane::default()).collect()),
            changed: Condvar::new(),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Lane>> {
        // Every update below leaves the lanes consistent: a poisoned
        // lock's data is sound.
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until some lane is idle; false once every lane is gone.
    fn wait_idle(&self) -> bool {
        self.wait_free().is_some()
    }

    /// The lanes once some lane is idle; `None` once every lane is gone.
    fn wait_free(&self) -> Option<MutexGuard<'_, Vec<Lane>>> {
        let mut lanes = self.lock();
        loop {
            if lanes.iter().any(Lane::free) {
                return Some(lanes);
            }
            if lanes.iter().all(|l| l.gone) {
                return None;
            }
            lanes = self.changed.wait(lanes).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Mark the best idle lane for `prompt` busy and return it (waiting
    /// for one if none is idle); `None` once every lane is gone.
    fn claim(&self, prompt: &[u32]) -> Option<usize> {
        let mut lanes = self.wait_free()?;
        let index = best_lane(&lanes, prompt)?;
        lanes[index].busy = true;
        self.publish_running(&lanes);
        Some(index)
    }

    /// The lane finished its turn; its live session now covers `tokens`.
    fn idle(&self, index: usize, tokens: &[u32]) {
        let mut lanes = self.lock();
        let lane = &mut lanes[index];
        lane.busy = false;
        lane.tokens.clear();
        lane.tokens.extend_from_slice(tokens);
        self.publish_running(&lanes);
        self.changed.notify_all();
    }

    fn gone(&self, index: usize) {
        let mut lanes = self.lock();
        lanes[index].gone = true;
        lanes[index].busy = false;
        self.publish_running(&lanes);
        self.changed.notify_all();
    }

    fn publish_running(&self, lanes: &[Lane]) {
        self.metrics
            .running(lanes.iter().filter(|l| l.busy).count());
    }
}

/// The idle lane whose live session shares the longest prefix with
/// `prompt`; ties go to the lowest lane.
fn best_lane(lanes: &[Lane], prompt: &[u32]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, lane) in lanes.iter().enumerate() {
        if !lane.free() {
            continue;
        }
        let shared = common_prefix(&lane.tokens, prompt);
        if best.is_none_or(|(_, b)| shared > b) {
            best = Some((i, shared));
        }
    }
    best.map(|(i, _)| i)
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The cache counters and contents summed over the lanes.
fn sums(lanes: &[Lane]) -> (CacheStats, BTreeMap<&'static str, u64>, CacheContents) {
    let mut stats = CacheStats::default();
    let mut rejections = BTreeMap::new();
    let mut contents = CacheContents::default();
    for lane in lanes {
        let s = &lane.stats;
        stats.live_hits += s.live_hits;
        stats.bank_hits += s.bank_hits;
        stats.disk_hits += s.disk_hits;
        stats.misses += s.misses;
        stats.cached_tokens += s.cached_tokens;
        stats.saves += s.saves;
        stats.save_failures += s.save_failures;
        stats.prompt_boundaries += s.prompt_boundaries;
        for (reason, n) in &lane.rejections {
            *rejections.entry(*reason).or_default() += n;
        }
        let c = &lane.contents;
        contents.live_tokens += c.live_tokens;
        contents.live_bytes += c.live_bytes;
        contents.bank_entries += c.bank_entries;
        contents.bank_bytes += c.bank_bytes;
        if let Some(store) = c.store {
            let total = contents.store.get_or_insert(StoreContents {
                budget: store.budget,
                ..StoreContents::default()
            });
            total.files += store.files;
            total.bytes += store.bytes;
        }
    }
    (stats, rejections, contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(busy: bool, tokens: &[u32]) -> Lane {
        Lane {
            busy,
            tokens: tokens.to_vec(),
            ..Lane::default()
        }
    }

    #[test]
    fn a_job_goes_to_the_idle_lane_sharing_the_longest_prefix() {
        let lanes = [
            lane(false, &[1, 2]),
            lane(false, &[1, 2, 3, 4]),
            lane(true, &[1, 2, 3, 4, 5]),
            lane(false, &[9]),
        ];
        assert_eq!(best_lane(&lanes, &[1, 2, 3, 4, 5, 6]), Some(1));
        // Ties (nothing shared, or the same length) go to the lowest lane.
        assert_eq!(best_lane(&lanes, &[7]), Some(0));
        assert_eq!(best_lane(&lanes, &[1, 5]), Some(0));
        assert_eq!(best_lane(&lanes, &[9, 9]), Some(3));
        let mut gone = lane(false, &[7]);
        gone.gone = true;
        assert_eq!(best_lane(&[lane(true, &[]), gone], &[7]), None);
    }

    #[test]
    fn the_metrics_show_the_sums_over_the_lanes() {
        let metrics = Metrics::default();
        let board = Board::new(2, &metrics);
        let slot = |index| Slot {
            board: &board,
            index,
            idle: true,
        };
        let stats = |hits, misses| CacheStats {
            live_hits: hits,
            misses,
            ..CacheStats::default()
        };
        let contents = |tokens, store| CacheContents {
            live_tokens: tokens,
            live_bytes: tokens * 10,
            bank_entries: 1,
            bank_bytes: 5,
            store,
        };
        let store = StoreContents {
            files: 2,
            bytes: 100,
            budget: 1000,
        };
        slot(0).report(
            stats(1, 2),
            BTreeMap::from([("corrupt", 1)]),
            contents(3, Some(store)),
        );
        slot(1).report(stats(4, 0), BTreeMap::new(), contents(7, None));
        // A lane's later report replaces its own numbers only.
        slot(1).report(stats(5, 1), BTreeMap::new(), contents(8, None));
        let snap = metrics.snapshot();
        assert_eq!(snap.cache.live_hits, 6);
        assert_eq!(snap.cache.misses, 3);
        assert_eq!(snap.contents.live_tokens, 11);
        assert_eq!(snap.contents.live_bytes, 110);
        assert_eq!(snap.contents.bank_entries, 2);
        assert_eq!(snap.contents.bank_bytes, 10);
        assert_eq!(snap.contents.store, Some(store));
        assert!(
            metrics
                .render(0)
                .contains("ds4_checkpoint_rejections_total{reason=\"corrupt\"} 1")
        );
    }

    #[test]
    fn claims_and_idles_count_the_running_turns() {
        let metrics = Metrics::default();
        let board = Board::new(2, &metrics);
        assert_eq!(board.claim(&[1, 2]), Some(0));
        assert_eq!(board.claim(&[3]), Some(1));
        assert!(metrics.render(0).contains("ds4_running_turns 2"));
        board.idle(1, &[3, 4]);
        board.idle(0, &[1, 2, 5]);
        assert!(metrics.render(0).contains("ds4_running_turns 0"));
        // The conversation on lane 1 goes back to it.
        assert_eq!(board.claim(&[3, 4, 6]), Some(1));
        board.gone(0);
        board.gone(1);
        assert!(!board.wait_idle());
    }
}
