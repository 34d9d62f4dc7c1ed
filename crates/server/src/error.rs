//! API errors, rendered in the shape of the API that was called.
//!
//! OpenAI: `{"error": {"message", "type", "param", "code"}}`.
//! Anthropic: `{"type": "error", "error": {"type", "message"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// Which API's error shape to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

impl Flavor {
    /// Anthropic's endpoints live under `/v1/messages`; everything else
    /// speaks OpenAI.
    pub fn for_path(path: &str) -> Self {
        if path.starts_with("/v1/messages") {
            Flavor::Anthropic
        } else {
            Flavor::OpenAi
        }
    }
}

/// What went wrong, in terms a client can act on.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// Machine-readable code (`context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (503).
    pub retry_after: Option<u64>,
    pub flavor: Flavor,
    /// Set for context overflow: the message is worded per API (see
    /// [`Overflow::message`]) when the flavor is known.
    pub overflow: Option<Overflow>,
}

/// A prompt that does not fit the context, kept as numbers so that the
/// message can be worded as each API words it: clients (litellm, aider,
/// Claude Code) recognise overflow by those words, not by a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    /// Prompt tokens (a lower bound when `at_least`).
    pub tokens: usize,
    /// The context limit in tokens.
    pub limit: usize,
    /// `tokens` is a lower bound (counting stopped early).
    pub at_least: bool,
}

