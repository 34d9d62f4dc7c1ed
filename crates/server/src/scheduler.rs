//! The scheduler: the server's centre. One thread owns the model, the lanes
//! that run turns (`crate::lanes`, each with its session cache), the queue
//! of waiting requests (`crate::queue`) and which request runs where.
//! Everything else speaks to it through [`Command`]s on one channel, with a
//! reply channel where an answer is due (the single-owner pattern of TGI's
//! `backends/v3/src/queue.rs`): no lock guards scheduling state, because
//! only this thread touches it, and the order of commands is the order of
//! events (a lane's end of turn is seen before its client's next request).
//!
//! - `Submit`: admission's last step. The queue takes the job or the reply
//!   says it is full (a 503 with `Retry-After`).
//! - `Cancel`: the client left. A waiting job leaves the queue (its share
//!   of the budget is free at once); a running one has its cancel token set
//!   and stops at its next prefill chunk or token, and its lane takes the
//!   next job as soon as the turn has left the session consistent.
//! - `Status`: a consistent view of the queue and the lanes.
//! - `StopTurns`, `Shutdown`: the grace period is over (running turns
//!   cancelled, waiting jobs dropped); stop once the queue is empty and
//!   every lane has saved its live session.
//! - `LaneIdle`, `LaneGone`: from the lanes.
//!
//! The routes never see any of this: they hold a [`SchedulerHandle`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ds4_engine::Model;
use ds4_engine::batching::{BatchConfig, BatchingModel};
use ds4_engine::decode::CancelToken;
use ds4_engine::families::LoadedModel;
use ds4_text::Tokenizer;
use tokio::sync::{mpsc, oneshot};

use crate::lanes::{self, Batching, CacheSettings, CacheSums, LaneReports, LaneState};
use crate::metrics::Metrics;
use crate::queue::{Full, QueueLimits, WaitQueue};
use crate::worker::{Job, Worker};

/// What the scheduler is asked to do.
pub enum Command {
    /// Queue a job, or say why not.
    Submit {
        job: Box<Job>,
        reply: oneshot::Sender<Result<(), Rejected>>,
    },
    /// The client of job `id` left: drop it from the queue or stop its turn.
    Cancel { id: u64 },
    Status {
        reply: oneshot::Sender<SchedulerStatus>,
    },
    /// Cancel the running turns and drop the waiting jobs (the shutdown
    /// grace period is over).
    StopTurns,
    /// Run what waits (unless stopped), let every lane save its live
    /// session, then stop; later submissions are refused.
    Shutdown { reply: oneshot::Sender<()> },
    /// Lane `lane` finished its turn; its live session covers `tokens`.
    LaneIdle { lane: usize, tokens: Vec<u32> },
    /// Lane `lane` ended (a panic): never give it a job again.
    LaneGone { lane: usize },
}

/// Why a job was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// The queue's configured capacity is used up.
    QueueFull(Full),
    /// The scheduler is stopping or gone.
    Stopped,
}

/// The queue and the lanes, as the scheduler sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerStatus {
    /// Jobs waiting for a lane.
    pub waiting: usize,
    /// Session-cache rows (tokens) the waiting jobs reserve.
    pub reserved_tokens: usize,
    /// Jobs running.
    pub running: usize,
    /// Lanes (`--max-batch`).
    pub lanes: usize,
    pub max_queue_tokens: usize,
    pub max_queue: Option<usize>,
}

/// The scheduler's settings.
pub struct Settings {
    /// Turns at once (`--max-batch`).
    pub lanes: usize,
    /// Rows one batched forward takes at most (`--max-batch-tokens`).
    pub batch_tokens: usize,
    pub prefill_chunk: usize,
    pub cache: CacheSettings,
    pub queue: QueueLimits,
}

/// How the rest of the server speaks to the scheduler.
#[derive(Clone)]
pub struct SchedulerHandle {
    commands: mpsc::UnboundedSender<Command>,
    /// Also read by the running turns at every prefill chunk and token.
    stopping: Arc<AtomicBool>,
    next_id: Arc<AtomicU64>,
}

impl SchedulerHandle {
    /// A fresh job id (unique for the server's life).
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queue `job` (its `id` from [`Self::next_id`]).
    pub async fn submit(&self, job: Job) -> Result<(), Rejected> {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(job);
        self.commands
            .send(Command::Submit { job, reply })
            .map_err(|_| Rejected::Stopped)?;
        answer.await.unwrap_or(Err(Rejected::Stopped))
    }

    /// Job `id`'s client left (nothing happens if it already ended).
    pub fn cancel(&self, id: u64) {
        let _ = self.commands.send(Command::Cancel { id });
    }

