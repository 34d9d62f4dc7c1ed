//! Lanes: the threads that run turns, one [`Worker`] each (`serve
//! --max-batch N` runs N of them; 1 is one lane on the bare model).
//!
//! With N above 1 the scheduler wraps the model in one [`BatchingModel`]
//! and every lane's worker runs on it; a lane holds
//! [`BatchingModel::join`] for the whole of a turn, so its forwards meet
//! the other lanes' in batches and a session's bits are those of the same
//! turn served alone (the engine's batching contract). Each lane has its
//! own [`SessionCache`] (the bank budget split evenly; only lane 0 opens
//! the checkpoint store: several stores on one directory would fight over
//! its files).
//!
//! This module holds what a lane is, not who decides what it runs: the
//! scheduler (`crate::scheduler`) owns the lanes' states ([`LaneState`]),
//! picks a lane with [`best_lane`] and hears of each turn's end through the
//! `idle` callback it gives [`LaneReports`]. The lanes' cache counters
//! and contents are summed here ([`CacheSums`]) and published to the
//! metrics at once, before the client hears that its turn ended.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use ds4_engine::Model;
use ds4_engine::batching::{BatchStats, BatchingModel};
use ds4_engine::state::warm::{CacheStats, CheckpointConfig, SessionCache};

use crate::metrics::{CacheContents, Metrics, StoreContents};
use crate::worker::{Job, Reports, Worker};

/// The session caches' settings.
pub struct CacheSettings {
    pub bank_budget: usize,
    pub boundary_every: usize,
    pub checkpoints: Option<CheckpointConfig>,
}

