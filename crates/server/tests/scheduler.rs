//! The scheduler on the default model: the queue is bounded by the tokens
//! its requests reserve (503 with `Retry-After` only when that budget is
//! used up, never below it), a client that leaves frees its place at once
//! (queued: its share of the budget; running: its lane, for the next
//! request), requests run first come first served whatever their length,
//! and `/v1/status` and `/metrics` show the queue, the running turns, time
//! to first token, tokens/s and the cache's memory.

mod common;

use std::time::{Duration, Instant};

use common::{MODEL_ID, TestServer, start_with, user};
use futures_util::StreamExt;
use serde_json::{Value, json};

fn chat(prompt: &str, max_tokens: u64, stream: bool) -> Value {
    json!({"model": MODEL_ID, "temperature": 0, "max_tokens": max_tokens, "stream": stream,
        "messages": user(prompt)})
}

const LONG: &str = "Write a very long story about a lighthouse keeper and the sea.";

/// Start a streaming chat and read it until content flows: its turn runs.
async fn running(s: &TestServer, max_tokens: u64) -> impl Send + 'static {
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&chat(LONG, max_tokens, true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") || seen.matches("data:").count() < 3 {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    stream
}

/// A streaming request admitted to the queue (200 once admitted), held
/// open; or the refusal.
async fn queued(s: &TestServer, body: &Value) -> Result<reqwest::Response, reqwest::Response> {
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    if r.status() == 200 { Ok(r) } else { Err(r) }
}

async fn status(s: &TestServer) -> Value {
    let (code, body) = s.get("/v1/status").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// Poll `/v1/status` until `ready` holds (bounded).
async fn wait_status(s: &TestServer, ready: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..200 {
        let st = status(s).await;
        if ready(&st) {
            return st;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("status never matched: {}", status(s).await);
}

async fn metrics(s: &TestServer) -> String {
    s.client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
}

/// Each waiting request reserves its prompt plus `max_tokens` (here ~30
/// + 200 of a 500-token budget): two wait, the third is refused, and one
/// leaving lets the next in at once.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_the_queue_is_bounded_by_reserved_tokens() {
    // Default keep-alive (10 s): the server sees a queued stream's
    // disconnect without writing to it.
    let s = start_with(|c| c.max_queue_tokens = Some(500)).await;
    let _a = running(&s, 300).await;
    let waiting = chat("Hi", 200, true);
    let b = queued(&s, &waiting)
        .await
        .expect("below the budget: queued");
    let c = queued(&s, &waiting)
        .await
        .expect("below the budget: queued");
    let st = wait_status(&s, |st| st["queue"]["waiting"] == 2).await;
    let reserved = st["queue"]["reserved_tokens"].as_u64().unwrap();
    assert!((402..=500).contains(&reserved), "{st}");
    assert_eq!(st["queue"]["max_tokens"], 500);
    assert_eq!(st["max_queue"], Value::Null, "no count cap by default");
    assert_eq!(st["running"], 1);
    let m = metrics(&s).await;
    assert_eq!(metric(&m, "ds4_queue_reserved_tokens"), reserved as f64);
    assert_eq!(metric(&m, "ds4_queue_depth"), 2.0);

    // Full: 503 with Retry-After, and nothing queued.
    let refused = queued(&s, &waiting).await.expect_err("over the budget");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    let err: Value = refused.json().await.unwrap();
    assert_eq!(err["error"]["code"], "queue_full");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 requests waiting"),
        "{err}"
    );
    assert_eq!(status(&s).await["queue"]["waiting"], 2);

    // A waiting client leaves: its share is free at once (no retry).
    drop(b);
    wait_status(&s, |st| st["queue"]["waiting"] == 1).await;
    let d = queued(&s, &waiting).await.expect("room again");
    let m = metrics(&s).await;
    assert_eq!(
        metric(&m, "ds4_rejections_total{reason=\"queue_full\"}"),
        1.0
    );
    drop((c, d));
}

/// A running turn whose client leaves is cancelled at once and its lane
/// takes the next waiting request: the long turn does not run on.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_a_cancelled_turn_frees_its_lane_for_the_next() {
    let s = start_with(|_| {}).await;
    let a = running(&s, 1000).await;
    let (base, client) = (s.base.clone(), s.client.clone());
    let next = tokio::spawn(async move {
        let r = client
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat("Name a colour.", 2, false))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    });
    wait_status(&s, |st| st["queue"]["waiting"] == 1).await;
    drop(a);
    let (code, body) = tokio::time::timeout(Duration::from_secs(120), next)
        .await
        .expect("the next request ran")
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let m = metrics(&s).await;
    assert_eq!(metric(&m, "ds4_turns_cancelled_total"), 1.0, "{m}");
    // The cancelled turn stopped right after its client left, far short
    // of its 1000 tokens.
    let generated = metric(&m, "ds4_completion_tokens_total");
    assert!(generated < 200.0, "{generated} tokens generated");
    let st = wait_status(&s, |st| st["running"] == 0).await;
    assert_eq!(st["queue"]["waiting"], 0);
}

