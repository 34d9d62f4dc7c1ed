//! The engine worker: one OS thread that owns the model and the session
//! cache (live session, bank, optional checkpoint store: the engine's
//! [`SessionCache`], the same policy `run` and `chat` use) and runs one turn
//! at a time. Requests reach it through a bounded queue (full → 503); each
//! job streams its events back on its own channel. A job whose receiver is
//! gone (client disconnected) is cancelled through its [`CancelToken`] at
//! the next prefill chunk or token, or skipped if it never started; the
//! session stays consistent because the decode loops always leave it
//! covering exactly the tokens they processed. Text goes through
//! [`TextStream`] (detokenizer, stop strings, stop tokens), the stream the
//! CLI uses too. On shutdown the worker saves
//! the live session (clean-shutdown checkpoint trigger).
//!
//! With `--max-batch N` above 1 the worker thread runs N lanes instead
//! ([`crate::lanes`]): each a [`Worker`] with its own session cache, their
//! forwards batched; the worker thread dispatches the queue to them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ds4_engine::Model;
use ds4_engine::decode::{
    self, CallerStop, CancelToken, Flow, Observe, PrefillProgress, TokenEvent, TokenLogprobs,
    TokenMask, TurnConfig, TurnObserver, TurnRequest,
};
use ds4_engine::families::LoadedModel;
use ds4_engine::state::warm::{CheckpointConfig, SessionCache};
use ds4_sampling::Sampler;
use ds4_text::deepseek_v4::StructuralSampling;
use ds4_text::{TextStream, Tokenizer};
use tokio::sync::mpsc;

use crate::metrics::{CacheContents, Metrics, StoreContents};
use crate::summary::TurnSummary;

/// One admitted generation request.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    pub max_tokens: usize,
    pub stops: Vec<String>,
    /// Per-token logprobs with this many alternatives.
    pub logprobs: Option<usize>,
    /// Also compute the prompt tokens' logprobs (`echo` + `logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// `None`: the family's default (AR without an MTP head).
    pub mtp_depth: Option<usize>,
    /// Sample DSML tool-call structure at temperature 0 (payload keeps the
    /// job's sampler): [`StructuralSampling`] decides per position.
    pub structural: bool,
    /// The request's structured-output constraint: the observer's
    /// [`TurnObserver::allowed_after`] answers from it.
    pub constraint: Option<Box<ds4_constraint::Constraint>>,
    /// The prompt's images (`prompt` then holds session keys:
    /// [`crate::vision`]).
    pub vision: Option<Arc<crate::vision::VisionPrompt>>,
    pub events: mpsc::UnboundedSender<WorkEvent>,
}

/// A generated token with what the client may want to know about it.
#[derive(Debug, Clone)]
pub struct TokenOut {
    pub id: u32,
    pub logprobs: Option<TokenLogprobs>,
}

#[derive(Debug)]
pub enum WorkEvent {
    /// The turn began; `cached_tokens` prompt tokens were reused.
    Started {
        cached_tokens: usize,
    },
    PromptLogprobs(Vec<Option<TokenLogprobs>>),
    /// Text that is final (stop strings already removed) and the token that
    /// released it (text may be empty while a token is held back).
    Delta {
        text: String,
        token: TokenOut,
    },
    /// Text released at the end of the turn (held-back tail).
    Tail(String),
    Finished(TurnSummary),
    /// The turn failed inside the engine.
    Failed(String),
}

/// What the queue carries: a job, or the request to save and stop.
pub(crate) enum Msg {
    Job(Box<Job>),
    Shutdown(tokio::sync::oneshot::Sender<()>),
}

/// The request side of the queue.
#[derive(Clone)]
pub struct WorkerHandle {
    queue: mpsc::Sender<Msg>,
    /// Set when the shutdown grace period is over: the running turn stops
    /// at its next prefill chunk or token, queued ones are skipped.
    stopping: Arc<AtomicBool>,
}

