//! The transport and safety layer against a real listening server: slow
//! and half-sent requests, shutdown within its grace period with the live
//! session saved, the connection limit, a 10 MiB body (peak memory and
//! `/health` latency meanwhile), what a web page on another site can and
//! cannot make the browser send, the API key, CORS, and the small
//! observability items (startup checkpoint rejections, the budget warning,
//! requests whose body did not parse).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{start_with, user};
use ds4_engine::families::LoadedModel;
use ds4_server::{CheckpointConfig, ServerConfig};
use ds4_text::Tokenizer;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start_checkpointed(
    dir: &Path,
    budget: u64,
    configure: impl FnOnce(&mut ServerConfig),
) -> ds4_server::Running {
    let path = ds4_models::default_model_path().expect("the default model");
    let tokenizer = Tokenizer::from_gguf(&path).expect("tokenizer");
    let model = LoadedModel::load(&path).expect("model");
    let mut config = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), "smollm2");
    config.checkpoints = Some(CheckpointConfig {
        dir: dir.to_path_buf(),
        model_path: path,
        budget,
        min_tokens: 1,
    });
    configure(&mut config);
    let state = ds4_server::build_state(config, model, tokenizer).expect("state");
    ds4_server::start(state).await.expect("listening")
}

/// Token counts of the checkpoint files in `dir` (`{hash}-{tokens}.ckpt`).
fn checkpoint_lengths(dir: &Path) -> Vec<usize> {
    std::fs::read_dir(dir)
        .expect("dir")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let stem = name.strip_suffix(".ckpt")?;
            stem.rsplit('-').next()?.parse().ok()
        })
        .collect()
}

/// Read until the peer closes (Ok(bytes)) or `limit` passes (Err).
async fn read_until_closed(tcp: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return Err(got),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_shutdown_within_grace_saves_the_live_session() {
    let dir = tempfile::tempdir().expect("temp dir");
    let grace = Duration::from_millis(1000);
    let running = start_checkpointed(dir.path(), 1 << 30, |c| {
        c.limits.shutdown_grace = grace;
        // Long enough that only the grace period can end these clients.
        c.limits.header_timeout = Duration::from_secs(60);
        c.limits.body_timeout = Duration::from_secs(60);
    })
    .await;
    let addr = running.addr;
    // A long greedy stream (a small model keeps counting).
    let body = json!({
        "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
        "max_tokens": 4000,
        "temperature": 0,
        "stream": true,
    });
    let mut stream = reqwest::Client::new()
        .post(format!("http://{addr}/v1/completions"))
        .json(&body)
        .send()
        .await
        .expect("POST");
    assert_eq!(stream.status(), 200);
    let mut seen = 0;
    while seen < 5 {
        let chunk = stream.chunk().await.expect("chunk").expect("stream open");
        seen += String::from_utf8_lossy(&chunk).matches("data:").count();
    }
    // Half a header, and full headers with half a body.
    let mut half_head = TcpStream::connect(addr).await.expect("connect");
    half_head
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le")
        .await
        .unwrap();
    let mut half_body = TcpStream::connect(addr).await.expect("connect");
    half_body
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\":",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        checkpoint_lengths(dir.path()).is_empty(),
        "nothing saved yet"
    );

    let t = Instant::now();
    running.shutdown().await.expect("shutdown");
    let took = t.elapsed();
    assert!(
        took < grace + Duration::from_secs(2),
        "shutdown took {took:?} with a {grace:?} grace period"
    );
    // The cancelled stream's session: prompt plus the tokens generated.
    let lengths = checkpoint_lengths(dir.path());
    assert_eq!(lengths.len(), 1, "{lengths:?}");
    assert!(lengths[0] > 20, "{lengths:?}");
    // Both half-sent requests were dropped, not left hanging.
    assert!(
        read_until_closed(&mut half_head, Duration::from_secs(1))
            .await
            .is_ok()
    );
    assert!(
        read_until_closed(&mut half_body, Duration::from_secs(1))
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_slow_clients_are_dropped() {
    let s = start_with(|c| {
        c.limits.header_timeout = Duration::from_millis(800);
        c.limits.body_timeout = Duration::from_millis(800);
    })
    .await;
    let addr: SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();

    // Slow loris: a header byte every 200 ms never completes the head.
    let mut loris = TcpStream::connect(addr).await.expect("connect");
    loris
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let mut closed = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if loris.write_all(b"X").await.is_err() {
            closed = true;
            break;
        }
        let mut b = [0u8; 1024];
        if let Ok(Ok(0)) | Ok(Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), loris.read(&mut b)).await
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "the slow-loris connection is still open");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());

    // A connection that sends nothing is closed too (the idle limit).
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    assert!(
        read_until_closed(&mut silent, Duration::from_secs(3))
            .await
            .is_ok()
    );

    // A body that trickles gets 408 at the body deadline.
    let mut slow_body = TcpStream::connect(addr).await.expect("connect");
    slow_body
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    let answer = match read_until_closed(&mut slow_body, Duration::from_secs(3)).await {
        Ok(b) | Err(b) => b,
    };
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");

    // The server is still fine.
    let (status, _) = s.get("/health").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_connection_limit() {
    let s = start_with(|c| {
        c.limits.max_connections = 3;
        c.limits.header_timeout = Duration::from_secs(30);
    })
    .await;
    let addr: SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // Let the server accept them before the fourth.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = TcpStream::connect(addr).await.expect("connect");
    extra
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .ok();
    let got = read_until_closed(&mut extra, Duration::from_secs(2))
        .await
        .expect("the fourth connection is closed at once");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, metrics) = s.get("/metrics").await;
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(
        metrics.contains("ds4_connections_refused_total 1"),
        "{metrics}"
    );
}