/// One session cache per lane on `model`: the bank budget split evenly,
/// the checkpoint store for lane 0 only. Err: the store cannot be opened.
pub(crate) fn open_caches<X: Model>(
    model: &X,
    lanes: usize,
    settings: &CacheSettings,
) -> Result<Vec<SessionCache<X>>, String> {
    let bank_budget = settings.bank_budget / lanes.max(1);
    (0..lanes.max(1))
        .map(|i| {
            let store = settings.checkpoints.as_ref().filter(|_| i == 0);
            SessionCache::open(model, bank_budget, store)
                .map(|c| c.with_boundary_every(settings.boundary_every))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Something dropped at the end of a turn (the batching model's join).
pub(crate) trait Held {}
impl<T> Held for T {}

/// What a lane does around each turn when the lanes' forwards are batched.
pub(crate) trait Batching: Sync {
    /// Join the batches for one turn (until the guard drops).
    fn join(&self) -> Box<dyn Held + '_>;
    fn stats(&self) -> BatchStats;
}

impl<M: Model> Batching for BatchingModel<'_, M> {
    fn join(&self) -> Box<dyn Held + '_> {
        Box::new(BatchingModel::join(self))
    }

    fn stats(&self) -> BatchStats {
        BatchingModel::stats(self)
    }
}

/// One lane: run the jobs it is given (each turn joined to the batches
/// when `batching`), until its inbox closes; then save the live session.
pub(crate) fn run<X: Model>(
    mut worker: Worker<'_, X>,
    batching: Option<&dyn Batching>,
    inbox: std::sync::mpsc::Receiver<Box<Job>>,
) {
    for job in inbox {
        {
            let _joined = batching.map(|b| b.join());
            worker.turn(*job);
        }
        if let Some(b) = batching {
            worker.metrics.batching(b.stats());
        }
        // A turn that ended before decoding (failed prompt logprobs or
        // image) did not report itself.
        worker.lane_idle();
    }
    worker.cache.shutdown();
    worker.report_cache();
}

/// What the scheduler knows of a lane.
#[derive(Debug, Default)]
pub(crate) struct LaneState {
    /// The job it runs, if any.
    pub running: Option<u64>,
    /// Ended (a panic): never given a job again.
    pub gone: bool,
    /// The live session's tokens after the lane's last turn.
    pub tokens: Vec<u32>,
}

impl LaneState {
    pub fn free(&self) -> bool {
        self.running.is_none() && !self.gone
    }
}

/// The free lane whose live session shares the longest prefix with
/// `prompt` (so a conversation's next turn returns to its lane warm);
/// ties go to the lowest lane.
pub(crate) fn best_lane(lanes: &[LaneState], prompt: &[u32]) -> Option<usize> {
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

/// Every lane's cache counters and contents, published as sums.
pub(crate) struct CacheSums<'a> {
    lanes: Mutex<Vec<LaneCache>>,
    metrics: &'a Metrics,
}

#[derive(Default)]
struct LaneCache {
    stats: CacheStats,
    rejections: BTreeMap<&'static str, u64>,
    contents: CacheContents,
}

impl<'a> CacheSums<'a> {
    pub fn new(lanes: usize, metrics: &'a Metrics) -> Self {
        Self {
            lanes: Mutex::new((0..lanes).map(|_| LaneCache::default()).collect()),
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<LaneCache>> {
        // Every update leaves the sums consistent: a poisoned lock's data
        // is sound.
        self.lanes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record lane `index`'s numbers; publish the sums over every lane.
    pub fn report(
        &self,
        index: usize,
        stats: CacheStats,
        rejections: BTreeMap<&'static str, u64>,
        contents: CacheContents,
    ) {
        let mut lanes = self.lock();
        if let Some(lane) = lanes.get_mut(index) {
            *lane = LaneCache {
                stats,
                rejections,
                contents,
            };
        }
        let (stats, rejections, contents) = sums(&lanes);
        self.metrics.cache(&stats, &rejections);
        self.metrics.contents(contents);
    }
}

/// How lanes report: cache numbers to the sums, a turn's end to `idle`
/// (the scheduler's command channel).
pub(crate) struct LaneReports<'a, F> {
    pub sums: CacheSums<'a>,
    pub idle: F,
}

impl<F: Fn(usize, Vec<u32>) + Sync> Reports for LaneReports<'_, F> {
    fn cache(
        &self,
        lane: usize,
        stats: CacheStats,
        rejections: BTreeMap<&'static str, u64>,
        contents: CacheContents,
    ) {
        self.sums.report(lane, stats, rejections, contents);
    }

    fn idle(&self, lane: usize, tokens: &[u32]) {
        (self.idle)(lane, tokens.to_vec());
    }
}

/// The cache counters and contents summed over the lanes.
fn sums(lanes: &[LaneCache]) -> (CacheStats, BTreeMap<&'static str, u64>, CacheContents) {
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

    fn lane(running: Option<u64>, tokens: &[u32]) -> LaneState {
        LaneState {
            running,
            tokens: tokens.to_vec(),
            ..LaneState::default()
        }
    }

    #[test]
    fn a_job_goes_to_the_free_lane_sharing_the_longest_prefix() {
        let lanes = [
            lane(None, &[1, 2]),
            lane(None, &[1, 2, 3, 4]),
            lane(Some(7), &[1, 2, 3, 4, 5]),
            lane(None, &[9]),
        ];
        assert_eq!(best_lane(&lanes, &[1, 2, 3, 4, 5, 6]), Some(1));
        // Ties (nothing shared, or the same length) go to the lowest lane.
        assert_eq!(best_lane(&lanes, &[7]), Some(0));
        assert_eq!(best_lane(&lanes, &[1, 5]), Some(0));
        assert_eq!(best_lane(&lanes, &[9, 9]), Some(3));
        let mut gone = lane(None, &[7]);
        gone.gone = true;
        assert_eq!(best_lane(&[lane(Some(1), &[]), gone], &[7]), None);
    }

    #[test]
    fn the_metrics_show_the_sums_over_the_lanes() {
        let metrics = Metrics::default();
        let sums = CacheSums::new(2, &metrics);
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
        sums.report(
            0,
            stats(1, 2),
            BTreeMap::from([("corrupt", 1)]),
            contents(3, Some(store)),
        );
        sums.report(1, stats(4, 0), BTreeMap::new(), contents(7, None));
        // A lane's later report replaces its own numbers only.
        sums.report(1, stats(5, 1), BTreeMap::new(), contents(8, None));
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
                .render()
                .contains("ds4_checkpoint_rejections_total{reason=\"corrupt\"} 1")
        );
    }
}
