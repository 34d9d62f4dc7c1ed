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
    /// Requests waiting behind the running one.
    pub queue_depth: usize,
}

#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health(State(state): State<SharedState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        model: state.config.model_id.clone(),
        family: state.descriptor.name,
        context_length: state.ctx,
        queue_depth: state.worker.depth(),
    })
}

fn model(state: &AppState) -> Model {
    Model {
        id: state.config.model_id.clone(),
        object: "model",
        created: state.created,
        owned_by: "ds4server",
        context_length: state.ctx,
        family: state.descriptor.name,
    }
}

#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList)))]
pub async fn list_models(State(state): State<SharedState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![model(&state)],
    })
}

#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    params(("id" = String, Path, description = "Model id")),
    responses((status = 200, body = Model), (status = 404, description = "Unknown model"))
)]
pub async fn get_model(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<Model>, ApiError> {
    state.check_model(Some(&id))?;
    Ok(Json(model(&state)))
}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(state): State<SharedState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(state.worker.depth()),
    )
        .into_response()
}
