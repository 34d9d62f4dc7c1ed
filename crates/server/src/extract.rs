//! `ApiJson<T>`: the body extractor every endpoint uses, so malformed input
//! gets one consistent, helpful error in the caller's API shape.
//!
//! Unknown fields are ignored (clients send many); a known field with a
//! wrong type is rejected with its path (`messages[2].content`), which serde
//! alone does not give, hence `serde_path_to_error`.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Flavor};
use crate::state::SharedState;
use crate::transport::BodyDeadline;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<SharedState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &SharedState) -> Result<Self, Self::Rejection> {
        let path = req.uri().path().to_string();
        let flavor = Flavor::for_path(&path);
        let parsed = read(req, state).await.and_then(|bytes| parse(&bytes));
        parsed.map(ApiJson).map_err(|e| {
            // The handler counts the requests it sees; this one never
            // reaches it.
            state
                .metrics
                .request(crate::metrics::endpoint_for_path(&path));
            e.with_flavor(flavor)
        })
    }
}

/// The whole body, within the body limit and before the transport's body
/// deadline (408 after it: a client that trickles its body does not hold a
/// connection and a buffer for long).
async fn read(req: Request, state: &SharedState) -> Result<Bytes, ApiError> {
    let deadline = req.extensions().get::<BodyDeadline>().copied();
    let body = Bytes::from_request(req, state);
    let read = match deadline {
        Some(BodyDeadline(at)) => match tokio::time::timeout_at(at, body).await {
            Ok(read) => read,
            Err(_) => {
                let secs = state.config.limits.body_timeout.as_secs();
                return Err(ApiError::body_timeout(secs));
            }
        },
        None => body.await,
    };
    read.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            // The limit itself is in the message axum gives.
            ApiError::too_large(&e.body_text())
        } else {
            ApiError::malformed(format!(
                "could not read the request body: {}",
                e.body_text()
            ))
        }
    })
}

/// Parse a JSON body, naming the offending field on a type error.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(ApiError::malformed(format!(
            "the request body is not valid UTF-8 (byte {})",
            e.valid_up_to()
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::malformed(format!("the request body is not valid JSON: {inner}"))
        } else if path == "." || path.starts_with('[') {
            ApiError::malformed(format!("the request body must be a JSON object: {inner}"))
        } else {
            ApiError::invalid(
                path.clone(),
                format!("{path}: {}", plain(&inner.to_string())),
            )
        }
    })?;
    de.end()
        .map_err(|e| ApiError::malformed(format!("trailing data after the JSON body: {e}")))?;
    Ok(value)
}

/// What each untagged request enum accepts, in words: serde's own message
/// ("data did not match any variant of untagged enum …") names a Rust type,
/// not what the client should send.
const UNTAGGED: &[(&str, &str)] = &[
    (
        "MessageContent",
        "a string or an array of content parts (objects with a \"type\")",
    ),
    (
        "InputContent",
        "a string or an array of content blocks (objects with a \"type\")",
    ),
    ("SystemPrompt", "a string or an array of text blocks"),
    ("ResponseInput", "a string or an array of input items"),
    ("StopField", "a string or an array of strings"),
    (
        "PromptInput",
        "a string, an array of token ids, or a one-element array of either",
    ),
];

/// serde's type-error message in plain words: untagged enums say what they
/// accept, "unknown variant" says "unknown value", Rust struct names become
/// "an object" (the field path is added by the caller).
fn plain(message: &str) -> String {
    const UNTAGGED_PREFIX: &str = "data did not match any variant of untagged enum ";
    if let Some(rest) = message.strip_prefix(UNTAGGED_PREFIX) {
        let name = rest.split_whitespace().next().unwrap_or_default();
        if let Some((_, accepts)) = UNTAGGED.iter().find(|(n, _)| *n == name) {
            return format!("expected {accepts}");
        }
        return "has the wrong shape".to_string();
    }
    let mut out = message.replace("unknown variant", "unknown value");
    if let Some(at) = out.find("expected struct ") {
        // "expected struct ChatMessage" → "expected an object"
        let end = out[at + 16..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(out.len(), |e| at + 16 + e);
        out.replace_range(at..end, "expected an object");
    }
    out.replace('`', "\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::chat::ChatCompletionRequest;

    #[test]
    fn type_errors_name_the_field_in_plain_words() {
        let cases = [
            (
                r#"{"messages": [{"role": "user", "content": 5}]}"#,
                "messages[0].content",
                "a string or an array of content parts",
            ),
            (
                r#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
                "messages[0].role",
                "unknown value \"wizard\"",
            ),
            (r#"{"messages": [5]}"#, "messages[0]", "expected an object"),
            (
                r#"{"messages": [], "stop": 3}"#,
                "stop",
                "a string or an array of strings",
            ),
        ];
        for (body, field, needle) in cases {
            let e = parse::<ChatCompletionRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
            assert!(e.message.starts_with(field), "{}", e.message);
            assert!(e.message.contains(needle), "{body}: {}", e.message);
            for jargon in ["untagged", "variant", "struct", "`"] {
                assert!(!e.message.contains(jargon), "{}", e.message);
            }
        }
    }
}
