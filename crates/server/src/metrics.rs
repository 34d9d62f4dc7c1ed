//! Prometheus counters and gauges (`GET /metrics`, text format 0.0.4).
//!
//! Rates are exported as token and second counters (`rate()` of one over
//! the other is the throughput over any window), plus the last turn's rates
//! as gauges for a quick look.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::BTreeMap;

use ds4_engine::state::warm::CacheStats;

use crate::summary::TurnSummary;

mod latency;

use latency::Recent;
pub use latency::{BUCKETS, Histogram};

/// Endpoints counted separately.
pub const ENDPOINTS: [&str; 6] = [
    "chat_completions",
    "completions",
    "responses",
    "messages",
    "count_tokens",
    "other",
];

/// The endpoint a path counts under (requests that fail before their
/// handler are counted by path).
pub fn endpoint_for_path(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "chat_completions",
        "/v1/completions" => "completions",
        "/v1/responses" => "responses",
        "/v1/messages" => "messages",
        "/v1/messages/count_tokens" => "count_tokens",
        _ => "other",
    }
}

#[derive(Default)]
pub struct Metrics {
    requests: [AtomicU64; ENDPOINTS.len()],
    errors_4xx: AtomicU64,
    errors_5xx: AtomicU64,
    turns: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    rejected_queue_full: AtomicU64,
    rejected_context: AtomicU64,
    prefill_tokens: AtomicU64,
    decode_tokens: AtomicU64,
    prefill_micros: AtomicU64,
    decode_micros: AtomicU64,
    mtp_drafted: AtomicU64,
    mtp_accepted: AtomicU64,
    connections_refused: AtomicU64,
    /// Turns running now (more than one with `--max-batch`), requests
    /// waiting and the session-cache rows they reserve (the scheduler
    /// publishes them after every command).
    running: AtomicU64,
    waiting: AtomicU64,
    reserved_tokens: AtomicU64,
    /// From admission to a turn's first token, and to its start.
    first_token: Mutex<Histogram>,
    queue_wait: Mutex<Histogram>,
    /// Tokens sent to clients, counted as they go (live, unlike
    /// `completion_tokens`, which counts finished turns).
    emitted: AtomicU64,
    /// The last seconds' emitted tokens (for a live tokens/s).
    recent: Mutex<Recent>,
    /// Batched forwards (`--max-batch` > 1): batches run, the forwards
    /// they held, the largest.
    batches: AtomicU64,
    batched_forwards: AtomicU64,
    batch_largest: AtomicU64,
    /// MTP prefills and verify windows that shared a batch, and MTP
    /// draft steps that did.
    batched_mtp: AtomicU64,
    batched_drafts: AtomicU64,
    /// Nanoseconds the batches' leaders gathered and their forwards ran.
    batch_gather_ns: AtomicU64,
    batch_run_ns: AtomicU64,
    /// Set once a checkpoint was deleted as soon as it was written: the
    /// disk budget is smaller than one file.
    checkpoint_budget_too_small: AtomicU64,
    last_rates: Mutex<(f64, f64)>,
    /// The session cache's own counters and the checkpoint store's refused
    /// files by reason (snapshots of the lanes' totals).
    cache: Mutex<(CacheStats, BTreeMap<&'static str, u64>)>,
    /// What the session cache holds now (after the last turn).
    contents: Mutex<CacheContents>,
    /// Every response by HTTP status (what a client saw: 200s, 400s, 404s).
    statuses: Mutex<BTreeMap<u16, u64>>,
}

/// What the lanes' session caches hold: the live session, the bank of
/// earlier sessions and the checkpoint store (snapshot after each turn).
/// With several lanes: the sums over the lanes' caches (live tokens and
/// bytes of every lane's live session, every lane's bank; the store is
/// lane 0's alone).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheContents {
    pub live_tokens: usize,
    pub live_bytes: usize,
    pub bank_entries: usize,
    pub bank_bytes: usize,
    /// `None` without `--checkpoint-dir`.
    pub store: Option<StoreContents>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StoreContents {
    pub files: usize,
    pub bytes: u64,
    pub budget: u64,
}

/// The counters as numbers (for `GET /v1/status`).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub requests: u64,
    pub errors_4xx: u64,
    pub errors_5xx: u64,
    pub turns: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    pub cache_misses: u64,
    pub rejected_queue_full: u64,
    pub rejected_context: u64,
    pub prefill_tokens: u64,
    pub prefill_seconds: f64,
    pub decode_tokens: u64,
    pub decode_seconds: f64,
    pub mtp_drafted: u64,
    pub mtp_accepted: u64,
    pub last_prefill_rate: f64,
    pub last_decode_rate: f64,
    pub cache: CacheStats,
    pub contents: CacheContents,
    pub running: u64,
    pub waiting: u64,
    pub reserved_tokens: u64,
    /// Batches and the forwards they held (`--max-batch` above 1).
    pub batches: u64,
    pub batched_forwards: u64,
    pub batch_largest: u64,
    /// Time to first token (from admission) and queue wait.
    pub first_token: Histogram,
    pub queue_wait: Histogram,
    /// Tokens emitted over the last seconds, per second.
    pub recent_tokens_per_second: f64,
}

