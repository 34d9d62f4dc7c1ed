//! The OpenAPI document, generated from the handlers' `#[utoipa::path]`
//! annotations and the request/response types' schemas, and its route
//! `GET /openapi.json`.
//!
//! The annotations describe what each handler returns; the layers around
//! the handlers (`crate::guard`, `crate::transport`, the body limit) answer
//! some requests before any handler runs. [`document`] adds those answers
//! to every operation they apply to, with the error shape of the API the
//! path belongs to, and describes the SSE form of the streaming operations,
//! so that the document lists every status an operation can return
//! (checked by schemathesis in `.ci/run`).

use axum::Json;
use axum::extract::State;
use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use crate::routes;
use crate::state::SharedState;

mod rules;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "ds4server",
        description = "OpenAI- and Anthropic-compatible inference API. Unknown request fields are ignored; known fields with wrong types or out-of-range values are rejected with a message naming the field. POST bodies must be `application/json`. Without `--api-key`, the `Host` header must be a loopback name, an IP address or an `--allowed-host`; with it, every route but `/health` and the embedded page needs the key (`Authorization: Bearer KEY` or `x-api-key: KEY`)."
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
pub async fn openapi_json(State(state): State<SharedState>) -> Json<Value> {
    let mut doc = document();
    // `mtp_depth` above the model's maximum draft depth is refused (0 for a
    // model without an MTP head): this server's bound, in its document.
    let max_depth = state.mtp.map_or(0, |c| c.max_depth);
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        for schema in schemas.values_mut() {
            if let Some(depth) = schema.pointer_mut("/properties/mtp_depth") {
                depth["maximum"] = json!(max_depth);
            }
        }
        // Anthropic `image` blocks are read only by a model that takes
        // images; every other model refuses them (`Serving::accepts_images`).
        if state.serving.accepts_images {
            rules::accept_image_blocks(schemas);
        }
        rules::token_id_bound(schemas, state.tokenizer.vocab_size());
    }
    Json(doc)
}

/// POST operations that stream SSE when the body says `"stream": true`.
const STREAMING: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];

/// POST operations that queue a turn with the scheduler.
const GENERATING: [&str; 4] = STREAMING;

/// The generated document with the layers' answers added.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_else(|_| json!({}));
    add_error_schemas(&mut doc);
    rules::apply(&mut doc);
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let Some(op) = op.as_object_mut() else {
                continue;
            };
            describe_operation(path, method, op);
        }
    }
    doc
}

fn add_error_schemas(doc: &mut Value) {
    let schemas = doc
        .as_object_mut()
        .map(|d| d.entry("components").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
        .map(|c| c.entry("schemas").or_insert_with(|| json!({})));
    let Some(Value::Object(schemas)) = schemas else {
        return;
    };
    schemas.insert(
        "OpenAiError".into(),
        json!({
            "type": "object",
            "description": "An error in the OpenAI shape.",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type", "param", "code"],
                    "properties": {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"], "description": "The request field at fault."},
                        "code": {"type": ["string", "null"]}
                    }
                }
            }
        }),
    );
    schemas.insert(
        "AnthropicError".into(),
        json!({
            "type": "object",
            "description": "An error in the Anthropic shape.",
            "required": ["type", "error"],
            "properties": {
                "type": {"const": "error"},
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {
                        "type": {"type": "string"},
                        "message": {"type": "string"}
                    }
                }
            }
        }),
    );
}

/// The statuses the layers and the shared request code can answer on this
/// operation, with what each means.
fn layer_statuses(path: &str, method: &str) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![(
        "400",
        "Invalid request (the message names the field), or a `Host` this server does not answer to",
    )];
    if path != "/health" {
        out.push((
            "401",
            "`--api-key` is set and the request carries no valid key",
        ));
    }
    if method == "post" {
        out.push((
            "404",
            "The request names a model this server does not serve",
        ));
        out.push((
            "408",
            "The request body did not arrive within `--body-timeout`",
        ));
        out.push(("413", "The request body is larger than `--body-limit`"));
        out.push(("415", "The request body is not declared `application/json`"));
        out.push(("500", "Tokenizing or rendering the prompt failed"));
    }
    if GENERATING.contains(&path) {
        out.push((
            "503",
            "The queue is full (its token budget `--max-queue-tokens`, or `--max-queue` requests), or the server is shutting down; retry after `Retry-After` seconds",
        ));
    }
    out
}

fn describe_operation(path: &str, method: &str, op: &mut Map<String, Value>) {
    let schema = if path.starts_with("/v1/messages") {
        "#/components/schemas/AnthropicError"
    } else {
        "#/components/schemas/OpenAiError"
    };
    let error_content = json!({"application/json": {"schema": {"$ref": schema}}});
    let responses = op
        .entry("responses")
        .or_insert_with(|| json!({}))
        .as_object_mut();
    let Some(responses) = responses else {
        return;
    };
    for (status, description) in layer_statuses(path, method) {
        let entry = responses
            .entry(status)
            .or_insert_with(|| json!({"description": description}));
        if let Some(r) = entry.as_object_mut() {
            r.entry("content").or_insert_with(|| error_content.clone());
        }
    }
    // Annotated error statuses without a body schema get the error shape.
    for (status, response) in responses.iter_mut() {
        if (status.starts_with('4') || status.starts_with('5'))
            && let Some(r) = response.as_object_mut()
        {
            r.entry("content").or_insert_with(|| error_content.clone());
        }
    }
    if method == "post"
        && STREAMING.contains(&path)
        && let Some(ok) = responses.get_mut("200").and_then(Value::as_object_mut)
    {
        let content = ok.entry("content").or_insert_with(|| json!({}));
        if let Some(c) = content.as_object_mut() {
            c.insert(
                "text/event-stream".into(),
                // One schema per event, as SSE-aware tools (schemathesis)
                // parse the stream: the event's fields, `data` as text.
                json!({
                    "schema": {
                        "type": "object",
                        "description": "Server-sent events (`stream: true`): each event's `data` is one JSON object of this API's stream (OpenAI: chunks, then `data: [DONE]`; Anthropic and Responses: named events, `event` naming each). An error after the headers went out is an `error` event in the API's error shape. Comment lines (`: keep-alive`) keep idle connections open.",
                        "required": ["data"],
                        "properties": {
                            "data": {"type": "string"},
                            "event": {"type": "string"},
                            "id": {"type": "string"},
                            "retry": {"type": "integer", "minimum": 0}
                        }
                    }
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_lists_the_layers_statuses_with_a_shape() {
        let doc = document();
        let paths = doc["paths"].as_object().unwrap();
        for (path, item) in paths {
            for (method, op) in item.as_object().unwrap() {
                for (status, _) in layer_statuses(path, method) {
                    let r = &op["responses"][status];
                    assert!(
                        r["content"]["application/json"]["schema"]["$ref"].is_string(),
                        "{method} {path} {status}: {r}"
                    );
                }
            }
        }
        let chat = &doc["paths"]["/v1/chat/completions"]["post"]["responses"];
        assert!(chat["200"]["content"]["text/event-stream"].is_object());
        assert!(chat["503"].is_object());
        let messages = &doc["paths"]["/v1/messages"]["post"]["responses"]["400"];
        assert_eq!(
            messages["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/AnthropicError"
        );
    }
}