    /// The queue and the lanes now; `None` once the scheduler is gone.
    pub async fn status(&self) -> Option<SchedulerStatus> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Status { reply }).ok()?;
        answer.await.ok()
    }

    /// Cancel the running turns at their next prefill chunk or token (the
    /// session then covers exactly what was processed) and drop the waiting
    /// ones: the shutdown grace period is over.
    pub fn stop_turns(&self) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.commands.send(Command::StopTurns);
    }

    /// Let the waiting jobs run (unless [`Self::stop_turns`] was called),
    /// then have every lane save its live session (when checkpoints are on)
    /// and stop. Later submissions are refused.
    pub async fn shutdown(&self) {
        let (reply, done) = oneshot::channel();
        if self.commands.send(Command::Shutdown { reply }).is_ok() {
            let _ = done.await;
        }
    }

    /// A handle whose scheduler is gone: every submission is refused. For
    /// tests of what happens before a job is queued.
    #[cfg(test)]
    pub fn detached() -> Self {
        let (commands, _) = mpsc::unbounded_channel();
        Self {
            commands,
            stopping: Arc::default(),
            next_id: Arc::default(),
        }
    }
}

/// Start the scheduler thread; it opens the session caches first (a
/// checkpoint store that cannot be opened fails the start). It runs until
/// [`SchedulerHandle::shutdown`] or until every handle is dropped.
pub fn spawn(
    model: Arc<LoadedModel>,
    tokenizer: Arc<Tokenizer>,
    settings: Settings,
    metrics: Arc<Metrics>,
    vision: Option<Arc<crate::vision::Vision>>,
) -> Result<SchedulerHandle, String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stopping = Arc::new(AtomicBool::new(false));
    // The lanes hold a weak sender: the channel closes when the last
    // handle goes, which ends the scheduler as a shutdown would.
    let lane_tx = tx.downgrade();
    let env = Env {
        tokenizer,
        metrics,
        vision,
        stopping: stopping.clone(),
    };
    std::thread::Builder::new()
        .name("engine-scheduler".into())
        .spawn(move || {
            ds4_engine::with_model!(&*model, m => {
                if settings.lanes > 1 {
                    let bm = BatchingModel::new(
                        m,
                        BatchConfig {
                            max_tokens: settings.batch_tokens.max(1),
                            ..BatchConfig::default()
                        },
                    );
                    // The lanes' batches on a thread of their own.
                    bm.with_executor(|| {
                        serve(&bm, Some(&bm), &settings, &env, rx, lane_tx, ready_tx)
                    })
                } else {
                    serve(m, None, &settings, &env, rx, lane_tx, ready_tx)
                }
            })
        })
        .map_err(|e| format!("starting the engine scheduler: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the engine scheduler stopped while starting".to_string())??;
    Ok(SchedulerHandle {
        commands: tx,
        stopping,
        next_id: Arc::new(AtomicU64::new(1)),
    })
}

/// What the scheduler thread and its lanes share.
struct Env {
    tokenizer: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    vision: Option<Arc<crate::vision::Vision>>,
    stopping: Arc<AtomicBool>,
}

/// Open the lanes on `model`, start their threads and run the scheduler
/// loop until it stops; then wait for every lane to save and end.
fn serve<X: Model>(
    model: &X,
    batching: Option<&dyn Batching>,
    settings: &Settings,
    env: &Env,
    commands: mpsc::UnboundedReceiver<Command>,
    lane_tx: mpsc::WeakUnboundedSender<Command>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let n = settings.lanes.max(1);
    let caches = match lanes::open_caches(model, n, &settings.cache) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let idle_tx = lane_tx.clone();
    let reports = LaneReports {
        sums: CacheSums::new(n, &env.metrics),
        idle: move |lane, tokens| {
            if let Some(tx) = idle_tx.upgrade() {
                let _ = tx.send(Command::LaneIdle { lane, tokens });
            }
        },
    };
    let done = std::thread::scope(|s| {
        let mut inboxes = Vec::with_capacity(n);
        for (index, cache) in caches.into_iter().enumerate() {
            let mut worker = Worker {
                model,
                cache,
                tokenizer: &env.tokenizer,
                prefill_chunk: settings.prefill_chunk,
                metrics: &env.metrics,
                stopping: &env.stopping,
                saves_seen: 0,
                vision: env.vision.as_deref(),
                lane: index,
                reports: &reports,
                idle: true,
            };
            // Before the server answers: checkpoint files refused while
            // opening the store are in /metrics at once.
            worker.report_cache();
            let (tx, rx) = std::sync::mpsc::channel();
            inboxes.push(tx);
            let gone_tx = lane_tx.clone();
            std::thread::Builder::new()
                .name(format!("engine-lane-{index}"))
                .spawn_scoped(s, move || {
                    // Marks the lane gone however it ends (a panicking turn
                    // included), so no job is given to it again.
                    struct Gone(mpsc::WeakUnboundedSender<Command>, usize);
                    impl Drop for Gone {
                        fn drop(&mut self) {
                            if let Some(tx) = self.0.upgrade() {
                                let _ = tx.send(Command::LaneGone { lane: self.1 });
                            }
                        }
                    }
                    let _gone = Gone(gone_tx, index);
                    lanes::run(worker, batching, rx);
                })
                .expect("starting an engine lane");
        }
        let _ = ready.send(Ok(()));
        let mut scheduler = Scheduler {
            queue: WaitQueue::new(settings.queue),
            lanes: (0..n).map(|_| LaneState::default()).collect(),
            running: BTreeMap::new(),
            inboxes,
            metrics: &env.metrics,
            stopping: &env.stopping,
            closing: None,
        };
        scheduler.run(commands)
        // The inboxes drop here: each lane ends after its turn, saving its
        // live session, and the scope waits for every one.
    });
    if let Some(done) = done {
        let _ = done.send(());
    }
}