impl Metrics {
    pub fn request(&self, endpoint: &str) {
        let i = ENDPOINTS
            .iter()
            .position(|e| *e == endpoint)
            .unwrap_or(ENDPOINTS.len() - 1);
        self.requests[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Count one response by its status (every route, errors included).
    pub fn response(&self, status: u16) {
        if let Ok(mut m) = self.statuses.lock() {
            *m.entry(status).or_default() += 1;
        }
    }

    pub fn error(&self, status: u16) {
        match status {
            400..=499 => self.errors_4xx.fetch_add(1, Ordering::Relaxed),
            _ => self.errors_5xx.fetch_add(1, Ordering::Relaxed),
        };
    }

    pub fn rejected_queue_full(&self) {
        self.rejected_queue_full.fetch_add(1, Ordering::Relaxed);
    }

    pub fn rejected_context(&self) {
        self.rejected_context.fetch_add(1, Ordering::Relaxed);
    }

    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed on accept: the connection limit was reached.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    pub fn checkpoint_budget_too_small(&self) {
        self.checkpoint_budget_too_small.store(1, Ordering::Relaxed);
    }

    /// How many turns run now.
    pub fn running(&self, n: usize) {
        self.running.store(n as u64, Ordering::Relaxed);
    }

    /// The queue now: requests waiting and the tokens they reserve.
    pub fn queue(&self, waiting: usize, reserved_tokens: usize) {
        self.waiting.store(waiting as u64, Ordering::Relaxed);
        self.reserved_tokens
            .store(reserved_tokens as u64, Ordering::Relaxed);
    }

    /// Requests waiting for a lane (the scheduler's last count).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed) as usize
    }

    /// A turn started `waited` after its admission.
    pub fn queue_wait(&self, waited: std::time::Duration) {
        if let Ok(mut h) = self.queue_wait.lock() {
            h.observe(waited.as_secs_f64());
        }
    }

    /// A turn's first token came `after` its admission.
    pub fn first_token(&self, after: std::time::Duration) {
        if let Ok(mut h) = self.first_token.lock() {
            h.observe(after.as_secs_f64());
        }
    }

    /// One token went to a client.
    pub fn token_emitted(&self) {
        self.emitted.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut r) = self.recent.lock() {
            r.add(crate::ids::unix_now());
        }
    }

    /// The batching model's counters since the server started.
    pub fn batching(&self, stats: ds4_engine::batching::BatchStats) {
        self.batches.store(stats.batches, Ordering::Relaxed);
        self.batched_forwards
            .store(stats.forwards, Ordering::Relaxed);
        self.batch_largest.store(stats.largest, Ordering::Relaxed);
        self.batched_mtp.store(stats.shared_mtp, Ordering::Relaxed);
        self.batched_drafts
            .store(stats.shared_drafts, Ordering::Relaxed);
        self.batch_gather_ns
            .store(stats.gather_ns, Ordering::Relaxed);
        self.batch_run_ns.store(stats.run_ns, Ordering::Relaxed);
    }

    pub fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// The session caches' totals after a turn (the sums over the lanes:
    /// `crate::lanes::CacheSums`).
    pub fn cache(&self, stats: &CacheStats, rejections: &BTreeMap<&'static str, u64>) {
        if let Ok(mut c) = self.cache.lock() {
            *c = (*stats, rejections.clone());
        }
    }

    /// The session cache's contents after a turn (or at start).
    pub fn contents(&self, c: CacheContents) {
        if let Ok(mut now) = self.contents.lock() {
            *now = c;
        }
    }