/// Peak resident memory since the last reset (`/proc/self/status` VmHWM),
/// and a reset of it (`clear_refs` 5), in KiB.
fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Peak memory growth allowed while a 10 MiB body is refused. The body is
/// held by the client (as JSON bytes) and by the server (bytes, the parsed
/// request, the rendered prompt), each about 10 MiB, plus one 64 KiB
/// piece's tokenizer records; before the bounded tokenization the same body
/// cost about 1 GiB.
const BIG_BODY_PEAK_MIB: u64 = 160;

#[tokio::test(flavor = "multi_thread")]
async fn default_model_a_10_mib_body_is_refused_without_the_memory_or_the_runtime() {
    let s = start_with(|c| c.body_limit = 16 << 20).await;
    let text = "All work and no play makes Jack a dull boy. ".repeat(10 * 1024 * 1024 / 44);
    let body = serde_json::to_vec(&json!({"messages": user(&text), "max_tokens": 1})).unwrap();
    assert!(body.len() >= 10 << 20);
    // A warm-up request, so the runtime and the allocator have their
    // ordinary size before the peak is reset.
    let (status, _) = s.get("/health").await;
    assert_eq!(status, 200);
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let base = vm_rss_kib();

    let health = {
        let client = s.client.clone();
        let url = s.url("/health");
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(3) {
                let q = Instant::now();
                let r = client.get(&url).send().await.expect("health");
                assert_eq!(r.status(), 200);
                worst = worst.max(q.elapsed());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            worst
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = Instant::now();
    let (status, err) = s.post_raw("/v1/chat/completions", body).await;
    let refused_in = t.elapsed();
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["code"], "context_length_exceeded");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("at least"), "{message}");
    let peak = vm_hwm_kib().saturating_sub(base) / 1024;
    let worst = health.await.expect("health task");
    eprintln!(
        "10 MiB body: refused in {refused_in:?}, peak growth {peak} MiB, worst /health {worst:?}"
    );
    assert!(peak < BIG_BODY_PEAK_MIB, "peak memory grew by {peak} MiB");
    assert!(worst < Duration::from_millis(100), "/health took {worst:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_cross_site_requests_and_foreign_hosts_are_refused() {
    let s = start_with(|c| c.allowed_hosts = vec!["box.lan".into()]).await;
    let body = json!({"messages": user("hi"), "max_tokens": 1});
    // A form or `fetch(..., {mode: "no-cors"})` can send text/plain without
    // a preflight.
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "text/plain")
        .header("origin", "https://evil.example")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["param"], "Content-Type");
    let r = s
        .client
        .post(s.url("/v1/messages"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415, "no content type at all");
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["type"], "error", "in the Anthropic shape");

    // DNS rebinding: the attacker's name resolving to 127.0.0.1.
    for (host, want) in [
        ("evil.example", 400),
        ("evil.example:8000", 400),
        ("localhost:1234", 200),
        ("127.0.0.1", 200),
        ("box.lan:8000", 200),
    ] {
        let r = s
            .client
            .get(s.url("/v1/models"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "Host: {host}");
    }
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("host", "evil.example")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "host_not_allowed");

    // No CORS headers without --cors.
    let r = s
        .client
        .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());

    // The page itself answers HEAD (link checkers, uptime probes).
    let r = s.client.head(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // A body that did not parse still counts as a request to its endpoint.
    let (status, _) = s.post_raw("/v1/completions", b"{not json".to_vec()).await;
    assert_eq!(status, 400);
    let (_, m) = s.get("/metrics").await;
    let m = m.as_str().unwrap_or_default().to_string();
    assert!(
        m.contains("ds4_requests_total{endpoint=\"completions\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("ds4_requests_total{endpoint=\"messages\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("ds4_requests_total{endpoint=\"chat_completions\"} 1"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_the_key_covers_every_route_but_health() {
    let s = start_with(|c| {
        c.api_key = Some("sekrit".into());
        c.cors = vec!["https://app.example".into()];
    })
    .await;
    for path in [
        "/metrics",
        "/openapi.json",
        "/v1/models",
        "/v1/status",
        "/nowhere",
    ] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without the key");
        let r = s
            .client
            .get(s.url(path))
            .bearer_auth("sekrit")
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 401, "{path} with the key");
    }
    for path in ["/health", "/", "/dashboard", "/assets/app.js"] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} is open");
    }
    let models = s.url("/v1/models");
    let with = |headers: &[(&str, &str)]| {
        let mut r = s.client.get(&models);
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send()
    };
    // Either header may carry the key; the other being wrong does not matter.
    let r = with(&[("x-api-key", "wrong"), ("authorization", "Bearer sekrit")])
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = with(&[("x-api-key", "sekrit"), ("authorization", "Bearer wrong")])
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The whole key, exactly: no prefix, no extension, no other case. (HTTP
    // itself drops whitespace around a header value; whitespace inside the
    // value is the server's to refuse: `Bearer  sekrit`, `x sekrit`.)
    let r = with(&[("authorization", "Bearer  sekrit")]).await.unwrap();
    assert_eq!(r.status(), 401, "Bearer with two spaces");
    for bad in ["x sekrit", "sekri", "sekrit2", "SEKRIT", ""] {
        let r = with(&[("x-api-key", bad)]).await.unwrap();
        assert_eq!(r.status(), 401, "x-api-key {bad:?}");
        let bearer = format!("Bearer {bad}");
        let r = with(&[("authorization", &bearer)]).await.unwrap();
        assert_eq!(r.status(), 401, "Bearer {bad:?}");
    }
    // With a key, the Host check is off (the key is the protection).
    let r = with(&[("x-api-key", "sekrit"), ("host", "box.example")])
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // CORS: the listed origin only, never reflected.
    let preflight = |origin: &'static str| {
        s.client
            .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, authorization",
            )
            .send()
    };
    let r = preflight("https://app.example").await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(
        r.headers().get("access-control-allow-origin").unwrap(),
        "https://app.example"
    );
    assert!(
        r.headers()
            .get("access-control-allow-credentials")
            .is_none()
    );
    let r = preflight("https://evil.example").await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_checkpoint_budget_warning_and_startup_rejections() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A file the store refuses at open (not a checkpoint at all).
    std::fs::write(dir.path().join("0123-5.ckpt"), b"not a checkpoint").unwrap();
    let running = start_checkpointed(dir.path(), 1024, |_| {}).await;
    let addr = running.addr;
    let metrics = || async move {
        reqwest::get(format!("http://{addr}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let m = metrics().await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("ds4_checkpoint_rejections_total{") && l.ends_with(" 1")),
        "refused at start, visible before any turn:\n{m}"
    );
    assert!(m.contains("ds4_checkpoint_budget_too_small 0"), "{m}");
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&json!({"messages": user("Say hi."), "max_tokens": 2, "temperature": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = metrics().await;
    assert!(m.contains("ds4_checkpoint_saves_total 1"), "{m}");
    assert!(m.contains("ds4_checkpoint_budget_too_small 1"), "{m}");
    assert!(checkpoint_lengths(dir.path()).is_empty());
    running.shutdown().await.unwrap();
}
