//! Admission: an API-neutral generation request is checked against the
//! context, gets its sampler from the family's law and a seed, and is
//! submitted to the scheduler, whose queue takes it or is full (503 with
//! `Retry-After`; the rule is `crate::queue`'s).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use ds4_engine::decode::CancelToken;
use ds4_sampling::{Law, Sampler, SamplingParams, SamplingRequest, resolve_seed};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::events::WorkEvent;
use crate::output::Budget;
use crate::scheduler::{Rejected, SchedulerHandle};
use crate::state::{AppState, SharedState};
use crate::worker::Job;

/// What every API asks of the engine, once parsed and validated.
#[derive(Debug, Default)]
pub struct Generation {
    pub prompt: Vec<u32>,
    /// The prompt's images, in placeholder order (read by a model that
    /// takes images; see `Serving::accepts_images`).
    pub images: Vec<crate::images::ImageInput>,
    /// The images processed and expanded (`vision::expand`): `prompt` then
    /// holds the session keys, this the real ids and the tower's input.
    pub vision: Option<std::sync::Arc<crate::vision::VisionPrompt>>,
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
    /// Reasoning tokens allowed before the block is closed (Anthropic
    /// `thinking.budget_tokens`, validated; only for families that mark
    /// reasoning).
    pub reasoning_budget: Option<usize>,
    /// Warnings found while parsing (e.g. ignored reasoning controls).
    pub warnings: Vec<String>,
    /// The prompt opened the reasoning block: the reply starts thinking
    /// (families with forced thinking sampling use it).
    pub thinks: bool,
    /// Sample tool-call structure at temperature 0 (chat with tools on a
    /// family that does: `family::Serving::structural_greedy`).
    pub structural: bool,
    /// The compiled structured-output constraint (`constraints.rs`), if the
    /// request asked for one.
    pub constraint: Option<Box<ds4_constraint::Constraint>>,
}

impl Generation {
    /// Expand the prompt's images for a model that reads them
    /// ([`crate::vision::expand`]): the prompt becomes the session keys.
    pub async fn expand_images(
        &mut self,
        vision: Option<&std::sync::Arc<crate::vision::Vision>>,
    ) -> Result<(), ApiError> {
        if let Some(v) = crate::vision::expand(vision, &mut self.prompt, &self.images).await? {
            self.vision = Some(v);
        }
        Ok(())
    }
}

/// A queued turn.
pub struct Admitted {
    pub events: mpsc::UnboundedReceiver<WorkEvent>,
    pub seed: u64,
    pub warnings: Vec<String>,
    pub prompt_tokens: usize,
    /// Set when the turn runs under a reasoning budget.
    pub budget: Option<Budget>,
    /// Cancels the turn's jobs when dropped before they end (the client
    /// left): they leave the queue, or their lane, at once.
    pub ticket: Ticket,
}

/// The scheduler ids of a turn's jobs; dropping it cancels them (a job
/// that already ended ignores it).
pub struct Ticket {
    scheduler: SchedulerHandle,
    ids: Arc<Mutex<Vec<u64>>>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let ids = self.ids.lock().map(|ids| ids.clone()).unwrap_or_default();
        for id in ids {
            self.scheduler.cancel(id);
        }
    }
}