/// One lane, requests of very different lengths arriving in turn: they
/// finish in the order they came (a long one is not overtaken by the short
/// ones behind it, and a short one waits only for those before it).
#[tokio::test(flavor = "multi_thread")]
async fn default_model_requests_run_first_come_first_served() {
    let s = start_with(|_| {}).await;
    // Long enough to hold the lane while six requests queue on a loaded
    // machine (40 tokens once finished first: the queue drained before the
    // sixth arrived); dropping it below cancels it.
    let a = running(&s, 1000).await;
    let long_prompt = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let bodies = [
        chat("Name a colour.", 4, false),
        chat(&long_prompt, 24, false),
        chat("Name a fruit.", 4, false),
        chat("Name a tree.", 4, false),
        chat(&long_prompt, 24, false),
        chat("Name a bird.", 4, false),
    ];
    let mut tasks = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let (base, client, body) = (s.base.clone(), s.client.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let r = client
                .post(format!("{base}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await.unwrap();
            (i, Instant::now())
        }));
        // Arrival order is the order they join the queue.
        wait_status(&s, |st| st["queue"]["waiting"] == i as u64 + 1).await;
    }
    drop(a);
    let mut done = Vec::new();
    for t in tasks {
        done.push(
            tokio::time::timeout(Duration::from_secs(180), t)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    done.sort_by_key(|(_, at)| *at);
    let order: Vec<usize> = done.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2, 3, 4, 5]);
}

/// After one turn: time to first token, tokens/s, the running and queued
/// gauges and the cache's memory in both views.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_status_and_metrics_show_the_scheduler() {
    let s = start_with(|_| {}).await;
    let (code, body) = s
        .post(
            "/v1/chat/completions",
            &chat("Name three colours.", 8, false),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let st = status(&s).await;
    assert_eq!(
        (st["running"].as_u64(), st["lanes"].as_u64()),
        (Some(0), Some(1))
    );
    let ctx = st["context_length"].as_u64().unwrap();
    assert_eq!(st["queue"]["max_tokens"].as_u64(), Some(16 * ctx));
    assert_eq!(st["latency"]["turns"], 1);
    let ttft = st["latency"]["mean_time_to_first_token_seconds"]
        .as_f64()
        .unwrap();
    let wait = st["latency"]["mean_queue_wait_seconds"].as_f64().unwrap();
    assert!(ttft > 0.0 && wait >= 0.0 && wait <= ttft, "{st}");
    assert!(
        st["speed"]["tokens_per_second"].as_f64().unwrap() > 0.0,
        "{st}"
    );
    assert_eq!(
        st["batching"]["batches"], 0,
        "one lane: no batched forwards"
    );

    let m = metrics(&s).await;
    assert_eq!(metric(&m, "ds4_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(
        metric(&m, "ds4_time_to_first_token_seconds_bucket{le=\"+Inf\"}"),
        1.0
    );
    assert_eq!(metric(&m, "ds4_queue_wait_seconds_count"), 1.0);
    let generated = metric(&m, "ds4_generated_tokens_total");
    assert_eq!(
        generated,
        body["usage"]["completion_tokens"].as_f64().unwrap()
    );
    assert!(metric(&m, "ds4_tokens_per_second") > 0.0);
    assert_eq!(metric(&m, "ds4_running_turns"), 0.0);
    assert_eq!(metric(&m, "ds4_queue_depth"), 0.0);
    let live = metric(&m, "ds4_session_cache_bytes{kind=\"live\"}");
    assert!(live > 0.0, "{m}");
    assert_eq!(live, st["cache"]["live_session"]["bytes"].as_f64().unwrap());
}