    /// Every counter at once.
    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (last_prefill_rate, last_decode_rate) =
            self.last_rates.lock().map(|r| *r).unwrap_or((0.0, 0.0));
        Snapshot {
            requests: self.requests.iter().map(get).sum(),
            errors_4xx: get(&self.errors_4xx),
            errors_5xx: get(&self.errors_5xx),
            turns: get(&self.turns),
            failed: get(&self.failed),
            cancelled: get(&self.cancelled),
            prompt_tokens: get(&self.prompt_tokens),
            completion_tokens: get(&self.completion_tokens),
            cached_tokens: get(&self.cached_tokens),
            cache_misses: get(&self.cache_misses),
            rejected_queue_full: get(&self.rejected_queue_full),
            rejected_context: get(&self.rejected_context),
            prefill_tokens: get(&self.prefill_tokens),
            prefill_seconds: get(&self.prefill_micros) as f64 / 1e6,
            decode_tokens: get(&self.decode_tokens),
            decode_seconds: get(&self.decode_micros) as f64 / 1e6,
            mtp_drafted: get(&self.mtp_drafted),
            mtp_accepted: get(&self.mtp_accepted),
            last_prefill_rate,
            last_decode_rate,
            cache: self.cache.lock().map(|c| c.0).unwrap_or_default(),
            contents: self.contents.lock().map(|c| *c).unwrap_or_default(),
            running: get(&self.running),
            waiting: get(&self.waiting),
            reserved_tokens: get(&self.reserved_tokens),
            batches: get(&self.batches),
            batched_forwards: get(&self.batched_forwards),
            batch_largest: get(&self.batch_largest),
            first_token: self
                .first_token
                .lock()
                .map(|h| h.clone())
                .unwrap_or_default(),
            queue_wait: self
                .queue_wait
                .lock()
                .map(|h| h.clone())
                .unwrap_or_default(),
            recent_tokens_per_second: self
                .recent
                .lock()
                .map(|mut r| r.rate(crate::ids::unix_now()))
                .unwrap_or(0.0),
        }
    }

    pub fn turn(&self, t: &TurnSummary) {
        let add = |c: &AtomicU64, v: u64| {
            c.fetch_add(v, Ordering::Relaxed);
        };
        add(&self.turns, 1);
        add(&self.prompt_tokens, t.prompt_tokens as u64);
        add(&self.completion_tokens, t.completion_tokens as u64);
        add(&self.cached_tokens, t.cached_tokens as u64);
        if t.cached_tokens > 0 {
            add(&self.cache_hits, 1);
        } else {
            add(&self.cache_misses, 1);
        }
        if t.finish_reason
            == ds4_engine::decode::FinishReason::Caller(ds4_engine::decode::CallerStop::Cancelled)
        {
            add(&self.cancelled, 1);
        }
        if let Some(m) = &t.mtp {
            add(&self.mtp_drafted, m.drafted_total() as u64);
            add(&self.mtp_accepted, m.accepted_total() as u64);
        }
        add(&self.prefill_tokens, t.prefill_tokens as u64);
        add(&self.decode_tokens, t.decode_tokens as u64);
        add(&self.prefill_micros, t.prefill.as_micros() as u64);
        add(&self.decode_micros, t.decode.as_micros() as u64);
        let rate = |n: usize, d: std::time::Duration| {
            let s = d.as_secs_f64();
            if s > 0.0 { n as f64 / s } else { 0.0 }
        };
        if let Ok(mut last) = self.last_rates.lock() {
            *last = (
                rate(t.prefill_tokens, t.prefill),
                rate(t.decode_tokens, t.decode),
            );
        }
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: u64| vec![(String::new(), v as f64)];
        let requests: Vec<(String, f64)> = ENDPOINTS
            .iter()
            .zip(&self.requests)
            .map(|(e, c)| (format!("{{endpoint=\"{e}\"}}"), get(c) as f64))
            .collect();
        metric(
            "ds4_requests_total",
            "counter",
            "HTTP requests by endpoint.",
            &requests,
        );
        metric(
            "ds4_request_errors_total",
            "counter",
            "Requests answered with an error, by class.",
            &[
                ("{class=\"4xx\"}".into(), get(&self.errors_4xx) as f64),
                ("{class=\"5xx\"}".into(), get(&self.errors_5xx) as f64),
            ],
        );
        let statuses: Vec<(String, f64)> = self
            .statuses
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|(status, n)| (format!("{{status=\"{status}\"}}"), n as f64))
            .collect();
        metric(
            "ds4_responses_total",
            "counter",
            "HTTP responses by status.",
            &statuses,
        );
        metric(
            "ds4_queue_depth",
            "gauge",
            "Requests waiting for a lane.",
            &one(get(&self.waiting)),
        );
        metric(
            "ds4_queue_reserved_tokens",
            "gauge",
            "Session-cache rows (prompt + output limit) the waiting requests reserve, against --max-queue-tokens.",
            &one(get(&self.reserved_tokens)),
        );
        metric(
            "ds4_running_turns",
            "gauge",
            "Turns running in the engine (up to --max-batch).",
            &one(get(&self.running)),
        );
        metric(
            "ds4_batches_total",
            "counter",
            "Batched forwards run (--max-batch above 1; a forward alone counts as a batch of one).",
            &one(get(&self.batches)),
        );
        metric(
            "ds4_batched_forwards_total",
            "counter",
            "Session forwards the batches held (divided by ds4_batches_total: the mean batch size).",
            &one(get(&self.batched_forwards)),
        );
        metric(
            "ds4_batch_largest",
            "gauge",
            "The most session forwards one batch has held.",
            &one(get(&self.batch_largest)),
        );
        metric(
            "ds4_batched_mtp_forwards_total",
            "counter",
            "MTP turns' prefills and verify windows that shared a batch with other forwards.",
            &one(get(&self.batched_mtp)),
        );
        metric(
            "ds4_batched_mtp_drafts_total",
            "counter",
            "MTP turns' draft steps (the head's calls) that shared a batch with other turns' drafts.",
            &one(get(&self.batched_drafts)),
        );
        let seconds = |ns: u64| vec![(String::new(), ns as f64 / 1e9)];
        metric(
            "ds4_batch_gather_seconds_total",
            "counter",
            "Time the batches' leaders waited for running turns to queue their forwards before taking a batch.",
            &seconds(get(&self.batch_gather_ns)),
        );
        metric(
            "ds4_batch_forward_seconds_total",
            "counter",
            "Time the batched forwards ran (ds4_batch_gather_seconds_total and this over ds4_batches_total: a batch's gather and forward).",
            &seconds(get(&self.batch_run_ns)),
        );
        let (batches, forwards) = (get(&self.batches), get(&self.batched_forwards));
        metric(
            "ds4_batch_mean_size",
            "gauge",
            "Session forwards per batched forward since the start (ds4_batched_forwards_total / ds4_batches_total; 0 before any).",
            &[(
                String::new(),
                if batches > 0 {
                    forwards as f64 / batches as f64
                } else {
                    0.0
                },
            )],
        );
        for (name, help, h) in [
            (
                "ds4_time_to_first_token_seconds",
                "From admission to a turn's first token (queue wait and prefill).",
                &self.first_token,
            ),
            (
                "ds4_queue_wait_seconds",
                "From admission to a turn's start on a lane.",
                &self.queue_wait,
            ),
        ] {
            let h = h.lock().map(|h| h.clone()).unwrap_or_default();
            let mut samples = Vec::with_capacity(BUCKETS.len() + 3);
            let mut cumulative = 0;
            for (b, n) in BUCKETS.iter().zip(h.counts) {
                cumulative += n;
                samples.push((format!("_bucket{{le=\"{b}\"}}"), cumulative as f64));
            }
            samples.push(("_bucket{le=\"+Inf\"}".into(), h.count as f64));
            samples.push(("_sum".into(), h.sum));
            samples.push(("_count".into(), h.count as f64));
            metric(name, "histogram", help, &samples);
        }
        metric(
            "ds4_generated_tokens_total",
            "counter",
            "Tokens sent to clients, counted as they go (ds4_completion_tokens_total counts finished turns).",
            &one(get(&self.emitted)),
        );
        let recent = self
            .recent
            .lock()
            .map(|mut r| r.rate(crate::ids::unix_now()))
            .unwrap_or(0.0);
        metric(
            "ds4_tokens_per_second",
            "gauge",
            "Tokens sent to clients per second over the last 10 seconds (every running turn together).",
            &[(String::new(), recent)],
        );
        let contents = self.contents.lock().map(|c| *c).unwrap_or_default();
        metric(
            "ds4_session_cache_bytes",
            "gauge",
            "Memory the session caches hold (every lane's live session, the banks), and the checkpoint files on disk.",
            &[
                ("{kind=\"live\"}".into(), contents.live_bytes as f64),
                ("{kind=\"bank\"}".into(), contents.bank_bytes as f64),
                (
                    "{kind=\"checkpoints\"}".into(),
                    contents.store.map_or(0, |s| s.bytes) as f64,
                ),
            ],
        );
        metric(
            "ds4_turns_total",
            "counter",
            "Generation turns completed.",
            &one(get(&self.turns)),
        );
        metric(
            "ds4_turns_failed_total",
            "counter",
            "Turns that failed in the engine.",
            &one(get(&self.failed)),
        );
        metric(
            "ds4_turns_cancelled_total",
            "counter",
            "Turns cancelled because the client disconnected.",
            &one(get(&self.cancelled)),
        );
        metric(
            "ds4_prompt_tokens_total",
            "counter",
            "Prompt tokens of completed turns.",
            &one(get(&self.prompt_tokens)),
        );
        metric(
            "ds4_completion_tokens_total",
            "counter",
            "Generated tokens.",
            &one(get(&self.completion_tokens)),
        );
        metric(
            "ds4_cached_prompt_tokens_total",
            "counter",
            "Prompt tokens reused from a cached state (live, bank or disk) instead of prefilled.",
            &one(get(&self.cached_tokens)),
        );
        metric(
            "ds4_cache_hits_total",
            "counter",
            "Turns that reused at least one prompt token.",
            &one(get(&self.cache_hits)),
        );
        metric(
            "ds4_cache_misses_total",
            "counter",
            "Turns that reused no prompt token.",
            &one(get(&self.cache_misses)),
        );
        let (cache, rejected) = self.cache.lock().map(|c| c.clone()).unwrap_or_default();
        metric(
            "ds4_cache_hits_by_source_total",
            "counter",
            "Turns that started from a cached state, by where it came from (live session, bank, checkpoint on disk).",
            &[
                ("{source=\"live\"}".into(), cache.live_hits as f64),
                ("{source=\"bank\"}".into(), cache.bank_hits as f64),
                ("{source=\"disk\"}".into(), cache.disk_hits as f64),
            ],
        );
        let rejected: Vec<(String, f64)> = rejected
            .iter()
            .map(|(reason, n)| (format!("{{reason=\"{reason}\"}}"), *n as f64))
            .collect();
        metric(
            "ds4_checkpoint_rejections_total",
            "counter",
            "Checkpoint files refused (and removed), by reason; the request was served cold.",
            &rejected,
        );
        metric(
            "ds4_checkpoint_budget_too_small",
            "gauge",
            "1 once a checkpoint was deleted as soon as it was written: --checkpoint-budget-mib is smaller than one checkpoint file.",
            &one(get(&self.checkpoint_budget_too_small)),
        );
        metric(
            "ds4_connections_refused_total",
            "counter",
            "Connections closed on accept because --max-connections were open.",
            &one(get(&self.connections_refused)),
        );
        metric(
            "ds4_checkpoint_saves_total",
            "counter",
            "Session checkpoints written.",
            &one(cache.saves),
        );
        metric(
            "ds4_checkpoint_save_failures_total",
            "counter",
            "Session checkpoints that could not be written.",
            &one(cache.save_failures),
        );
        metric(
            "ds4_rejections_total",
            "counter",
            "Requests refused at admission, by reason.",
            &[
                (
                    "{reason=\"queue_full\"}".into(),
                    get(&self.rejected_queue_full) as f64,
                ),
                (
                    "{reason=\"context_length_exceeded\"}".into(),
                    get(&self.rejected_context) as f64,
                ),
            ],
        );
        metric(
            "ds4_prefill_tokens_total",
            "counter",
            "Tokens prefilled.",
            &one(get(&self.prefill_tokens)),
        );
        metric(
            "ds4_prefill_seconds_total",
            "counter",
            "Time spent prefilling.",
            &[(String::new(), get(&self.prefill_micros) as f64 / 1e6)],
        );
        metric(
            "ds4_decode_tokens_total",
            "counter",
            "Tokens decoded (one forward each).",
            &one(get(&self.decode_tokens)),
        );
        metric(
            "ds4_decode_seconds_total",
            "counter",
            "Time spent decoding.",
            &[(String::new(), get(&self.decode_micros) as f64 / 1e6)],
        );
        let (prefill, decode) = self.last_rates.lock().map(|r| *r).unwrap_or((0.0, 0.0));
        metric(
            "ds4_last_prefill_tokens_per_second",
            "gauge",
            "Prefill rate of the last turn.",
            &[(String::new(), prefill)],
        );
        metric(
            "ds4_last_decode_tokens_per_second",
            "gauge",
            "Decode rate of the last turn.",
            &[(String::new(), decode)],
        );
        // 0 for a model without an MTP head (or with MTP turned off).
        metric(
            "ds4_mtp_draft_tokens_total",
            "counter",
            "MTP draft tokens proposed.",
            &one(get(&self.mtp_drafted)),
        );
        metric(
            "ds4_mtp_accepted_tokens_total",
            "counter",
            "MTP draft tokens accepted (acceptance = accepted / drafted).",
            &one(get(&self.mtp_accepted)),
        );
        out
    }
}