pub async fn admit(state: &SharedState, mut g: Generation) -> Result<Admitted, ApiError> {
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
    // `length` finish if it uses it all), as the issue asks. One that sets
    // no limit gets the server's `--default-max-tokens`.
    let room = state.ctx - g.prompt.len();
    let max_tokens = g
        .max_tokens
        .or(state.config.default_max_tokens)
        .map_or(room, |m| m.min(room as u64) as usize);
    let descriptor = state.descriptor;
    server_sampling(&state.config, &mut g);
    let params = sampling(state, &mut g)?;
    let seed = resolve_seed(g.seed, state.config.seed);
    let ids = Arc::new(Mutex::new(Vec::new()));
    let plan = JobPlan {
        ids: ids.clone(),
        law: descriptor.law,
        params,
        structural: g.structural,
        stops: g.stops,
        logprobs: g.logprobs,
        mtp_depth: g.mtp_depth.or(default_mtp_depth(&state.config, &params)),
        vision: g.vision.clone(),
    };
    // Under a budget the first job stops at the budget; the output stream
    // then closes the reasoning and continues (`output::Budget`).
    let budget = match (g.reasoning_budget, state.profile.reasoning) {
        // A constrained reply is one job: the grammar covers all of it.
        (Some(b), Some(markers)) if b < max_tokens && g.constraint.is_none() => {
            // The blank line after the marker is for families whose splitter
            // drops it; elsewhere (DeepSeek-V4) it would become answer text.
            let blank = if markers.skip_blank_after_close {
                "\n\n"
            } else {
                ""
            };
            let close = format!("{}{blank}", markers.close);
            let close_ids = state.count_tokens(&close)?;
            let (state, plan, prompt) = (state.clone(), plan.clone(), g.prompt.clone());
            Some(Budget {
                tokens: b,
                max_tokens,
                prompt,
                close,
                close_ids,
                resubmit: Box::new(move |prompt, max_tokens| {
                    Box::pin(async move {
                        // A stream of its own: the continuation does not
                        // replay the reasoning's draws.
                        let seed = seed ^ 0x9e37_79b9_7f4a_7c15;
                        let next = Next {
                            prompt_logprobs: None,
                            seed,
                            constraint: None,
                            continuation: true,
                        };
                        plan.submit(&state, prompt, max_tokens, next)
                            .await
                            .map_err(|e| e.message)
                    })
                }),
            })
        }
        _ => None,
    };
    let first_max = budget.as_ref().map_or(max_tokens, |b| b.tokens);
    let prompt_tokens = g.prompt.len();
    let first = Next {
        prompt_logprobs: g.prompt_logprobs,
        seed,
        constraint: g.constraint,
        continuation: false,
    };
    let events = plan.submit(state, g.prompt, first_max, first).await?;
    Ok(Admitted {
        events,
        seed,
        warnings: g.warnings,
        prompt_tokens,
        budget,
        ticket: Ticket {
            scheduler: state.scheduler.clone(),
            ids,
        },
    })
}

/// The operator's `--temperature` and `--seed`: defaults for requests that
/// set none, or with `--force-sampling` the values every request runs with
/// (a request's differing value is reported in its warnings, not silently
/// replaced).
/// The draft depth of a request that sends no `mtp_depth`: the server's
/// `--mtp-depth` (under `auto` its sampled depth when the request samples).
fn default_mtp_depth(
    config: &crate::config::ServerConfig,
    params: &SamplingParams,
) -> Option<usize> {
    if params.temperature > 0.0 {
        config.mtp_depth_sampled.or(config.mtp_depth)
    } else {
        config.mtp_depth
    }
}

fn server_sampling(config: &crate::config::ServerConfig, g: &mut Generation) {
    if !config.force_sampling {
        g.sampling.temperature = g.sampling.temperature.or(config.temperature);
        return;
    }
    if let Some(t) = config.temperature {
        if let Some(asked) = g.sampling.temperature.filter(|&asked| asked != t) {
            g.warnings.push(format!(
                "temperature {asked} replaced by the server's {t} (--force-sampling)"
            ));
        }
        g.sampling.temperature = Some(t);
    }
    if let Some(seed) = config.seed {
        if let Some(asked) = g.seed.filter(|&asked| asked != seed) {
            g.warnings.push(format!(
                "seed {asked} replaced by the server's {seed} (--force-sampling)"
            ));
        }
        g.seed = Some(seed);
    }
}

/// The job's sampling parameters: the family's law resolves the request over
/// the family's defaults (parameters the law lacks become warnings), then a
/// family that fixes the sampling of thinking replies applies it.
pub fn sampling(state: &AppState, g: &mut Generation) -> Result<SamplingParams, ApiError> {
    let descriptor = state.descriptor;
    let resolved = descriptor
        .law
        .resolve(&descriptor.sampling_defaults, &g.sampling)
        .map_err(|e| ApiError::invalid(e.field().name(), e.to_string()))?;
    g.warnings
        .extend(resolved.ignored.iter().map(ToString::to_string));
    Ok(thinking_sampling(state, g, resolved.params))
}

