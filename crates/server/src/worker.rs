//! A turn runner: one lane's [`Worker`] owns a session cache (live
//! session, bank, optional checkpoint store: the engine's [`SessionCache`],
//! the same policy `run` and `chat` use) and runs one [`Job`] at a time on
//! it, streaming [`WorkEvent`]s back on the job's own channel. A job is
//! cancelled through its [`CancelToken`] — by the scheduler when its client
//! leaves, or here when the job's channel is found closed at a prefill
//! chunk or token — and the session stays consistent because the decode
//! loops always leave it covering exactly the tokens they processed. Text
//! goes through [`TextStream`] (detokenizer, stop strings, stop tokens),
//! the stream the CLI uses too.
//!
//! Who gives a worker its jobs and where it reports is not its business:
//! the scheduler (`crate::scheduler`) runs one worker per lane
//! (`crate::lanes`) and hears through [`Reports`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ds4_engine::Model;
use ds4_engine::decode::{
    self, CallerStop, CancelToken, Flow, Observe, PrefillProgress, TokenEvent, TokenMask,
    TurnConfig, TurnObserver, TurnRequest,
};
use ds4_engine::state::warm::{CacheStats, SessionCache};
use ds4_sampling::Sampler;
use ds4_text::deepseek_v4::StructuralSampling;
use ds4_text::{TextStream, Tokenizer};
use tokio::sync::mpsc;

use crate::events::{TokenOut, WorkEvent};
use crate::metrics::{CacheContents, Metrics, StoreContents};
use crate::summary::TurnSummary;

/// One admitted generation request.
pub struct Job {
    /// The scheduler's id for it (set when it is submitted).
    pub id: u64,
    /// Set by the scheduler when the client leaves or the server stops.
    pub cancel: CancelToken,
    /// When admission accepted it: time to first token counts from here.
    pub admitted: Instant,
    /// The second job of a turn under a reasoning budget: part of a turn
    /// already admitted, so the queue always takes it.
    pub continuation: bool,
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

/// Where a worker reports: its cache's counters and contents after each
/// turn, and the end of each turn (the lane is free; its live session
/// covers `tokens`).
pub(crate) trait Reports: Sync {
    fn cache(
        &self,
        lane: usize,
        stats: CacheStats,
        rejections: BTreeMap<&'static str, u64>,
        contents: CacheContents,
    );
    fn idle(&self, lane: usize, tokens: &[u32]);
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
    /// The lane this worker is, and where it reports.
    pub(crate) lane: usize,
    pub(crate) reports: &'a dyn Reports,
    /// The end of the current turn has been reported.
    pub(crate) idle: bool,
}

impl<M: Model> Worker<'_, M> {
    /// Report the session cache's counters and contents (summed with the
    /// other lanes'); warn once when a checkpoint did not survive its own
    /// save.
    pub(crate) fn report_cache(&mut self) {
        let stats = self.cache.stats();
        let rejections = self.cache.rejections();
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
        self.reports.cache(self.lane, stats, rejections, contents);
    }

    /// The turn is over: report the lane free with its live tokens (once
    /// per turn).
    pub(crate) fn lane_idle(&mut self) {
        if !self.idle {
            self.idle = true;
            self.reports.idle(self.lane, self.cache.live().tokens());
        }
    }

    pub(crate) fn turn(&mut self, mut job: Job) {
        self.idle = false;
        let events = job.events.clone();
        self.metrics.queue_wait(job.admitted.elapsed());
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
        let cancel = job.cancel.clone();
        let stopping = self.stopping;
        // A continuation's first token is not the turn's.
        let admitted = (!job.continuation).then_some(job.admitted);
        let metrics = self.metrics;
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
                        // What the client waited: the queue and the prefill.
                        if let Some(admitted) = admitted {
                            metrics.first_token(admitted.elapsed());
                        }
                    }
                    metrics.token_emitted();
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