impl Overflow {
    /// The one place overflow is worded. OpenAI's sentence is what litellm
    /// and aider match ("This model's maximum context length is"),
    /// Anthropic's is what Claude Code and litellm parse ("prompt is too
    /// long: N tokens > M maximum").
    pub fn message(&self, flavor: Flavor) -> String {
        let (tokens, limit) = (self.tokens, self.limit);
        let at_least = if self.at_least { "at least " } else { "" };
        match flavor {
            Flavor::OpenAi => format!(
                "This model's maximum context length is {limit} tokens. However, your messages \
                 resulted in {at_least}{tokens} tokens. Please reduce the length of the messages \
                 (at least one token must be left for the reply)."
            ),
            // Anthropic's form, always with ">" (Claude Code's parser reads
            // "N tokens > M maximum"): a prompt exactly at the limit leaves
            // no room for the reply, so it is refused too, and a lower bound
            // is still a size the prompt has at least.
            Flavor::Anthropic => format!("prompt is too long: {tokens} tokens > {limit} maximum"),
        }
    }
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            flavor: Flavor::OpenAi,
            overflow: None,
        }
    }

    /// A field with a wrong type or an out-of-range value.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, message);
        e.param = Some(param.into());
        e.code = Some("invalid_value");
        e
    }

    /// A request that is not well-formed at all (not JSON, not UTF-8).
    pub fn malformed(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, message);
        e.code = Some("invalid_json");
        e
    }

    /// The prompt does not fit: worded per API when the flavor is set
    /// ([`Overflow::message`]), with both numbers and the code
    /// `context_length_exceeded`.
    pub fn context_exceeded(prompt: usize, limit: usize) -> Self {
        Self::overflow(Overflow {
            tokens: prompt,
            limit,
            at_least: false,
        })
    }

    /// The prompt was still being tokenized when it passed the context:
    /// `prompt` is a lower bound (tokenizing the rest would only cost time
    /// and memory).
    pub fn context_exceeded_at_least(prompt: usize, limit: usize) -> Self {
        Self::overflow(Overflow {
            tokens: prompt,
            limit,
            at_least: true,
        })
    }

    /// Context overflow from its numbers (a lower bound too).
    pub fn overflow(o: Overflow) -> Self {
        let mut e = Self::new(StatusCode::BAD_REQUEST, o.message(Flavor::OpenAi));
        e.param = Some("messages".into());
        e.code = Some("context_length_exceeded");
        e.overflow = Some(o);
        e
    }

    /// An image (or document) part: the served models read text only.
    /// Refused on every API alike rather than dropped, so the model never
    /// answers about a picture it did not see.
    pub fn image_unsupported(field: impl Into<String>) -> Self {
        let field = field.into();
        let message = format!(
            "{field}: images are not supported by this model (it reads text only); send the \
             request without image parts"
        );
        let mut e = Self::invalid(field, message);
        e.code = Some("unsupported_content");
        e
    }

    pub fn unknown_model(model: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            format!("the model {model:?} does not exist; this server serves {served:?}"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// The queue's capacity is used up: `waiting` requests reserve
    /// `reserved_tokens` of its token budget (`crate::queue`).
    pub fn queue_full(waiting: usize, reserved_tokens: usize) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server is busy ({waiting} requests waiting, {reserved_tokens} tokens \
                 reserved); retry shortly"
            ),
        );
        e.code = Some("queue_full");
        e.retry_after = Some(1);
        e
    }

    /// The server is stopping: no new turn starts.
    pub fn shutting_down() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down; retry on another instance or later",
        );
        e.code = Some("shutting_down");
        e.retry_after = Some(1);
        e
    }

    /// `detail` says which limit (the body reader knows it, we do not).
    pub fn too_large(detail: &str) -> Self {
        let mut e = Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is too large: {detail}"),
        );
        e.code = Some("request_too_large");
        e
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::NOT_FOUND, what);
        e.code = Some("not_found");
        e
    }

    /// A POST body that does not say it is JSON.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message);
        e.param = Some("Content-Type".into());
        e.code = Some("unsupported_media_type");
        e
    }

    /// A `Host` this server does not answer to without an API key.
    pub fn bad_host(host: &str) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            format!(
                "this server does not answer to the host {host:?}: use localhost or an IP \
                 address, or start it with --allowed-host {host} (or --api-key)"
            ),
        );
        e.param = Some("Host".into());
        e.code = Some("host_not_allowed");
        e
    }

    /// The body did not arrive in time.
    pub fn body_timeout(secs: u64) -> Self {
        let mut e = Self::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {secs} s"),
        );
        e.code = Some("request_timeout");
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn with_flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        if let Some(o) = self.overflow {
            self.message = o.message(flavor);
        }
        self
    }

    /// The OpenAI `type` / Anthropic `error.type` for this error.
    fn kind(&self) -> &'static str {
        let anthropic = self.flavor == Flavor::Anthropic;
        match (self.status, anthropic) {
            (StatusCode::UNAUTHORIZED, false) => "invalid_request_error",
            (StatusCode::UNAUTHORIZED, true) => "authentication_error",
            (StatusCode::NOT_FOUND, true) => "not_found_error",
            (StatusCode::PAYLOAD_TOO_LARGE, true) => "request_too_large",
            (StatusCode::SERVICE_UNAVAILABLE, true) => "overloaded_error",
            (StatusCode::SERVICE_UNAVAILABLE, false) => "server_error",
            (s, true) if s.is_server_error() => "api_error",
            (s, false) if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body (also the payload of an SSE error event).
    pub fn body(&self) -> Value {
        match self.flavor {
            Flavor::OpenAi => json!({
                "error": {
                    "message": self.message,
                    "type": self.kind(),
                    "param": self.param,
                    "code": self.code,
                }
            }),
            Flavor::Anthropic => json!({
                "type": "error",
                "error": { "type": self.kind(), "message": self.message },
            }),
        }
    }
}

/// The `warnings` entry for a declared tool that is not a function the model
/// can call (built-in or server tools: `web_search`, `local_shell`, ...):
/// every API leaves such tools out and says so, in these words.
pub fn tool_not_offered(field: &str, kind: &str, name: &str) -> String {
    let name = if name.is_empty() {
        String::new()
    } else {
        format!(" {name:?}")
    };
    format!(
        "{field} (type {kind:?}{name}) was not offered to the model: this server runs only \
         function tools, which the client executes"
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&secs.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}