#[cfg(test)]
impl WorkerHandle {
    /// A handle whose worker is gone: every submission is refused. For tests
    /// of what happens before a job is queued (rendering, admission rules).
    pub fn detached() -> Self {
        let (queue, _) = mpsc::channel(1);
        Self {
            queue,
            stopping: Arc::default(),
        }
    }
}

/// Why a job was not queued.
pub enum Rejected {
    QueueFull,
    WorkerGone,
}

impl WorkerHandle {
    pub fn submit(&self, job: Job) -> Result<(), Rejected> {
        self.queue
            .try_send(Msg::Job(Box::new(job)))
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => Rejected::QueueFull,
                mpsc::error::TrySendError::Closed(_) => Rejected::WorkerGone,
            })
    }

    /// Jobs waiting (not counting the running ones).
    pub fn depth(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }

    /// Cancel the running turns at their next prefill chunk or token (the
    /// session then covers exactly what was processed) and skip the queued
    /// ones: the shutdown grace period is over.
    pub fn stop_turns(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Let the queued jobs run (unless [`Self::stop_turns`] was called),
    /// then save the live session (when checkpoints are on) and stop the
    /// worker. Later submissions are refused.
    pub async fn shutdown(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.queue.send(Msg::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// The session cache's settings.
pub struct CacheSettings {
    pub bank_budget: usize,
    pub boundary_every: usize,
    pub checkpoints: Option<CheckpointConfig>,
}

/// Start the worker thread (it opens the session cache first: a checkpoint
/// store that cannot be opened fails the start). It runs until
/// [`WorkerHandle::shutdown`] or until every handle is dropped. With
/// `lanes` above 1 it runs that many turns at once ([`crate::lanes`]);
/// the queue holds `max_queue` jobs besides the running ones.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    model: Arc<LoadedModel>,
    tokenizer: Arc<Tokenizer>,
    max_queue: usize,
    lanes: usize,
    batch_tokens: usize,
    prefill_chunk: usize,
    cache: CacheSettings,
    metrics: Arc<Metrics>,
    vision: Option<Arc<crate::vision::Vision>>,
) -> Result<WorkerHandle, String> {
    let (tx, rx) = mpsc::channel(max_queue.max(1));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let boundary_every = cache.boundary_every;
    let stopping = Arc::new(AtomicBool::new(false));
    let stop_flag = stopping.clone();
    std::thread::Builder::new()
        .name("engine-worker".into())
        .spawn(move || {
            ds4_engine::with_model!(&*model, m => {
                if lanes > 1 {
                    let shared = crate::lanes::Shared {
                        tokenizer: &tokenizer,
                        prefill_chunk,
                        batch_tokens,
                        metrics: &metrics,
                        stopping: &stop_flag,
                        vision: vision.as_deref(),
                    };
                    return crate::lanes::run(m, lanes, &cache, shared, rx, ready_tx);
                }
                match SessionCache::open(m, cache.bank_budget, cache.checkpoints.as_ref()) {
                    Ok(cache) => {
                        let cache = cache.with_boundary_every(boundary_every);
                        let mut worker = Worker {
                            model: m,
                            cache,
                            tokenizer: &tokenizer,
                            prefill_chunk,
                            metrics: &metrics,
                            stopping: &stop_flag,
                            saves_seen: 0,
                            vision: vision.as_deref(),
                            lane: None,
                        };
                        // Before the server answers: checkpoint files refused
                        // while opening the store are in /metrics at once.
                        worker.report_cache();
                        let _ = ready_tx.send(Ok(()));
                        worker.run(rx)
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                    }
                }
            })
        })
        .map_err(|e| format!("starting the engine worker: {e}"))?;
    ready_rx
        .recv()
        .map_err(|_| "the engine worker stopped while starting".to_string())??;
    Ok(WorkerHandle {
        queue: tx,
        stopping,
    })
}

pub(crate) struct Worker<'a, M: Model> {
    pub(crate) model: &'a M,
    pub(crate) cache: SessionCache<M>,
    pub(crate) tokenizer: &'a Tokenizer,
    pub(crate) prefill_chunk: usize,
    pub(crate) metrics: &'a Metrics,
    pub(crate) stopping: &'a AtomicBool,
    /// Checkpoint saves already checked against the budget.
    pub(crate) saves_seen: u64,
    /// The vision tower, for a model that reads images.
    pub(crate) vision: Option<&'a crate::vision::Vision>,
    /// The lane this worker is, when several run (`--max-batch`): its
    /// cache reports go through the lanes' board, which sums them.
    pub(crate) lane: Option<crate::lanes::Slot<'a>>,
}

impl<M: Model> Worker<'_, M> {
    /// Publish the session cache's counters and contents to the metrics
    /// (a lane's are summed with the other lanes'); warn once when a
    /// checkpoint did not survive its own save.
    pub(crate) fn report_cache(&mut self) {
        let stats = self.cache.stats();
        let rejections = self.cache.rejections();
        if self.lane.is_none() {
            self.metrics.cache(&stats, &rejections);
        }
        if let Some(store) = self.cache.store()
            && stats.saves > self.saves_seen
        {
            self.saves_seen = stats.saves;
            // The store evicts the file it just wrote only when that file
            // alone is over the budget: then nothing is ever kept.
            if store.entries().is_empty() {
                self.metrics.checkpoint_budget_too_small();
                let message = format!(
                    "the checkpoint budget ({} bytes) is smaller than one checkpoint file: every \
                     checkpoint is deleted as soon as it is written; raise --checkpoint-budget-mib",
                    store.budget()
                );
                tracing::warn!("{message}");
                eprintln!("ds4server: warning: {message}");
            }
        }
        let live = self.cache.live();
        let contents = CacheContents {
            live_tokens: live.tokens().len(),
            live_bytes: live.byte_size(),
            bank_entries: self.cache.bank().len(),
            bank_bytes: self.cache.bank().total_bytes(),
            store: self.cache.store().map(|s| StoreContents {
                files: s.entries().len(),
                bytes: s.total_bytes(),
                budget: s.budget(),
            }),
        };
        match &self.lane {
            Some(lane) => lane.report(stats, rejections, contents),
            None => self.metrics.contents(contents),
        }
    }

    /// A lane's turn is over: publish its live tokens and that it is free
    /// (once per turn; nothing for the single worker).
    pub(crate) fn lane_idle(&mut self) {
        if let Some(lane) = &mut self.lane {
            lane.idle(self.cache.live().tokens());
        }
    }

    fn run(mut self, mut queue: mpsc::Receiver<Msg>) {
        while let Some(msg) = queue.blocking_recv() {
            match msg {
                Msg::Job(job)
                    if job.events.is_closed() || self.stopping.load(Ordering::Relaxed) =>
                {
                    // The client left while the job waited, or the server
                    // is stopping.
                    self.metrics.cancelled();
                }
                Msg::Job(job) => {
                    self.metrics.running(1);
                    self.turn(*job);
                    self.metrics.running(0);
                }
                Msg::Shutdown(done) => {
                    self.cache.shutdown();
                    self.report_cache();
                    let _ = done.send(());
                    return;
                }
            }
        }
        // Every handle dropped: still a clean end.
        self.cache.shutdown();
    }

    pub(crate) fn turn(&mut self, mut job: Job) {
        let events = job.events.clone();
        if let Some(top_n) = job.prompt_logprobs {
            match decode::prompt_logprobs(self.model, &job.prompt, top_n, 256) {
                Ok(lps) => {
                    let _ = events.send(WorkEvent::PromptLogprobs(lps));
                }
                Err(e) => {
                    let _ = events.send(WorkEvent::Failed(e.to_string()));
                    return;
                }
            }
        }
        let cancel = CancelToken::new();
        let stopping = self.stopping;
        let config = TurnConfig {
            max_tokens: job.max_tokens,
            stop_token_ids: self.tokenizer.stop_token_ids().to_vec(),
            prefill_chunk: self.prefill_chunk,
            logprobs: job.logprobs,
            cancel: cancel.clone(),
        };
        let start = Instant::now();
        let mut first_token = None;
        let mut text = TextStream::new(self.tokenizer, std::mem::take(&mut job.stops));
        let mut started = false;
        // The longest exact-prefix state (live, bank, disk) becomes the live
        // session; what it covers is exactly what the turn reuses.
        let prepared = self.cache.prepare(self.model, &job.prompt, job.mtp_depth);
        let _ = events.send(WorkEvent::Started {
            cached_tokens: prepared.cached_tokens,
        });
        let request = TurnRequest {
            prompt: &job.prompt,
            sampler: &mut job.sampler,
            config,
            mtp_depth: job.mtp_depth,
        };
        let mut observer = JobObserver {
            structure: job
                .structural
                .then(|| StructuralSampling::new(self.tokenizer)),
            constraint: job.constraint.take(),
            inner: Observe {
                prefill: |_| {
                    // A client that left during a long prefill stops it at the
                    // next chunk.
                    if events.is_closed() || stopping.load(Ordering::Relaxed) {
                        cancel.cancel();
                    }
                },
                token: |event: decode::TokenEvent| {
                    if !started {
                        started = true;
                        first_token = Some(start.elapsed());
                    }
                    // A token the detokenizer cannot decode adds no text; the
                    // turn goes on.
                    let piece = text
                        .push(event.token, event.is_stop_token)
                        .unwrap_or_default();
                    let token = TokenOut {
                        id: event.token,
                        logprobs: event.logprobs,
                    };
                    let delta = WorkEvent::Delta {
                        text: piece.text,
                        token,
                    };
                    if events.send(delta).is_err() || stopping.load(Ordering::Relaxed) {
                        cancel.cancel();
                        return Flow::Stop(CallerStop::Cancelled);
                    }
                    if text.stopped() {
                        Flow::Stop(CallerStop::StopString)
                    } else {
                        Flow::Continue
                    }
                },
            },
        };
        // A prompt with images: its real ids, positions and the tower,
        // run on an image when the prefill first reaches it.
        let vision = self.vision.zip(job.vision.as_deref());
        let encode = |i: usize| match vision {
            Some((tower, v)) => tower.encode(&v.images[i]),
            None => Err(ds4_engine::EngineError::State("no vision tower".into())),
        };
        let media = match vision {
            Some((tower, v)) => match tower.media(v, &job.prompt, &encode) {
                Ok(m) => Some(m),
                Err(e) => {
                    let _ = events.send(WorkEvent::Failed(e));
                    return;
                }
            },
            None => None,
        };
        let result =
            self.cache
                .decode_turn_with_media(self.model, request, media.as_ref(), &mut observer);
        self.cache.finish(result.as_ref().ok());
        self.report_cache();
        // A lane is free again before its client hears the turn ended, so
        // the conversation's next turn finds it.
        self.lane_idle();
        match result {
            Ok(result) => {
                if !text.stopped() {
                    let _ = events.send(WorkEvent::Tail(text.finish()));
                }
                let summary = TurnSummary {
                    finish_reason: result.finish_reason,
                    prompt_tokens: job.prompt.len(),
                    completion_tokens: result.tokens.len(),
                    cached_tokens: result.reused_tokens,
                    stop_token: text.ended_on_stop_token(),
                    stop_sequence: text.stop_sequence().map(str::to_string),
                    prefill_tokens: result.timings.prefill_tokens,
                    prefill: result.timings.prefill,
                    decode_tokens: result.timings.decode_tokens,
                    decode: result.timings.decode,
                    first_token,
                    mtp: result.mtp,
                };
                self.metrics.turn(&summary);
                let _ = events.send(WorkEvent::Finished(summary));
            }
            Err(e) => {
                self.metrics.failed();
                let _ = events.send(WorkEvent::Failed(e.to_string()));
            }
        }
    }
}

