//! The router and the listening server.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ds4_engine::Model;
use ds4_engine::backend::{BackendId, KernelSet};
use ds4_engine::families::LoadedModel;
use ds4_text::{ChatTemplate, TextProfile, Tokenizer};

use crate::config::ServerConfig;
use crate::error::{ApiError, Flavor};
use crate::lanes::CacheSettings;
use crate::metrics::Metrics;
use crate::queue::QueueLimits;
use crate::routes;
use crate::scheduler;
use crate::state::{AppState, SharedState};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("the model's chat template does not compile: {0}")]
    Template(#[from] ds4_text::TextError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("--mtp-depth: {0}")]
    Mtp(String),
    #[error("{0}")]
    Worker(String),
    #[error("{0}")]
    Cors(String),
}

/// Build the shared state and start the scheduler.
pub fn build_state(
    config: ServerConfig,
    model: LoadedModel,
    tokenizer: Tokenizer,
) -> Result<SharedState, ServeError> {
    let descriptor = model.descriptor();
    let backend = model.backend();
    let kv_cache = model.kv_type().name();
    let model_ctx = ds4_engine::with_model!(&model, m => m.context_length());
    let mtp = ds4_engine::with_model!(&model, m => m.mtp_contract());
    for d in [config.mtp_depth, config.mtp_depth_sampled]
        .into_iter()
        .flatten()
    {
        crate::params::mtp_depth(mtp, Some(d as u64)).map_err(|e| ServeError::Mtp(e.message))?;
    }
    let ctx = config.ctx.map_or(model_ctx, |c| c.min(model_ctx));
    // A bad --cors origin fails the start, not the first request.
    crate::guard::cors(&config.cors).map_err(ServeError::Cors)?;
    let template = ChatTemplate::for_tokenizer(&tokenizer)?;
    let template_has_tools = tokenizer
        .chat_template()
        .is_some_and(|t| t.contains("tools"));
    let tokenizer = Arc::new(tokenizer);
    let metrics = Arc::new(Metrics::default());
    // A vision-language checkpoint reads images; every other model keeps
    // refusing them.
    let vision = match &config.model_dir {
        Some(dir) => crate::vision::Vision::load(dir, descriptor.name, config.max_image_pixels)
            .map_err(ServeError::Worker)?
            .map(Arc::new),
        None => None,
    };
    let mut serving = crate::family::Serving::for_family(descriptor.name);
    serving.accepts_images = vision.is_some();
    let settings = scheduler::Settings {
        lanes: config.max_batch.max(1),
        batch_tokens: config.max_batch_tokens,
        prefill_chunk: config.prefill_chunk,
        cache: CacheSettings {
            bank_budget: config.bank_budget,
            boundary_every: config.boundary_every,
            checkpoints: config.checkpoints.clone(),
        },
        queue: queue_limits(&config, ctx),
    };
    let scheduler = scheduler::spawn(
        Arc::new(model),
        tokenizer.clone(),
        settings,
        metrics.clone(),
        vision.clone(),
    )
    .map_err(ServeError::Worker)?;
    Ok(Arc::new(AppState {
        profile: TextProfile::for_family(descriptor.name),
        serving,
        vision,
        tool_memory: crate::tool_memory::ToolMemory::default(),
        vocabulary: Default::default(),
        descriptor,
        backend: backend.to_string(),
        kernel_set: kernel_set_of(&backend).name(),
        kv_cache,
        ctx,
        mtp,
        template,
        template_has_tools,
        tokenizer,
        scheduler,
        metrics,
        created: crate::ids::unix_now(),
        config,
    }))
}

/// The queue's capacity: `--max-queue-tokens` (by default
/// [`crate::config::QUEUE_CONTEXTS`] contexts of `ctx` tokens) and the
/// `--max-queue` count, when set.
pub fn queue_limits(config: &ServerConfig, ctx: usize) -> QueueLimits {
    QueueLimits {
        max_tokens: config
            .max_queue_tokens
            .unwrap_or(crate::config::QUEUE_CONTEXTS.saturating_mul(ctx)),
        max_count: (config.max_queue != usize::MAX).then_some(config.max_queue),
    }
}

/// The kernel set a model on `backend` runs: the process's set
/// (`--kernels` / `DS4_KERNELS`, fixed before the load), which the CPU and
/// CUDA backends both name in their ids (`…-fast`).
pub fn kernel_set_of(backend: &BackendId) -> KernelSet {
    if backend.kernels.ends_with("-fast") {
        KernelSet::Fast
    } else {
        KernelSet::Reference
    }
}

