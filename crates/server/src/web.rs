//! The chat page and dashboard: hand-written HTML, CSS and JavaScript under
//! `crates/server/assets/`, embedded in the binary (no CDN, no build step,
//! nothing fetched at run time but this server's own API). `/` opens the
//! chat, `/dashboard` the same page on its dashboard tab.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::state::SharedState;

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_CSS: &str = include_str!("../assets/app.css");
const APP_JS: &str = include_str!("../assets/app.js");
const ICON_SVG: &str = include_str!("../assets/icon.svg");

/// Every embedded asset: path, content type, bytes.
pub const ASSETS: [(&str, &str, &str); 4] = [
    ("/", "text/html; charset=utf-8", INDEX_HTML),
    ("/assets/app.css", "text/css; charset=utf-8", APP_CSS),
    ("/assets/app.js", "text/javascript; charset=utf-8", APP_JS),
    ("/assets/icon.svg", "image/svg+xml", ICON_SVG),
];

/// Bytes the page adds to the binary.
pub fn embedded_bytes() -> usize {
    ASSETS.iter().map(|(_, _, body)| body.len()).sum()
}

/// The page's paths (served without the API key: a browser navigation
/// cannot send one, and the page asks for the key itself).
pub fn is_page(path: &str) -> bool {
    path == "/dashboard" || ASSETS.iter().any(|(p, _, _)| *p == path)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Small and embedded: revalidate each load so an upgraded binary's page
    // is never mixed with a cached older script.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The page may talk only to this server and load only its own assets.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    response
}

/// The page's routes.
pub fn routes() -> Router<SharedState> {
    let page = || async { asset(ASSETS[0].1, INDEX_HTML) };
    Router::new()
        .route("/", get(page))
        .route("/dashboard", get(page))
        .route(
            "/assets/app.css",
            get(|| async { asset(ASSETS[1].1, APP_CSS) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset(ASSETS[2].1, APP_JS) }),
        )
        .route(
            "/assets/icon.svg",
            get(|| async { asset(ASSETS[3].1, ICON_SVG) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        for (path, _, _) in &ASSETS[1..] {
            assert!(INDEX_HTML.contains(path), "index.html links {path}");
        }
        for external in ["http://", "https://", "//cdn", "@import"] {
            assert!(!INDEX_HTML.contains(external), "index.html: {external}");
            assert!(!APP_CSS.contains(external), "app.css: {external}");
        }
    }
}
