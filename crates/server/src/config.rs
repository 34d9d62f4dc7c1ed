//! Server settings (from `ds4server serve`'s flags).

use std::net::SocketAddr;
use std::time::Duration;

pub use ds4_engine::state::warm::CheckpointConfig;

/// The reply length for requests that set none (`--default-max-tokens`).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// The default queue budget in contexts: as many requests as the old
/// fixed queue of 16 held when each may fill the context, and many more
/// short ones.
pub const QUEUE_CONTEXTS: usize = 16;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen. Loopback unless the operator says otherwise.
    pub addr: SocketAddr,
    /// The model id clients use (`model` in requests, `/v1/models`).
    pub model_id: String,
    /// More names `/v1/models` lists for the served model (`--model-alias`).
    pub model_aliases: Vec<String>,
    /// Refuse (404) a request naming a model other than `model_id`, an
    /// alias or a family alias; by default any name is served by the loaded
    /// model, as ds4 and llama.cpp do, because agents send their own model
    /// names (`claude-opus-…`, `gpt-4o`) and background-task names.
    pub strict_model_names: bool,
    /// Reply length when a request sets none (`--default-max-tokens`):
    /// agents such as Codex send no limit, and a small model that loops
    /// would otherwise decode until the context is full. `None`: up to the
    /// context.
    pub default_max_tokens: Option<u64>,
    /// Context limit in tokens; `None` means the model's own. Never above
    /// the model's.
    pub ctx: Option<usize>,
    /// Requests that may wait behind the running ones (`--max-queue`), a
    /// cap besides the token budget; `usize::MAX`: no cap (the default).
    pub max_queue: usize,
    /// Session-cache rows the waiting requests may reserve, each its
    /// prompt plus its output limit (`--max-queue-tokens`; `crate::queue`);
    /// `None`: [`QUEUE_CONTEXTS`] contexts.
    pub max_queue_tokens: Option<usize>,
    /// Turns that run at once (`--max-batch`): the scheduler runs that many
    /// lanes (`crate::lanes`), whose forwards meet in batches above 1.
    pub max_batch: usize,
    /// Rows (decode rows and prefill chunks of every running turn) one
    /// batched forward takes at most (`--max-batch-tokens`); the turns past
    /// it wait for the next forward.
    pub max_batch_tokens: usize,
    /// When set, every route but `/health` and the embedded page needs it
    /// (Bearer or `x-api-key`).
    pub api_key: Option<String>,
    /// Origins allowed to call the API from a browser (`--cors`, exact
    /// `scheme://host[:port]`, or `*` for any origin); empty: no CORS headers.
    pub cors: Vec<String>,
    /// Host names accepted besides loopback names and IP literals when no
    /// API key is set (`--allowed-host`; `*` accepts any).
    pub allowed_hosts: Vec<String>,
    /// Timeouts, connection limit and shutdown grace (`crate::transport`).
    pub limits: crate::transport::Limits,
    /// The server's seed, used when a request has none.
    pub seed: Option<u64>,
    /// The server's temperature, used when a request has none
    /// (`--temperature`).
    pub temperature: Option<f64>,
    /// `--force-sampling`: `temperature` and `seed` (those set) replace the
    /// request's own, with a warning when they differ. For clients that
    /// always send a temperature (Claude Code sends 1) where the operator
    /// wants reproducible, greedy replies (the e2e tests).
    pub force_sampling: bool,
    /// Largest accepted request body.
    pub body_limit: usize,
    /// Interval of SSE keep-alive comments while nothing else is sent (a long
    /// prefill would otherwise look like a dead connection to proxies).
    pub keep_alive: Duration,
    /// Prefill chunk size in tokens.
    pub prefill_chunk: usize,
    /// MTP draft depth for requests that do not choose one; `None` takes
    /// the family's default (AR for a model without an MTP head).
    pub mtp_depth: Option<usize>,
    /// The same for requests that sample (temperature above 0), where it
    /// differs (`--mtp-depth auto`); `None` takes `mtp_depth`.
    pub mtp_depth_sampled: Option<usize>,
    /// Memory budget in bytes of the session bank (earlier sessions kept
    /// for prompts that branch off them); split evenly over the lanes when
    /// `max_batch` is above 1.
    pub bank_budget: usize,
    /// Prefill boundary distance for states that cannot be truncated
    /// (`--boundary-every`; 0: only at the end of each prompt).
    pub boundary_every: usize,
    /// Durable session checkpoints (`--checkpoint-dir`); `None`: memory only.
    pub checkpoints: Option<CheckpointConfig>,
    /// Images per request and bytes per image (`--max-images`,
    /// `--max-image-bytes`).
    pub images: crate::images::ImageLimits,
    /// Largest decoded image in pixels (`--max-image-pixels`; read from the
    /// image's header before decoding). `None`: the image processor's own
    /// limit.
    pub max_image_pixels: Option<u64>,
    /// The model's directory, where a vision-language checkpoint's tower and
    /// `preprocessor_config.json` are read from (`None`: text only).
    pub model_dir: Option<std::path::PathBuf>,
}

impl ServerConfig {
    pub fn new(addr: SocketAddr, model_id: impl Into<String>) -> Self {
        Self {
            addr,
            model_id: model_id.into(),
            model_aliases: Vec::new(),
            strict_model_names: false,
            default_max_tokens: Some(DEFAULT_MAX_TOKENS),
            ctx: None,
            max_queue: usize::MAX,
            max_queue_tokens: None,
            max_batch: 1,
            max_batch_tokens: ds4_engine::batching::BatchConfig::default().max_tokens,
            api_key: None,
            cors: Vec::new(),
            allowed_hosts: Vec::new(),
            limits: crate::transport::Limits::default(),
            seed: None,
            temperature: None,
            force_sampling: false,
            body_limit: 8 * 1024 * 1024,
            keep_alive: Duration::from_secs(10),
            prefill_chunk: ds4_engine::decode::DEFAULT_PREFILL_CHUNK,
            mtp_depth: None,
            mtp_depth_sampled: None,
            bank_budget: 1 << 30,
            boundary_every: ds4_engine::state::warm::DEFAULT_BOUNDARY_EVERY,
            checkpoints: None,
            images: crate::images::ImageLimits::default(),
            max_image_pixels: None,
            model_dir: None,
        }
    }
}
