//! `/v1/chat/completions` and the informational endpoints, over a real
//! listening server with the default model.

mod common;

use common::{MODEL_ID, start, start_with, user};
use futures_util::StreamExt;
use serde_json::{Value, json};

fn chat(extra: Value) -> Value {
    let mut body =
        json!({ "model": MODEL_ID, "messages": user("Name three colours."), "max_tokens": 12 });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_health_models_metrics_openapi() {
    let s = start().await;
    let (status, health) = s.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["family"], "llama");
    assert!(health["context_length"].as_u64().unwrap() >= 2048);

    let (status, models) = s.get("/v1/models").await;
    assert_eq!(status, 200);
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL_ID);
    // The backend id names the kernel set (`cpu-avx512`, `cpu-avx512-fast`).
    let backend = models["data"][0]["backend"].as_str().unwrap();
    let set = models["data"][0]["kernel_set"].as_str().unwrap();
    assert!(backend.starts_with("cpu-"), "{models}");
    assert_eq!(backend.ends_with("-fast"), set == "fast", "{models}");
    assert!(["reference", "fast"].contains(&set), "{models}");
    let kv = models["data"][0]["kv_cache"].as_str().unwrap();
    assert!(["f32", "f16"].contains(&kv), "{models}");
    let (status, model) = s.get(&format!("/v1/models/{MODEL_ID}")).await;
    assert_eq!((status, model["id"].clone()), (200, json!(MODEL_ID)));
    // Any name is served by the loaded model (strict mode: tests/agents.rs).
    let (status, other) = s.get("/v1/models/gpt-9").await;
    assert_eq!((status, other["id"].clone()), (200, json!(MODEL_ID)));

    let (status, spec) = s.get("/openapi.json").await;
    assert_eq!(status, 200);
    for path in ["/health", "/v1/models", "/v1/chat/completions", "/metrics"] {
        assert!(
            spec["paths"][path].is_object(),
            "{path} missing from the spec"
        );
    }
    assert!(spec["components"]["schemas"]["ChatCompletionRequest"].is_object());
    for field in ["backend", "kernel_set", "kv_cache"] {
        assert!(
            spec["components"]["schemas"]["Model"]["properties"][field].is_object(),
            "Model.{field} missing from the spec"
        );
    }

    let (status, _) = s
        .post("/v1/chat/completions", &chat(json!({"temperature": 0})))
        .await;
    assert_eq!(status, 200);
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("ds4_requests_total{endpoint=\"chat_completions\"} 1"),
        "{text}"
    );
    assert!(text.contains("ds4_turns_total 1"));
    assert!(text.contains("ds4_queue_depth 0"));
    assert!(
        text.contains("ds4_mtp_draft_tokens_total 0"),
        "no MTP head: nothing drafted"
    );

    let (status, err) = s.get("/v1/nothing").await;
    assert_eq!(status, 404);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/v1/nothing")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_chat_non_streaming_usage_seed_replay_and_cache() {
    let s = start().await;
    let body = chat(json!({"temperature": 0.9, "seed": 1234, "max_completion_tokens": 16}));
    // The first request is cold (a many-row prefill), the second reuses all
    // but the last prompt token; the CPU kernels are row-independent, so
    // both must give the same text for the same seed.
    let (status, a) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["model"], MODEL_ID);
    let choice = &a["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    let usage = &a["usage"];
    let (p, c) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 5 && (1..=16).contains(&c));
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), p + c);
    assert_eq!(usage["seed"], 1234);
    let reason = choice["finish_reason"].as_str().unwrap();
    assert!(
        reason == "stop" || (reason == "length" && c == 16),
        "{reason} {c}"
    );

    // Same seed, same text (cold then warm); the second turn reuses the
    // prompt's prefix.
    let (_, b) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(b["choices"][0]["message"]["content"], text.as_str());
    assert_eq!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        p - 1
    );

    // min_p is not part of the llama family's nucleus law: reported, not applied.
    let (status, w) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"min_p": 0.2, "temperature": 0})),
        )
        .await;
    assert_eq!(status, 200);
    assert!(w["warnings"][0].as_str().unwrap().contains("min_p"), "{w}");
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_chat_streaming_matches_non_streaming() {
    let s = start().await;
    let body = chat(json!({"temperature": 0.7, "seed": 99}));
    let (_, full) = s.post("/v1/chat/completions", &body).await;
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let (status, events) = s.post_sse("/v1/chat/completions", &stream_body).await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut text = String::new();
    let mut finish = None;
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["id"], chunks[0]["id"]);
        if let Some(choice) = c["choices"].get(0) {
            text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            if let Some(r) = choice["finish_reason"].as_str() {
                finish = Some(r.to_string());
            }
        }
    }
    assert_eq!(
        text,
        full["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(
        finish.as_deref(),
        full["choices"][0]["finish_reason"].as_str()
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["completion_tokens"],
        full["usage"]["completion_tokens"]
    );
    assert!(
        last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_stop_sequences_and_logprobs() {
    let s = start().await;
    let (_, greedy) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"temperature": 0, "max_tokens": 24})),
        )
        .await;
    let text = greedy["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(words.len() >= 3, "{text}");
    let stop = words[2];
    let (_, stopped) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"temperature": 0, "max_tokens": 24, "stop": [stop]})),
        )
        .await;
    let cut = stopped["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert_eq!(cut, &text[..text.find(stop).unwrap()]);
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    let (status, lp) = s
        .post(
            "/v1/chat/completions",
            &chat(json!({"temperature": 0, "max_tokens": 6, "logprobs": true, "top_logprobs": 3})),
        )
        .await;
    assert_eq!(status, 200, "{lp}");
    let entries = lp["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert!(!entries.is_empty());
    let joined: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        joined,
        lp["choices"][0]["message"]["content"].as_str().unwrap()
    );
    for e in entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"], e["token"]);
        assert!(
            (top[0]["logprob"].as_f64().unwrap() - e["logprob"].as_f64().unwrap()).abs() < 1e-6
        );
        assert!(top[0]["logprob"].as_f64().unwrap() >= top[1]["logprob"].as_f64().unwrap());
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_chat_error_paths_keep_the_server_serving() {
    let s = start_with(|c| c.ctx = Some(64)).await;
    let path = "/v1/chat/completions";
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"{not json".to_vec(), 400, "not valid JSON"),
        (b"".to_vec(), 400, "not valid JSON"),
        (
            b"{\"temperature\": NaN, \"messages\": []}".to_vec(),
            400,
            "not valid JSON",
        ),
        (b"[1,2]".to_vec(), 400, "JSON object"),
        (
            b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}".to_vec(),
            400,
            "UTF-8",
        ),
        (
            chat(json!({"temperature": "hot"})).to_string().into_bytes(),
            400,
            "temperature",
        ),
        (
            chat(json!({"temperature": 1e300})).to_string().into_bytes(),
            400,
            "temperature",
        ),
        (
            chat(json!({"top_p": -0.1})).to_string().into_bytes(),
            400,
            "top_p",
        ),
        (
            chat(json!({"top_k": -5})).to_string().into_bytes(),
            400,
            "top_k",
        ),
        (
            chat(json!({"max_tokens": -1})).to_string().into_bytes(),
            400,
            "max_tokens",
        ),
        (
            chat(json!({"max_tokens": 0})).to_string().into_bytes(),
            400,
            "max_tokens",
        ),
        (
            chat(json!({"max_tokens": 1e30})).to_string().into_bytes(),
            400,
            "max_tokens",
        ),
        (
            chat(json!({"seed": -3})).to_string().into_bytes(),
            400,
            "seed",
        ),
        (
            chat(json!({"presence_penalty": 9}))
                .to_string()
                .into_bytes(),
            400,
            "presence_penalty",
        ),
        (chat(json!({"n": 2})).to_string().into_bytes(), 400, "n = 2"),
        (
            chat(json!({"mtp_depth": 2})).to_string().into_bytes(),
            400,
            "MTP",
        ),
        (
            chat(json!({"stream": "yes"})).to_string().into_bytes(),
            400,
            "stream",
        ),
        (
            chat(json!({"top_logprobs": 2})).to_string().into_bytes(),
            400,
            "logprobs",
        ),
        (
            chat(json!({"logprobs": true, "top_logprobs": 50}))
                .to_string()
                .into_bytes(),
            400,
            "top_logprobs",
        ),
        (
            chat(json!({"tool_choice": "required", "tools": []}))
                .to_string()
                .into_bytes(),
            400,
            "tool_choice",
        ),
        (
            chat(json!({"messages": []})).to_string().into_bytes(),
            400,
            "messages",
        ),
        (
            chat(json!({"messages": [{"role": "wizard", "content": "x"}]}))
                .to_string()
                .into_bytes(),
            400,
            "messages[0].role",
        ),
        (
            chat(json!({"messages": user(&"many words ".repeat(60))}))
                .to_string()
                .into_bytes(),
            400,
            "maximum context length is 64 tokens",
        ),
    ];
    for (body, want, needle) in cases {
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(80)
            .collect::<String>();
        let (status, err) = s.post_raw(path, body).await;
        assert_eq!(status, want, "{shown}: {err}");
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle),
            "{shown}: {message:?} lacks {needle:?}"
        );
        assert!(err["error"]["type"].is_string());
    }
    let (status, over) = s
        .post(
            path,
            &chat(json!({"messages": user(&"many words ".repeat(60))})),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(over["error"]["code"], "context_length_exceeded");
    // Unknown fields are ignored; a huge max_tokens is clamped to the room left.
    let (status, ok) = s
        .post(
            path,
            &chat(json!({"temperature": 0, "max_tokens": 100000, "frobnicate": {"x": 1}})),
        )
        .await;
    assert_eq!(status, 200, "{ok}");
    let used = ok["usage"]["total_tokens"].as_u64().unwrap();
    assert!(used <= 64, "{used}");
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_api_key_and_body_limit() {
    let s = start_with(|c| {
        c.api_key = Some("sekrit".into());
        c.body_limit = 4096;
    })
    .await;
    let path = s.url("/v1/chat/completions");
    let body = chat(json!({"temperature": 0, "max_tokens": 2}));
    let r = s.client.post(&path).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let err: Value = r.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("API key")
    );
    let r = s
        .client
        .post(&path)
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = s
        .client
        .post(&path)
        .bearer_auth("sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .client
        .post(&path)
        .header("x-api-key", "sekrit")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s.client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200, "health needs no key");
    let big = chat(json!({"messages": user(&"x".repeat(10_000))}));
    let r = s
        .client
        .post(&path)
        .bearer_auth("sekrit")
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let err: Value = r.json().await.unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too large")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_disconnect_mid_stream_then_same_prefix() {
    let s = start().await;
    let body = chat(json!({"temperature": 0, "max_tokens": 400, "stream": true,
        "messages": user("Write a long story about a lighthouse keeper.")}));
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut seen = String::new();
    // The role chunk, then at least six content chunks (whole events).
    while seen.matches("\"content\":").count() < 7 || !seen.ends_with("\n\n") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    drop(stream);
    let streamed: String = common::parse_sse(&seen)
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    // The turn is cancelled; the next request with the same prefix works,
    // reuses the state the cancelled turn left behind, and (greedy) says
    // what the cancelled stream had started to say.
    let mut again = body.clone();
    again["stream"] = json!(false);
    again["max_tokens"] = json!(4);
    let (status, done) = s.post("/v1/chat/completions", &again).await;
    assert_eq!(status, 200, "{done}");
    let text = done["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty());
    assert!(
        streamed.starts_with(text),
        "after the disconnect: {text:?}; before: {streamed:?}"
    );
    let usage = &done["usage"];
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() - 1
    );
    let metrics = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("ds4_turns_cancelled_total 1"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_queue_full_gets_503_with_retry_after() {
    let s = start_with(|c| c.max_queue = 1).await;
    let body = chat(json!({"temperature": 0, "max_tokens": 300, "stream": true,
        "messages": user("Write a long story about a lighthouse keeper.")}));
    let url = s.url("/v1/chat/completions");
    // The first runs (wait for its first token), the second waits in the queue.
    let first = s.client.post(&url).json(&body).send().await.unwrap();
    let mut first = first.bytes_stream();
    // The role chunk goes out at once; content means the worker is on it.
    let mut seen = String::new();
    while !seen.contains("\"content\":\"") || seen.matches("data:").count() < 3 {
        seen.push_str(&String::from_utf8_lossy(
            &first.next().await.unwrap().unwrap(),
        ));
    }
    let second = s.client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(second.status(), 200);
    let third = s.client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(third.status(), 503);
    assert_eq!(third.headers()["retry-after"], "1");
    let err: Value = third.json().await.unwrap();
    assert_eq!(err["error"]["code"], "queue_full");
    drop(first);
    drop(second);
    let mut ok = body.clone();
    ok["stream"] = json!(false);
    ok["max_tokens"] = json!(2);
    // The worker notices the disconnects at the running turn's next token
    // and skips the queued one; until then the queue may still be full, so
    // retry as a client honouring Retry-After would (bounded).
    let mut status = 0;
    for _ in 0..50 {
        status = s.post("/v1/chat/completions", &ok).await.0;
        if status != 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_keep_alive_comments_during_prefill() {
    let s = start_with(|c| {
        c.keep_alive = std::time::Duration::from_millis(10);
        c.prefill_chunk = 64;
    })
    .await;
    let body = chat(json!({"temperature": 0, "max_tokens": 2, "stream": true,
        "messages": user(&"The quick brown fox jumps over the lazy dog. ".repeat(60))}));
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    // Comments are ignored by SSE clients; they keep proxies from timing
    // out while a long prompt is prefilled.
    assert!(
        text.contains(": keep-alive") || text.contains(":keep-alive"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("data: [DONE]"));
}
