//! The OpenAPI document, generated from the handlers' `#[utoipa::path]`
//! annotations and the request/response types' schemas, and its route
//! `GET /openapi.json`.

use axum::Json;
use utoipa::OpenApi;

use crate::routes;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "ds4server",
        description = "OpenAI- and Anthropic-compatible inference API. Unknown request fields are ignored; known fields with wrong types or out-of-range values are rejected with a message naming the field."
    ),
    paths(
        routes::info::health,
        routes::info::list_models,
        routes::info::get_model,
        routes::info::metrics,
        routes::status::status,
        openapi_json,
        routes::chat::chat_completions,
        routes::completions::completions,
        routes::responses::responses,
        routes::messages::messages,
        routes::messages::count_tokens,
    )
)]
pub struct ApiDoc;

#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "This API's OpenAPI 3.1 document")))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
