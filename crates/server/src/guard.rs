//! What keeps a web page from driving this server: the checks every request
//! passes before a handler sees it.
//!
//! A page on another site can make the browser send a "simple" request
//! (`text/plain` POST) to `http://127.0.0.1:8000` without a CORS preflight,
//! and DNS rebinding can point the attacker's own name at the loopback
//! address. So:
//!
//! - POST bodies must be `application/json` (a simple request cannot set
//!   it, so a cross-site page needs a preflight, which `--cors` decides);
//! - without an API key, the `Host` header must name this machine: a
//!   loopback name, an IP literal (rebinding needs the attacker's domain
//!   name in `Host`), or an `--allowed-host`;
//! - with `--api-key`, every route but `/health` and the embedded page's
//!   static assets needs the key (a browser navigation cannot send a
//!   header; the assets hold no data: the page asks for the key itself),
//!   sent as `x-api-key` or `Authorization: Bearer`; either matching is
//!   enough, and the comparison takes a time that depends only on the
//!   configured key's length;
//! - CORS headers only for the `--cors` origins, never a reflected origin.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use crate::error::{ApiError, Flavor};
use crate::state::SharedState;

/// Host names accepted without `--allowed-host` (ports are ignored).
const LOOPBACK_NAMES: [&str; 2] = ["localhost", "localhost.localdomain"];

/// The routes that take a JSON body (a POST elsewhere gets the router's
/// 404 or 405, not a content-type complaint).
const JSON_ROUTES: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
];

/// POST requests must declare a JSON body.
pub async fn json_body(request: Request, next: Next) -> Response {
    if request.method() == Method::POST
        && JSON_ROUTES.contains(&request.uri().path())
        && !is_json(request.headers())
    {
        let got = request
            .headers()
            .get(header::CONTENT_TYPE)
            .map_or("none".to_string(), |v| {
                format!("{:?}", String::from_utf8_lossy(v.as_bytes()))
            });
        return ApiError::unsupported_media_type(format!(
            "the request body must be JSON: send `Content-Type: application/json` (got {got})"
        ))
        .with_flavor(Flavor::for_path(request.uri().path()))
        .into_response();
    }
    next.run(request).await
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Without an API key, only requests addressed to this machine by a name it
/// knows get through (DNS rebinding).
pub async fn allowed_host(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    if state.config.api_key.is_some() || host_allowed(&request, &state.config.allowed_hosts) {
        return next.run(request).await;
    }
    let host = request_host(&request).unwrap_or_default();
    ApiError::bad_host(&host)
        .with_flavor(Flavor::for_path(request.uri().path()))
        .into_response()
}

/// The host the request names: the absolute URI's authority, else `Host`.
fn request_host(request: &Request) -> Option<String> {
    if let Some(host) = request.uri().host() {
        return Some(host.to_string());
    }
    let value = request.headers().get(header::HOST)?.to_str().ok()?;
    let authority: axum::http::uri::Authority = value.parse().ok()?;
    Some(authority.host().to_string())
}

fn host_allowed(request: &Request, extra: &[String]) -> bool {
    let Some(host) = request_host(request) else {
        return false;
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || LOOPBACK_NAMES.contains(&host.as_str())
        || host.ends_with(".localhost")
        || extra
            .iter()
            .any(|h| h == "*" || h.trim_end_matches('.').eq_ignore_ascii_case(&host))
}

/// Routes open without the key: the health probe and the page's assets.
fn open_route(request: &Request) -> bool {
    let path = request.uri().path();
    path == "/health"
        || (matches!(*request.method(), Method::GET | Method::HEAD) && crate::web::is_page(path))
}

/// With `--api-key`, everything else needs it.
pub async fn require_key(
    State(state): State<SharedState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(request).await;
    };
    // CORS preflights never carry credentials; the CORS layer answers them.
    if open_route(&request) || request.method() == Method::OPTIONS {
        return next.run(request).await;
    }
    if key_matches(request.headers(), key) {
        return next.run(request).await;
    }
    ApiError::unauthorized()
        .with_flavor(Flavor::for_path(request.uri().path()))
        .into_response()
}

/// Either header may carry the key; each is compared in full (no trimming:
/// a key with a stray space is a different key).
pub fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    let x_api_key = headers
        .get("x-api-key")
        .is_some_and(|v| constant_time_eq(v.as_bytes(), key.as_bytes()));
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|v| constant_time_eq(v, key.as_bytes()));
    // Both are compared whatever the first gave (`|`, not `||`).
    x_api_key | bearer
}

/// Compare `presented` with `key` in a time that depends only on the key's
/// length: every key byte is compared, a shorter or longer presented value
/// included, with no early exit.
pub fn constant_time_eq(presented: &[u8], key: &[u8]) -> bool {
    let mut diff = u8::from(presented.len() != key.len());
    for (i, k) in key.iter().enumerate() {
        let p = presented.get(i).copied().unwrap_or(!k);
        diff |= std::hint::black_box(p ^ k);
    }
    diff == 0
}

/// The CORS layer for `--cors` origins (`None` without the flag).
pub fn cors(origins: &[String]) -> Result<Option<CorsLayer>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o.trim_end_matches('/'))
                    .map_err(|_| format!("--cors {o:?} is not a valid origin"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    // No credentials: the API authenticates with a header, not cookies.
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::HEAD, Method::OPTIONS])
            .allow_headers(Any)
            .expose_headers([header::RETRY_AFTER, HeaderName::from_static("x-request-id")])
            .max_age(std::time::Duration::from_secs(600)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_compares_in_full() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"secrets", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(!constant_time_eq(b" secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
    }

    #[test]
    fn either_header_may_carry_the_key() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static("wrong"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert!(key_matches(&h, "k1"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer k1 "),
        );
        assert!(!key_matches(&h, "k1"), "no trimming");
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        assert!(key_matches(&h, "k1"));
    }

    fn host(h: &str) -> Request {
        Request::builder()
            .uri("/v1/models")
            .header(header::HOST, h)
            .body(axum::body::Body::empty())
            .unwrap()
    }

    #[test]
    fn loopback_names_and_ip_literals_pass() {
        for h in [
            "localhost:8000",
            "127.0.0.1:8000",
            "[::1]:8000",
            "10.0.0.2",
            "LOCALHOST",
            "app.localhost",
        ] {
            assert!(host_allowed(&host(h), &[]), "{h}");
        }
        for h in ["evil.example", "localhost.evil.example", "127.0.0.1.nip.io"] {
            assert!(!host_allowed(&host(h), &[]), "{h}");
        }
        assert!(host_allowed(&host("box.lan:8000"), &["box.lan".into()]));
        assert!(host_allowed(&host("anything"), &["*".into()]));
    }

    #[test]
    fn json_content_types() {
        let mut h = HeaderMap::new();
        assert!(!is_json(&h));
        for (v, ok) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("multipart/form-data; boundary=x", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            assert_eq!(is_json(&h), ok, "{v}");
        }
    }
}