/// The scheduler's state: only its thread touches it.
struct Scheduler<'a> {
    queue: WaitQueue<Box<Job>>,
    lanes: Vec<LaneState>,
    /// Running jobs: their lane and cancel token.
    running: BTreeMap<u64, (usize, CancelToken)>,
    inboxes: Vec<std::sync::mpsc::Sender<Box<Job>>>,
    metrics: &'a Metrics,
    stopping: &'a AtomicBool,
    /// Set by `Shutdown`: refuse new jobs, stop when the queue is empty.
    closing: Option<oneshot::Sender<()>>,
}

impl Scheduler<'_> {
    /// Handle commands until shutdown (returns its reply) or until every
    /// handle is gone.
    fn run(
        &mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) -> Option<oneshot::Sender<()>> {
        while let Some(command) = commands.blocking_recv() {
            self.handle(command);
            self.dispatch();
            self.publish();
            if self.closing.is_some() && self.queue.is_empty() {
                return self.closing.take();
            }
            if self.lanes.iter().all(|l| l.gone) {
                // Every lane panicked: nothing can run; refuse what waits.
                self.queue.retain(|_| false);
                return self.closing.take();
            }
        }
        None
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit { job, reply } => {
                let _ = reply.send(self.submit(job));
            }
            Command::Cancel { id } => {
                if self.queue.remove(id).is_some() {
                    self.metrics.cancelled();
                } else if let Some((_, cancel)) = self.running.get(&id) {
                    cancel.cancel();
                }
            }
            Command::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Command::StopTurns => {
                for (_, cancel) in self.running.values() {
                    cancel.cancel();
                }
                let dropped = self.queue.retain(|_| false);
                for _ in 0..dropped {
                    self.metrics.cancelled();
                }
            }
            Command::Shutdown { reply } => self.closing = Some(reply),
            Command::LaneIdle { lane, tokens } => {
                if let Some(l) = self.lanes.get_mut(lane) {
                    if let Some(id) = l.running.take() {
                        self.running.remove(&id);
                    }
                    l.tokens = tokens;
                }
            }
            Command::LaneGone { lane } => {
                if let Some(l) = self.lanes.get_mut(lane) {
                    if let Some(id) = l.running.take() {
                        self.running.remove(&id);
                    }
                    l.gone = true;
                }
            }
        }
    }

    fn submit(&mut self, job: Box<Job>) -> Result<(), Rejected> {
        if self.closing.is_some() || self.stopping.load(Ordering::Relaxed) {
            return Err(Rejected::Stopped);
        }
        // Clients that left free their share before the new one is weighed.
        self.drop_departed();
        let cost = job.prompt.len().saturating_add(job.max_tokens);
        let (id, always) = (job.id, job.continuation);
        self.queue
            .push(id, cost, job, always)
            .map_err(|(full, _)| Rejected::QueueFull(full))
    }

    /// Drop the waiting jobs whose client is gone.
    fn drop_departed(&mut self) {
        let left = self.queue.retain(|job| !job.events.is_closed());
        for _ in 0..left {
            self.metrics.cancelled();
        }
    }

    /// Give the oldest waiting jobs to free lanes (first in, first out;
    /// each to the free lane that shares the longest prefix with it).
    fn dispatch(&mut self) {
        self.drop_departed();
        while self.lanes.iter().any(LaneState::free) {
            let Some((id, job)) = self.queue.pop() else {
                return;
            };
            let Some(lane) = lanes::best_lane(&self.lanes, &job.prompt) else {
                return;
            };
            let cancel = job.cancel.clone();
            if self.inboxes[lane].send(job).is_err() {
                // The lane ended (a panic); the job's channel closed with it.
                self.lanes[lane].gone = true;
                continue;
            }
            self.lanes[lane].running = Some(id);
            self.running.insert(id, (lane, cancel));
        }
    }

    fn status(&self) -> SchedulerStatus {
        let limits = self.queue.limits();
        SchedulerStatus {
            waiting: self.queue.len(),
            reserved_tokens: self.queue.reserved(),
            running: self.running.len(),
            lanes: self.lanes.len(),
            max_queue_tokens: limits.max_tokens,
            max_queue: limits.max_count,
        }
    }

    /// The gauges `/metrics` shows.
    fn publish(&self) {
        let s = self.status();
        self.metrics.running(s.running);
        self.metrics.queue(s.waiting, s.reserved_tokens);
    }
}

#[cfg(test)]
mod tests;
