//! The router and the listening server.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ds4_engine::Model;
use ds4_engine::families::LoadedModel;
use ds4_text::{ChatTemplate, TextProfile, Tokenizer};
use tower_http::cors::CorsLayer;

use crate::config::ServerConfig;
use crate::error::{ApiError, Flavor};
use crate::metrics::Metrics;
use crate::routes;
use crate::state::{AppState, SharedState};
use crate::worker;

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
}

/// Build the shared state and start the engine worker.
pub fn build_state(
    config: ServerConfig,
    model: LoadedModel,
    tokenizer: Tokenizer,
) -> Result<SharedState, ServeError> {
    let descriptor = model.descriptor();
    let model_ctx = ds4_engine::with_model!(&model, m => m.context_length());
    let mtp = ds4_engine::with_model!(&model, m => m.mtp_contract());
    if let Some(d) = config.mtp_depth {
        crate::params::mtp_depth(mtp, Some(d as u64)).map_err(|e| ServeError::Mtp(e.message))?;
    }
    let ctx = config.ctx.map_or(model_ctx, |c| c.min(model_ctx));
    let template = ChatTemplate::for_tokenizer(&tokenizer)?;
    let template_has_tools = tokenizer
        .chat_template()
        .is_some_and(|t| t.contains("tools"));
    let tokenizer = Arc::new(tokenizer);
    let metrics = Arc::new(Metrics::default());
    let worker = worker::spawn(
        Arc::new(model),
        tokenizer.clone(),
        config.max_queue,
        config.prefill_chunk,
        worker::CacheSettings {
            bank_budget: config.bank_budget,
            boundary_every: config.boundary_every,
            checkpoints: config.checkpoints.clone(),
        },
        metrics.clone(),
    )
    .map_err(ServeError::Worker)?;
    Ok(Arc::new(AppState {
        profile: TextProfile::for_family(descriptor.name),
        serving: crate::family::Serving::for_family(descriptor.name),
        tool_memory: crate::tool_memory::ToolMemory::default(),
        descriptor,
        ctx,
        mtp,
        template,
        template_has_tools,
        tokenizer,
        worker,
        metrics,
        created: crate::ids::unix_now(),
        config,
    }))
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
        )
        .route_layer(middleware::from_fn_with_state(state.clone(), require_key));
    let mut app = Router::new()
        .route("/health", get(routes::info::health))
        .route("/metrics", get(routes::info::metrics))
        .route("/openapi.json", get(crate::openapi::openapi_json))
        .merge(api)
        .merge(crate::web::routes())
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.config.body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), count_errors));
    if state.config.cors {
        app = app.layer(CorsLayer::very_permissive());
    }
    app.with_state(state)
}

async fn not_found(request: Request) -> ApiError {
    let path = request.uri().path().to_string();
    ApiError::not_found(format!("no route for {} {path}", request.method()))
        .with_flavor(Flavor::for_path(&path))
}

/// With `--api-key`, `/v1/*` needs `Authorization: Bearer KEY` or
/// `x-api-key: KEY` (the OpenAI and Anthropic conventions).
async fn require_key(State(state): State<SharedState>, request: Request, next: Next) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(request).await;
    };
    if presented_key(request.headers())
        .is_some_and(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
    {
        return next.run(request).await;
    }
    ApiError::unauthorized()
        .with_flavor(Flavor::for_path(request.uri().path()))
        .into_response()
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(v.trim());
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Compare without an early exit, so timing does not reveal the key.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    stop: tokio::sync::oneshot::Sender<()>,
    state: SharedState,
}

impl Running {
    /// Shut down as `serve` does on a signal: stop accepting, let running
    /// requests finish, then save the live session (with checkpoints on)
    /// and stop the engine worker.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        let served = self
            .task
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        self.state.worker.shutdown().await;
        served
    }
}

/// Bind and start serving in the background (tests use port 0).
pub async fn start(state: SharedState) -> Result<Running, ServeError> {
    let listener = tokio::net::TcpListener::bind(state.config.addr).await?;
    let addr = listener.local_addr()?;
    let app = router(state.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Running {
        addr,
        task,
        stop,
        state,
    })
}

/// Serve until Ctrl+C or SIGTERM; then let running requests finish and save
/// the live session (clean shutdown).
pub async fn serve(state: SharedState) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(state.config.addr).await?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    eprintln!(
        "ds4server listening on http://{addr} (model {})",
        state.config.model_id
    );
    axum::serve(listener, router(state.clone()))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    eprintln!("ds4server: shutting down");
    state.worker.shutdown().await;
    Ok(())
}

/// Ctrl+C, or SIGTERM on Unix (what `kill` and service managers send).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