/// The sampling of a reply that starts thinking on a family that fixes it
/// (ds4 ignores the client's knobs there); the request's knobs it overrides
/// are reported in `g.warnings`. Otherwise `params` unchanged.
fn thinking_sampling(
    state: &AppState,
    g: &mut Generation,
    params: SamplingParams,
) -> SamplingParams {
    let Some(forced) = state.serving.thinking_sampling.filter(|_| g.thinks) else {
        return params;
    };
    let s = &g.sampling;
    let asked: Vec<&str> = [
        ("temperature", s.temperature.is_some()),
        ("top_p", s.top_p.is_some()),
        ("top_k", s.top_k.is_some()),
        ("min_p", s.min_p.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if !asked.is_empty() {
        g.warnings.push(format!(
            "{} ignored: the {} family samples a thinking reply with temperature {}, top_p {}, \
             top_k {}, min_p {}",
            asked.join(", "),
            state.descriptor.name,
            forced.temperature,
            forced.top_p,
            forced.top_k,
            forced.min_p
        ));
    }
    forced
}

/// Everything a job needs besides its prompt and limit.
#[derive(Clone)]
struct JobPlan {
    /// The turn's job ids so far (its [`Ticket`]'s).
    ids: Arc<Mutex<Vec<u64>>>,
    law: Law,
    params: SamplingParams,
    structural: bool,
    stops: Vec<String>,
    logprobs: Option<usize>,
    mtp_depth: Option<usize>,
    vision: Option<std::sync::Arc<crate::vision::VisionPrompt>>,
}

/// What differs between a turn's first job and its continuation.
struct Next {
    prompt_logprobs: Option<usize>,
    seed: u64,
    constraint: Option<Box<ds4_constraint::Constraint>>,
    continuation: bool,
}

impl JobPlan {
    async fn submit(
        &self,
        state: &AppState,
        prompt: Vec<u32>,
        max_tokens: usize,
        next: Next,
    ) -> Result<mpsc::UnboundedReceiver<WorkEvent>, ApiError> {
        let sampler = Sampler::new(self.law, self.params, next.seed)
            .map_err(|e| ApiError::invalid(e.field().name(), e.to_string()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let id = state.scheduler.next_id();
        let job = Job {
            id,
            cancel: CancelToken::new(),
            admitted: Instant::now(),
            continuation: next.continuation,
            prompt,
            sampler,
            max_tokens,
            stops: self.stops.clone(),
            logprobs: self.logprobs,
            prompt_logprobs: next.prompt_logprobs,
            mtp_depth: self.mtp_depth,
            structural: self.structural,
            constraint: next.constraint,
            vision: self.vision.clone(),
            events: tx,
        };
        if let Ok(mut ids) = self.ids.lock() {
            ids.push(id);
        }
        match state.scheduler.submit(job).await {
            Ok(()) => Ok(rx),
            Err(Rejected::QueueFull(full)) => {
                state.metrics.rejected_queue_full();
                Err(ApiError::queue_full(full.waiting, full.reserved_tokens))
            }
            Err(Rejected::Stopped) => Err(ApiError::shutting_down()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;

    fn with(temperature: Option<f64>, seed: Option<u64>) -> Generation {
        let mut g = Generation::default();
        g.sampling.temperature = temperature;
        g.seed = seed;
        g
    }

    /// `--mtp-depth auto` sets a sampled depth apart from the greedy one; a
    /// number sets only `mtp_depth`, which then serves both.
    #[test]
    fn the_default_mtp_depth_follows_the_request_temperature() {
        let mut config = ServerConfig::new(([127, 0, 0, 1], 0).into(), "m");
        let at = |t: f64| SamplingParams {
            temperature: t,
            ..Law::Nucleus.default_params()
        };
        assert_eq!(default_mtp_depth(&config, &at(0.7)), None);
        config.mtp_depth = Some(3);
        assert_eq!(default_mtp_depth(&config, &at(0.0)), Some(3));
        assert_eq!(default_mtp_depth(&config, &at(0.7)), Some(3));
        config.mtp_depth = Some(2);
        config.mtp_depth_sampled = Some(1);
        assert_eq!(default_mtp_depth(&config, &at(0.0)), Some(2));
        assert_eq!(default_mtp_depth(&config, &at(0.7)), Some(1));
    }

    #[test]
    fn server_temperature_is_a_default_unless_forced() {
        let mut config = ServerConfig::new(([127, 0, 0, 1], 0).into(), "m");
        config.temperature = Some(0.0);
        config.seed = Some(7);
        // A default: the request's own value wins; none gets the server's.
        let mut g = with(Some(1.0), Some(3));
        server_sampling(&config, &mut g);
        assert_eq!((g.sampling.temperature, g.seed), (Some(1.0), Some(3)));
        let mut g = with(None, None);
        server_sampling(&config, &mut g);
        assert_eq!(g.sampling.temperature, Some(0.0));
        assert!(g.warnings.is_empty());
        // Forced: the server's values replace the request's, with warnings.
        config.force_sampling = true;
        let mut g = with(Some(1.0), Some(3));
        server_sampling(&config, &mut g);
        assert_eq!((g.sampling.temperature, g.seed), (Some(0.0), Some(7)));
        assert_eq!(g.warnings.len(), 2, "{:?}", g.warnings);
        assert!(g.warnings[0].contains("--force-sampling"));
        let mut g = with(Some(0.0), Some(7));
        server_sampling(&config, &mut g);
        assert!(g.warnings.is_empty(), "{:?}", g.warnings);
    }
}