/// A job's observer: the worker's closures (progress, text, cancellation)
/// plus, when the job samples tool-call structure greedily, the reply's DSML
/// state, which answers [`TurnObserver::greedy_after`] from the tokens alone.
struct JobObserver<'t, P, T> {
    inner: Observe<P, T>,
    structure: Option<StructuralSampling<'t>>,
    /// Per request, never in the session: a warm turn starts it as a cold
    /// one does.
    constraint: Option<Box<ds4_constraint::Constraint>>,
}

impl<P: FnMut(PrefillProgress), T: FnMut(TokenEvent) -> Flow> TurnObserver
    for JobObserver<'_, P, T>
{
    fn prefill(&mut self, progress: PrefillProgress) {
        self.inner.prefill(progress);
    }

    fn token(&mut self, event: TokenEvent) -> Flow {
        if let Some(s) = &mut self.structure {
            s.push(event.token);
        }
        if let Some(c) = &mut self.constraint {
            c.push(event.token);
        }
        self.inner.token(event)
    }

    fn allowed_after(&mut self, pending: &[u32]) -> Option<TokenMask> {
        self.constraint.as_mut().map(|c| c.allowed_after(pending))
    }

    fn greedy_after(&mut self, pending: &[u32]) -> bool {
        self.structure
            .as_ref()
            .is_some_and(|s| s.greedy_after(pending))
    }
}

