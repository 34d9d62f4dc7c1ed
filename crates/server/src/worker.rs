//! The engine worker: one OS thread that owns the model and the live
//! session and runs one turn at a time. Requests reach it through a bounded
//! queue (full → 503); each job streams its events back on its own channel.
//! A job whose receiver is gone (client disconnected) is cancelled at its
//! next token, or skipped if it never started; the session stays consistent
//! because `decode::generate` always leaves it covering exactly the tokens
//! it has processed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ds4_engine::Model;
use ds4_engine::decode::{
    self, CallerStop, FinishReason, Flow, LiveSession, MtpStats, TokenLogprobs, TurnConfig,
};
use ds4_engine::families::LoadedModel;
use ds4_sampling::Sampler;
use ds4_text::{Detokenizer, StopMatcher, Tokenizer};
use tokio::sync::mpsc;

use crate::metrics::Metrics;

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

#[derive(Debug, Clone)]
pub struct TurnSummary {
    pub finish_reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    /// Whether the last token was a stop token (not text).
    pub stop_token: bool,
    /// The stop string that ended the turn, if one did.
    pub stop_sequence: Option<String>,
    pub prefill_tokens: usize,
    pub prefill: Duration,
    pub decode_tokens: usize,
    pub decode: Duration,
    /// From dequeue to the first token.
    pub first_token: Option<Duration>,
    /// Speculative statistics when the turn ran MTP.
    pub mtp: Option<MtpStats>,
}

/// The request side of the queue.
#[derive(Clone)]
pub struct WorkerHandle {
    queue: mpsc::Sender<Job>,
}

/// Why a job was not queued.
pub enum Rejected {
    QueueFull,
    WorkerGone,
}

impl WorkerHandle {
    pub fn submit(&self, job: Job) -> Result<(), Rejected> {
        self.queue.try_send(job).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Rejected::QueueFull,
            mpsc::error::TrySendError::Closed(_) => Rejected::WorkerGone,
        })
    }

    /// Jobs waiting (not counting the running one).
    pub fn depth(&self) -> usize {
        self.queue.max_capacity() - self.queue.capacity()
    }
}

/// Start the worker thread. It runs until every handle is dropped.
pub fn spawn(
    model: Arc<LoadedModel>,
    tokenizer: Arc<Tokenizer>,
    max_queue: usize,
    prefill_chunk: usize,
    metrics: Arc<Metrics>,
) -> std::io::Result<WorkerHandle> {
    let (tx, rx) = mpsc::channel(max_queue.max(1));
    std::thread::Builder::new()
        .name("engine-worker".into())
        .spawn(move || {
            ds4_engine::with_model!(&*model, m => {
                Worker { model: m, session: LiveSession::new(m), tokenizer: &tokenizer, prefill_chunk, metrics: &metrics }.run(rx)
            })
        })?;
    Ok(WorkerHandle { queue: tx })
}

struct Worker<'a, M: Model> {
    model: &'a M,
    session: LiveSession<M>,
    tokenizer: &'a Tokenizer,
    prefill_chunk: usize,
    metrics: &'a Metrics,
}

impl<M: Model> Worker<'_, M> {
    fn run(mut self, mut queue: mpsc::Receiver<Job>) {
        while let Some(job) = queue.blocking_recv() {
            if job.events.is_closed() {
                // The client left while the job waited.
                self.metrics.cancelled();
                continue;
            }
            self.turn(job);
        }
    }

    fn turn(&mut self, mut job: Job) {
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
        let config = TurnConfig {
            max_tokens: job.max_tokens,
            stop_token_ids: self.tokenizer.stop_token_ids().to_vec(),
            prefill_chunk: self.prefill_chunk,
            logprobs: job.logprobs,
        };
        let start = Instant::now();
        let mut first_token = None;
        let mut detok = Detokenizer::new(self.tokenizer, true);
        let stop_strings = std::mem::take(&mut job.stops);
        let mut stops = StopMatcher::new(stop_strings.clone());
        let mut matched = None;
        let mut started = false;
        let mut stop_token = false;
        let reusable = self
            .session
            .tokens()
            .iter()
            .zip(&job.prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let _ = events.send(WorkEvent::Started {
            cached_tokens: reusable.min(job.prompt.len().saturating_sub(1)),
        });
        let result = decode::generate_auto(
            self.model,
            &mut self.session,
            &job.prompt,
            &mut job.sampler,
            &config,
            job.mtp_depth,
            &mut |_| {},
            &mut |event| {
                if !started {
                    started = true;
                    first_token = Some(start.elapsed());
                }
                stop_token = event.is_stop_token;
                let text = if event.is_stop_token || stops.stopped() {
                    String::new()
                } else {
                    match detok.push(event.token) {
                        Ok(fresh) => {
                            let outcome = stops.push(&fresh);
                            matched = matched.or(outcome.matched);
                            outcome.emit
                        }
                        Err(_) => String::new(),
                    }
                };
                let token = TokenOut {
                    id: event.token,
                    logprobs: event.logprobs,
                };
                if events.send(WorkEvent::Delta { text, token }).is_err() {
                    return Flow::Stop(CallerStop::Cancelled);
                }
                if stops.stopped() {
                    Flow::Stop(CallerStop::StopString)
                } else {
                    Flow::Continue
                }
            },
        );
        match result {
            Ok(result) => {
                if !stops.stopped() {
                    let tail = stops.push(&detok.finish());
                    matched = matched.or(tail.matched);
                    let mut text = tail.emit;
                    if !tail.stopped {
                        text.push_str(&stops.finish());
                    }
                    let _ = events.send(WorkEvent::Tail(text));
                }
                let summary = TurnSummary {
                    finish_reason: result.finish_reason,
                    prompt_tokens: job.prompt.len(),
                    completion_tokens: result.tokens.len(),
                    cached_tokens: result.reused_tokens,
                    stop_token,
                    // StopMatcher ignores empty strings, so its index is into
                    // the non-empty ones (the API rejects empty ones anyway).
                    stop_sequence: matched.and_then(|i| {
                        stop_strings
                            .iter()
                            .filter(|s| !s.is_empty())
                            .nth(i)
                            .cloned()
                    }),
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
