//! Admission: an API-neutral generation request is checked against the
//! context, gets its sampler from the family's law and a seed, and is put on
//! the worker's queue (or refused with 503 when the queue is full).

use ds4_sampling::{Sampler, SamplingRequest, resolve_seed};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::state::AppState;
use crate::worker::{Job, Rejected, WorkEvent};

/// What every API asks of the engine, once parsed and validated.
#[derive(Debug, Default)]
pub struct Generation {
    pub prompt: Vec<u32>,
    /// The request field that carried the prompt (named in errors).
    pub prompt_field: &'static str,
    pub sampling: SamplingRequest,
    pub seed: Option<u64>,
    pub max_tokens: Option<u64>,
    pub stops: Vec<String>,
    pub logprobs: Option<usize>,
    pub prompt_logprobs: Option<usize>,
    /// The request's `mtp_depth` (already checked against the model).
    pub mtp_depth: Option<usize>,
    /// Warnings found while parsing (e.g. ignored reasoning controls).
    pub warnings: Vec<String>,
}

/// A queued turn.
pub struct Admitted {
    pub events: mpsc::UnboundedReceiver<WorkEvent>,
    pub seed: u64,
    pub warnings: Vec<String>,
    pub prompt_tokens: usize,
}

pub fn admit(state: &AppState, mut g: Generation) -> Result<Admitted, ApiError> {
    if g.prompt.is_empty() {
        return Err(ApiError::invalid(g.prompt_field, "the prompt is empty"));
    }
    if g.prompt.len() >= state.ctx {
        state.metrics.rejected_context();
        let mut e = ApiError::context_exceeded(g.prompt.len(), state.ctx);
        e.param = Some(g.prompt_field.into());
        return Err(e);
    }
    // A request may ask for more than fits; it gets what fits (and a
    // `length` finish if it uses it all), as the issue asks.
    let room = state.ctx - g.prompt.len();
    let max_tokens = g.max_tokens.map_or(room, |m| m.min(room as u64) as usize);
    let descriptor = state.descriptor;
    let resolved = descriptor
        .law
        .resolve(&descriptor.sampling_defaults, &g.sampling)
        .map_err(|e| ApiError::invalid(e.field().name(), e.to_string()))?;
    g.warnings
        .extend(resolved.ignored.iter().map(ToString::to_string));
    let seed = resolve_seed(g.seed, state.config.seed);
    let sampler = Sampler::new(descriptor.law, resolved.params, seed)
        .map_err(|e| ApiError::invalid(e.field().name(), e.to_string()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens = g.prompt.len();
    let job = Job {
        prompt: g.prompt,
        sampler,
        max_tokens,
        stops: g.stops,
        logprobs: g.logprobs,
        prompt_logprobs: g.prompt_logprobs,
        mtp_depth: g.mtp_depth.or(state.config.mtp_depth),
        events: tx,
    };
    match state.worker.submit(job) {
        Ok(()) => Ok(Admitted {
            events: rx,
            seed,
            warnings: g.warnings,
            prompt_tokens,
        }),
        Err(Rejected::QueueFull) => {
            state.metrics.rejected_queue_full();
            Err(ApiError::queue_full(state.worker.depth()))
        }
        Err(Rejected::WorkerGone) => Err(ApiError::internal("the engine worker has stopped")),
    }
}
