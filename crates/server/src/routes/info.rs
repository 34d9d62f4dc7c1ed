//! `GET /health`, `/v1/models`, `/v1/models/{id}`, `/metrics` (`/openapi.json`
//! is served by [`crate::openapi`], which owns the document).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::ApiError;
use crate::state::{AppState, SharedState};
use crate::types::common::{Model, ModelList};

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    pub model: String,
    pub family: &'static str,
    pub context_length: usize,
    /// Requests waiting for a lane.
    pub queue_depth: usize,
}

#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(state): State<SharedState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        model: state.config.model_id.clone(),
        family: state.descriptor.name,
        context_length: state.ctx,
        queue_depth: state.metrics.waiting(),
    })
}

fn model(state: &AppState, id: &str) -> Model {
    Model {
        id: id.to_string(),
        object: "model",
        created: state.created,
        owned_by: "ds4server",
        context_length: state.ctx,
        family: state.descriptor.name,
        backend: state.backend.clone(),
        kernel_set: state.kernel_set,
        kv_cache: state.kv_cache,
    }
}

/// The served model under its id, then under each `--model-alias` (all
/// the same model: clients that pick from this list find their name).
#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
pub async fn list_models(State(state): State<SharedState>) -> Json<ModelList> {
    let ids = std::iter::once(&state.config.model_id).chain(&state.config.model_aliases);
    Json(ModelList {
        object: "list",
        data: ids.map(|id| model(&state, id)).collect(),
    })
}

#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    params(("id" = String, Path, description = "Model id")),
    responses((status = 200, body = Model), (status = 404, description = "Unknown model (only with --strict-model-names)"))
)]
pub async fn get_model(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<Model>, ApiError> {
    state.check_model(Some(&id))?;
    // A listed name is itself; any other name (accepted unless
    // `--strict-model-names`) is served by the loaded model, named as such.
    let id = if state.is_listed_model(&id) {
        id
    } else {
        state.config.model_id.clone()
    };
    Ok(Json(model(&state, &id)))
}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<SharedState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}