#[cfg(test)]
mod tests {
    //! The job observer's structure decision on the real DeepSeek-V4
    //! tokenizer: emitted or still pending, a position's answer is the DSML
    //! state of the text before it.

    use ds4_engine::decode::TokenSource;
    use ds4_text::deepseek_v4::DsmlTracker;

    use super::*;

    #[test]
    fn greedy_after_is_the_dsml_state_of_the_tokens_before() {
        let tok = crate::deepseek_tests::tokenizer();
        let text = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n\
            <｜DSML｜parameter name=\"command\" string=\"true\">ls -la /tmp</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"n\" string=\"false\">{\"a\": \"b c\", \"d\": [1, 2]}</｜DSML｜parameter>\n\
            </｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let ids = tok.encode(text, true).unwrap();
        let new = |structure: bool| JobObserver {
            inner: Observe::new(|_: PrefillProgress| {}, |_: TokenEvent| Flow::Continue),
            structure: structure.then(|| StructuralSampling::new(&tok)),
            constraint: None,
        };
        let (mut emitted, ahead) = (new(true), new(true));
        let mut off = new(false);
        let (mut greedy, mut payload) = (0, 0);
        for i in 0..=ids.len() {
            let mut t = DsmlTracker::new();
            t.push(&tok.decode(&ids[..i], false).unwrap());
            let want = t.state().greedy();
            assert_eq!(emitted.greedy_after(&[]), want, "emitted {i}");
            assert_eq!(
                ahead.structure.as_ref().unwrap().greedy_after(&ids[..i]),
                want,
                "pending {i}"
            );
            assert!(!off.greedy_after(&ids[..i]), "no structure sampling asked");
            if want {
                greedy += 1
            } else {
                payload += 1
            }
            if let Some(&token) = ids.get(i) {
                let event = TokenEvent {
                    token,
                    index: i,
                    is_stop_token: false,
                    argmax_fallback: false,
                    logprobs: None,
                    source: TokenSource::Sampled,
                };
                assert_eq!(emitted.token(event.clone()), Flow::Continue);
                off.token(event);
            }
        }
        assert!(
            greedy > 10 && payload > 5,
            "{greedy} structural, {payload} other"
        );
    }
}
