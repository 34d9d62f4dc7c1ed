//! The embedded page: `/` and `/dashboard` serve it with the right content
//! types, everything it loads is served by this server with its own type,
//! and `/v1/status` (what the dashboard reads) reports a turn and the
//! session cache after it.

mod common;

use common::{start, start_with, user};
use serde_json::json;

/// `src` and `href` attribute values in an HTML document.
fn references(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(attr) {
            rest = &rest[i + attr.len()..];
            let end = rest.find('"').expect("closed attribute");
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_page_and_dashboard_are_embedded_and_same_origin() {
    let s = start().await;
    let mut pages = Vec::new();
    for path in ["/", "/dashboard"] {
        let r = s.client.get(s.url(path)).send().await.expect("GET");
        assert_eq!(r.status(), 200, "{path}");
        let headers = r.headers().clone();
        assert_eq!(
            headers["content-type"], "text/html; charset=utf-8",
            "{path}"
        );
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'self'"), "{csp}");
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        let body = r.text().await.expect("body");
        assert!(body.starts_with("<!doctype html>"), "{path}");
        pages.push(body);
    }
    assert_eq!(pages[0], pages[1], "one page, two tabs");

    let refs = references(&pages[0]);
    assert!(refs.len() >= 5, "{refs:?}");
    let mut loaded = 0;
    for r in &refs {
        // Same origin: a path on this server, never a scheme or a host.
        assert!(
            r.starts_with('/') && !r.starts_with("//"),
            "the page references {r}, not a path on this server"
        );
        if !r.starts_with("/assets/") {
            continue; // the tab links, checked above
        }
        let resp = s.client.get(s.url(r)).send().await.expect("GET asset");
        assert_eq!(resp.status(), 200, "{r}");
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        let want = match r.rsplit('.').next() {
            Some("css") => "text/css; charset=utf-8",
            Some("js") => "text/javascript; charset=utf-8",
            Some("svg") => "image/svg+xml",
            other => panic!("unexpected asset type {other:?}"),
        };
        assert_eq!(ct, want, "{r}");
        let body = resp.text().await.expect("asset body");
        assert!(!body.is_empty(), "{r}");
        if r.ends_with(".js") {
            // The script talks only to this server: relative API paths, no
            // absolute URL but the SVG namespace.
            assert!(body.contains("\"/v1/chat/completions\""));
            assert!(body.contains("\"/v1/status\""));
            for (i, _) in body.match_indices("http") {
                let tail = &body[i..];
                assert!(
                    tail.starts_with("http://www.w3.org/2000/svg")
                        || tail.starts_with("https?:")
                        || !tail.starts_with("http://") && !tail.starts_with("https://"),
                    "the script names an absolute URL: {}",
                    &tail[..tail.len().min(60)]
                );
            }
        }
        loaded += 1;
    }
    assert_eq!(loaded, 3, "css, js and the icon: {refs:?}");
    let total: usize = ds4_server::embedded_bytes();
    assert!(total > 10_000 && total < 200_000, "{total} bytes embedded");

    // An unknown path is still a JSON 404, not the page.
    let (status, body) = s.get("/nope").await;
    assert_eq!(status, 404, "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_status_reports_the_model_a_turn_and_the_cache() {
    let s = start().await;
    let (status, before) = s.get("/v1/status").await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(before["model"], common::MODEL_ID);
    assert_eq!(before["sampling_law"], "nucleus");
    let (_, models) = s.get("/v1/models").await;
    assert_eq!(before["backend"], models["data"][0]["backend"]);
    assert_eq!(before["kernel_set"], models["data"][0]["kernel_set"]);
    assert_eq!(before["kv_cache"], models["data"][0]["kv_cache"]);
    assert!(["f32", "f16"].contains(&before["kv_cache"].as_str().unwrap()));
    assert!(before["context_length"].as_u64().unwrap() > 0);
    assert_eq!(before["totals"]["turns"], 0);
    assert_eq!(before["cache"]["live_session"]["tokens"], 0);
    assert_eq!(before["cache"]["checkpoints"], serde_json::Value::Null);
    assert_eq!(before["api_key_required"], false);

    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Hello"), "max_tokens": 4, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let (_, after) = s.get("/v1/status").await;
    assert_eq!(after["totals"]["turns"], 1);
    let covered = after["cache"]["live_session"]["tokens"].as_u64().unwrap();
    assert!(
        covered >= r["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{after}"
    );
    assert!(after["cache"]["live_session"]["bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        after["totals"]["completion_tokens"],
        r["usage"]["completion_tokens"]
    );
    assert!(
        after["speed"]["last_decode_tokens_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    // The document describes it.
    let (_, doc) = s.get("/openapi.json").await;
    assert!(doc["paths"]["/v1/status"]["get"].is_object());
    assert!(doc["components"]["schemas"]["Status"].is_object());
    for field in ["backend", "kernel_set", "kv_cache"] {
        assert!(
            doc["components"]["schemas"]["Status"]["properties"][field].is_object(),
            "Status.{field} missing from the spec"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_status_needs_the_key_and_the_page_does_not() {
    let s = start_with(|c| c.api_key = Some("sesame".into())).await;
    let (status, _) = s.get("/v1/status").await;
    assert_eq!(status, 401);
    let r = s.client.get(s.url("/")).send().await.expect("GET /");
    assert_eq!(r.status(), 200, "the page itself is public");
    let r = s
        .client
        .get(s.url("/v1/status"))
        .bearer_auth("sesame")
        .send()
        .await
        .expect("GET status");
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(v["api_key_required"], true);
}
