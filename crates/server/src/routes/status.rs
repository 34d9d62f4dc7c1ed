//! `GET /v1/status`: what the server is and what it holds, as JSON — the
//! model and family, its sampling law, limits, the queue and the running
//! turns (asked of the scheduler), batching, time to first token, the
//! session cache's contents and hits by source, and the running totals
//! also in `/metrics`. The page's dashboard polls it.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::ids::unix_now;
use crate::scheduler::SchedulerStatus;
use crate::state::SharedState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Status {
    pub model: String,
    pub family: &'static str,
    /// The backend and kernels the model runs on (`cpu-avx512`,
    /// `cpu-avx512-fast` for the fast CPU kernel set, `cuda-sm_90a`).
    pub backend: String,
    /// The kernel set of the model's products (`reference`, `fast`).
    pub kernel_set: &'static str,
    /// The KV cache element type (`f32`, `f16`).
    pub kv_cache: &'static str,
    /// The sampling law the family is bound to (`nucleus`, `ds4`).
    pub sampling_law: &'static str,
    /// The family's defaults for parameters a request leaves unset.
    pub sampling_defaults: SamplingDefaults,
    pub context_length: usize,
    /// Requests waiting for a lane.
    pub queue_depth: usize,
    /// Waiting requests allowed (`--max-queue`); null: no count cap, only
    /// the token budget (`queue.max_tokens`).
    pub max_queue: Option<usize>,
    /// The admission queue: what waits and what it reserves.
    pub queue: Queue,
    /// Turns running now, and the lanes that run them (`--max-batch`).
    pub running: usize,
    pub lanes: usize,
    /// Batched forwards (`--max-batch` above 1).
    pub batching: Batching,
    /// Time to first token and queue wait.
    pub latency: Latency,
    /// The model's MTP head (null: none).
    pub mtp: Option<MtpHead>,
    /// `--api-key` is set (the key itself is never shown).
    pub api_key_required: bool,
    pub uptime_seconds: u64,
    pub totals: Totals,
    pub cache: Cache,
    pub speed: Speed,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Queue {
    pub waiting: usize,
    /// Session-cache rows (prompt + output limit) the waiting requests
    /// reserve.
    pub reserved_tokens: usize,
    /// The budget they reserve against (`--max-queue-tokens`): a request
    /// that does not fit gets 503 with `Retry-After`, unless none waits.
    pub max_tokens: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Batching {
    pub batches: u64,
    /// Session forwards the batches held.
    pub forwards: u64,
    pub largest: u64,
    /// `forwards / batches` (0 before any).
    pub mean_size: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Latency {
    /// Turns measured.
    pub turns: u64,
    /// Mean seconds from admission to the first token (queue wait and
    /// prefill).
    pub mean_time_to_first_token_seconds: f64,
    /// Mean seconds from admission to the turn's start on a lane.
    pub mean_queue_wait_seconds: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SamplingDefaults {
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub min_p: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MtpHead {
    /// The depth a request gets when it does not choose one.
    pub default_depth: usize,
    pub max_depth: usize,
    /// Draft tokens proposed and accepted so far.
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Totals {
    pub requests: u64,
    pub errors_4xx: u64,
    pub errors_5xx: u64,
    pub turns: u64,
    pub turns_failed: u64,
    pub turns_cancelled: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub rejected_queue_full: u64,
    pub rejected_context_length: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Cache {
    /// Turns that started from a cached state, by where it came from.
    pub hits: CacheHits,
    /// Turns that reused no prompt token.
    pub misses: u64,
    pub live_session: LiveSession,
    pub bank: Bank,
    /// Null without `--checkpoint-dir`.
    pub checkpoints: Option<Checkpoints>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CacheHits {
    pub live: u64,
    pub bank: u64,
    pub disk: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LiveSession {
    pub tokens: usize,
    pub bytes: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Bank {
    pub sessions: usize,
    pub bytes: usize,
    pub budget_bytes: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Checkpoints {
    pub files: usize,
    pub bytes: u64,
    pub budget_bytes: u64,
    pub saves: u64,
    pub save_failures: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Speed {
    /// Tokens sent to clients per second over the last 10 seconds, every
    /// running turn together.
    pub tokens_per_second: f64,
    /// Tokens per second of the last turn.
    pub last_prefill_tokens_per_second: f64,
    pub last_decode_tokens_per_second: f64,
    /// Over the server's life.
    pub prefill_tokens: u64,
    pub prefill_seconds: f64,
    pub decode_tokens: u64,
    pub decode_seconds: f64,
}

#[utoipa::path(
    get,
    path = "/v1/status",
    responses(
        (status = 200, body = Status),
        (status = 401, description = "`--api-key` is set and the request carries no valid key")
    )
)]
pub async fn status(State(state): State<SharedState>) -> Json<Status> {
    let m = state.metrics.snapshot();
    // The scheduler's own view (a consistent one); the published gauges if
    // it is gone.
    let q = state.scheduler.status().await.unwrap_or(SchedulerStatus {
        waiting: m.waiting as usize,
        reserved_tokens: m.reserved_tokens as usize,
        running: m.running as usize,
        lanes: state.config.max_batch.max(1),
        max_queue_tokens: 0,
        max_queue: None,
    });
    let d = state.descriptor.sampling_defaults;
    Json(Status {
        model: state.config.model_id.clone(),
        family: state.descriptor.name,
        backend: state.backend.clone(),
        kernel_set: state.kernel_set,
        kv_cache: state.kv_cache,
        sampling_law: state.descriptor.law.name(),
        sampling_defaults: SamplingDefaults {
            temperature: d.temperature,
            top_p: d.top_p,
            top_k: d.top_k,
            min_p: d.min_p,
        },
        context_length: state.ctx,
        queue_depth: q.waiting,
        max_queue: q.max_queue,
        queue: Queue {
            waiting: q.waiting,
            reserved_tokens: q.reserved_tokens,
            max_tokens: q.max_queue_tokens,
        },
        running: q.running,
        lanes: q.lanes,
        batching: Batching {
            batches: m.batches,
            forwards: m.batched_forwards,
            largest: m.batch_largest,
            mean_size: if m.batches > 0 {
                m.batched_forwards as f64 / m.batches as f64
            } else {
                0.0
            },
        },
        latency: Latency {
            turns: m.first_token.count(),
            mean_time_to_first_token_seconds: m.first_token.mean(),
            mean_queue_wait_seconds: m.queue_wait.mean(),
        },
        mtp: state.mtp.map(|c| MtpHead {
            default_depth: state.config.mtp_depth.unwrap_or(c.default_depth),
            max_depth: c.max_depth,
            drafted_tokens: m.mtp_drafted,
            accepted_tokens: m.mtp_accepted,
        }),
        api_key_required: state.config.api_key.is_some(),
        uptime_seconds: unix_now().saturating_sub(state.created),
        totals: Totals {
            requests: m.requests,
            errors_4xx: m.errors_4xx,
            errors_5xx: m.errors_5xx,
            turns: m.turns,
            turns_failed: m.failed,
            turns_cancelled: m.cancelled,
            prompt_tokens: m.prompt_tokens,
            completion_tokens: m.completion_tokens,
            cached_prompt_tokens: m.cached_tokens,
            rejected_queue_full: m.rejected_queue_full,
            rejected_context_length: m.rejected_context,
        },
        cache: Cache {
            hits: CacheHits {
                live: m.cache.live_hits,
                bank: m.cache.bank_hits,
                disk: m.cache.disk_hits,
            },
            misses: m.cache_misses,
            live_session: LiveSession {
                tokens: m.contents.live_tokens,
                bytes: m.contents.live_bytes,
            },
            bank: Bank {
                sessions: m.contents.bank_entries,
                bytes: m.contents.bank_bytes,
                budget_bytes: state.config.bank_budget,
            },
            checkpoints: m.contents.store.map(|s| Checkpoints {
                files: s.files,
                bytes: s.bytes,
                budget_bytes: s.budget,
                saves: m.cache.saves,
                save_failures: m.cache.save_failures,
            }),
        },
        speed: Speed {
            tokens_per_second: m.recent_tokens_per_second,
            last_prefill_tokens_per_second: m.last_prefill_rate,
            last_decode_tokens_per_second: m.last_decode_rate,
            prefill_tokens: m.prefill_tokens,
            prefill_seconds: m.prefill_seconds,
            decode_tokens: m.decode_tokens,
            decode_seconds: m.decode_seconds,
        },
    })
}