pub fn router(state: SharedState) -> Router {
    let api = Router::new()
        .route("/v1/models", get(routes::info::list_models))
        .route("/v1/models/{id}", get(routes::info::get_model))
        .route("/v1/chat/completions", post(routes::chat::chat_completions))
        .route("/v1/completions", post(routes::completions::completions))
        .route("/v1/responses", post(routes::responses::responses))
        .route("/v1/messages", post(routes::messages::messages))
        .route("/v1/status", get(routes::status::status))
        .route(
            "/v1/messages/count_tokens",
            post(routes::messages::count_tokens),
        );
    // Layers run outside in: the last one added sees the request first.
    let mut app = Router::new()
        .route("/health", get(routes::info::health))
        .route("/metrics", get(routes::info::metrics))
        .route("/openapi.json", get(crate::openapi::openapi_json))
        .merge(api)
        .merge(crate::web::routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.config.body_limit))
        .layer(middleware::from_fn(large_bodies_off_runtime))
        .layer(middleware::from_fn(crate::guard::json_body))
        .layer(middleware::from_fn_with_state(state.clone(), count_unread))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::guard::require_key,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            crate::guard::allowed_host,
        ));
    // Checked when the state was built.
    if let Ok(Some(cors)) = crate::guard::cors(&state.config.cors) {
        app = app.layer(cors);
    }
    app.layer(middleware::from_fn_with_state(state.clone(), count_errors))
        .with_state(state)
}

async fn not_found(request: Request) -> ApiError {
    let path = request.uri().path().to_string();
    ApiError::not_found(format!("no route for {} {path}", request.method()))
        .with_flavor(Flavor::for_path(&path))
}

/// Bodies at least this large (or of unknown length) are handled on a
/// blocking thread.
const LARGE_BODY: u64 = 256 * 1024;

/// Parsing, rendering and tokenizing a large body takes CPU time that must
/// not stall the async runtime (four 7 MiB bodies once held `/health` for
/// 4 s): such a request's whole handler runs on a blocking thread. Small
/// ones stay on the runtime, where a thread hop would cost more than it
/// saves.
async fn large_bodies_off_runtime(request: Request, next: Next) -> Response {
    let large = request.method() == Method::POST
        && request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_none_or(|n| n >= LARGE_BODY);
    if !large {
        return next.run(request).await;
    }
    let runtime = tokio::runtime::Handle::current();
    match tokio::task::spawn_blocking(move || runtime.block_on(next.run(request))).await {
        Ok(response) => response,
        Err(e) => ApiError::internal(format!("the request handler failed: {e}")).into_response(),
    }
}

/// A request refused before its handler (wrong content type) still counts
/// as a request to its endpoint.
async fn count_unread(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    if response.status() == axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE {
        state
            .metrics
            .request(crate::metrics::endpoint_for_path(&path));
    }
    response
}

async fn count_errors(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    state.metrics.response(status.as_u16());
    if status.is_client_error() || status.is_server_error() {
        state.metrics.error(status.as_u16());
    }
    response
}

/// A server listening on its socket.
pub struct Running {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Running {
    /// Shut down as `serve` does on a signal: stop accepting, give running
    /// requests the grace period, cancel what is left, then save the live
    /// session (with checkpoints on) and stop the scheduler.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Bind and start serving in the background (tests use port 0).
pub async fn start(state: SharedState) -> Result<Running, ServeError> {
    let listener = tokio::net::TcpListener::bind(state.config.addr).await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(listener, state, async {
        let _ = stopped.await;
    }));
    Ok(Running { addr, task, stop })
}

/// Serve until Ctrl+C or SIGTERM; then give running requests
/// `--shutdown-grace`, cancel the rest at a consistent point and save the
/// live session. A second signal exits at once.
pub async fn serve(state: SharedState) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(state.config.addr).await?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    // `--max-batch` is named only when above 1: the line is otherwise as
    // it always was.
    let batch = match state.config.max_batch {
        0 | 1 => String::new(),
        n => format!(", max batch {n}"),
    };
    eprintln!(
        "ds4server listening on http://{addr} (model {}, backend {}, {} kernels{batch})",
        state.config.model_id, state.backend, state.kernel_set
    );
    let grace = state.config.limits.shutdown_grace;
    run(listener, state, async move {
        crate::transport::signal::next().await;
        eprintln!(
            "ds4server: shutting down (running requests get {:.1} s; a second signal exits at once)",
            grace.as_secs_f64()
        );
        tokio::spawn(async {
            crate::transport::signal::next().await;
            eprintln!("ds4server: second signal, exiting without saving");
            std::process::exit(130);
        });
    })
    .await;
    Ok(())
}

/// Serve until `stop`, drain within the grace period, then stop the turns
/// still running and save the live session.
async fn run(
    listener: tokio::net::TcpListener,
    state: SharedState,
    stop: impl std::future::Future<Output = ()>,
) {
    let app = router(state.clone());
    let drained = crate::transport::run(
        listener,
        app,
        state.config.limits,
        state.metrics.clone(),
        stop,
    )
    .await;
    // Whatever still runs on a lane is cancelled at its next chunk or
    // token; queued jobs are skipped. Then the session is saved.
    state.scheduler.stop_turns();
    state.scheduler.shutdown().await;
    if let crate::transport::Drained::Dropped(n) = drained {
        eprintln!("ds4server: the grace period ran out; {n} connection(s) dropped");
    }
}
