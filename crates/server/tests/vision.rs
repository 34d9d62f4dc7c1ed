//! Images through the server on the tiny vision-language chat checkpoint
//! (`tests/fixtures/qwen4_exp/chat_vl`: the real Qwen3.5 tokenizer and
//! template, a vision tower): chat, responses and messages with an image
//! answer, `usage` and `count_tokens` count the expanded image tokens, the
//! same request again is warm and equal to a cold server's answer, a
//! changed image reuses less, and bad images get a 400 that names the part
//! and says what to send (the server keeps serving); the OpenAPI document
//! lists Anthropic `image` blocks only for a model that reads images. The
//! text-only chat checkpoint keeps refusing images.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ds4_engine::families::LoadedModel;
use ds4_server::ServerConfig;
use ds4_text::Tokenizer;
use serde_json::{Value, json};

use common::TestServer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp")
}

fn image(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join("vl/images").join(name)).unwrap()
}

async fn serve(dir: &str, configure: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let path = fixtures().join(dir);
    let tokenizer = Tokenizer::from_hf_dir(ds4_models::qwen3_5_tokenizer_dir().unwrap()).unwrap();
    let model = LoadedModel::load(&path).expect("model");
    let mut config = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), "qwen-vl");
    config.model_dir = Some(path);
    configure(&mut config);
    let state = ds4_server::build_state(config, model, tokenizer).expect("state");
    let running = ds4_server::start(state).await.expect("listening");
    TestServer {
        base: format!("http://{}", running.addr),
        client: reqwest::Client::new(),
        _running: running,
    }
}

fn data_url(bytes: &[u8], media: &str) -> String {
    format!("data:{media};base64,{}", STANDARD.encode(bytes))
}

fn chat(bytes: &[u8], media: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Look at this: "},
            {"type": "image_url", "image_url": {"url": data_url(bytes, media)}},
            {"type": "text", "text": " What is it?"},
        ]}],
        "max_tokens": 6,
        "temperature": 0,
        "mtp_depth": 0,
    })
}

fn anthropic(bytes: &[u8], media: &str) -> Value {
    json!({
        "model": "qwen-vl",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Look at this: "},
            {"type": "image", "source": {"type": "base64", "media_type": media, "data": STANDARD.encode(bytes)}},
            {"type": "text", "text": " What is it?"},
        ]}],
    })
}

/// Merged tokens of the fixture images under chat_vl's processor (32x32
/// pixels per token): exact.png 96x64 → 3x2, wide.jpg 300x120 → 288x128 →
/// 9x4.
const EXACT: usize = 6;
const WIDE: usize = 36;

async fn count(s: &TestServer, v: Value) -> usize {
    let (code, c) = s.post("/v1/messages/count_tokens", &v).await;
    assert_eq!(code, 200, "{c}");
    c["input_tokens"].as_u64().unwrap() as usize
}

#[tokio::test(flavor = "multi_thread")]
async fn image_chat_counts_its_tokens_and_is_warm_as_cold() {
    let s = serve("chat_vl", |c| c.boundary_every = 1).await;
    let (code, one) = s
        .post(
            "/v1/chat/completions",
            &chat(&image("exact.png"), "image/png"),
        )
        .await;
    assert_eq!(code, 200, "{one}");
    let prompt = one["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    // count_tokens counts the same expanded prompt, and a bigger image
    // adds exactly its extra merged tokens.
    let small = count(&s, anthropic(&image("exact.png"), "image/png")).await;
    let big = count(&s, anthropic(&image("wide.jpg"), "image/jpeg")).await;
    assert_eq!(big - small, WIDE - EXACT);
    let (code, m) = s
        .post("/v1/messages", &anthropic(&image("exact.png"), "image/png"))
        .await;
    assert_eq!(code, 200, "{m}");
    assert_eq!(m["usage"]["input_tokens"].as_u64().unwrap() as usize, small);
    // Again: warm, the same answer; a cold server agrees.
    let (_, two) = s
        .post(
            "/v1/chat/completions",
            &chat(&image("exact.png"), "image/png"),
        )
        .await;
    let cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap() as usize;
    assert!(cached + 1 >= prompt, "{cached} of {prompt} reused");
    assert_eq!(two["choices"][0]["message"], one["choices"][0]["message"]);
    let cold = serve("chat_vl", |_| {}).await;
    let (_, three) = cold
        .post(
            "/v1/chat/completions",
            &chat(&image("exact.png"), "image/png"),
        )
        .await;
    assert_eq!(three["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(three["choices"][0]["message"], one["choices"][0]["message"]);
    // Another image of the same request: reuse stops at its span, well
    // before the end.
    let (code, other) = s
        .post(
            "/v1/chat/completions",
            &chat(&image("wide.jpg"), "image/jpeg"),
        )
        .await;
    assert_eq!(code, 200, "{other}");
    let reused = other["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap() as usize;
    assert!(
        reused > 0 && reused + EXACT + 2 < prompt,
        "{reused} of {prompt}"
    );
    assert_eq!(
        other["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        prompt + WIDE - EXACT
    );
    // Streamed, through the Responses API too.
    let (code, events) = s
        .post_sse(
            "/v1/responses",
            &json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "Describe "},
                {"type": "input_image", "image_url": data_url(&image("tall.png"), "image/png")},
            ]}], "max_output_tokens": 4, "stream": true}),
        )
        .await;
    assert_eq!(code, 200);
    // Four tokens of a thinking reply: the stream ends incomplete.
    let last = events.last().and_then(|(e, _)| e.clone());
    assert_eq!(last.as_deref(), Some("response.incomplete"), "{events:?}");
    let done: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
    let tall = 5; // 45x170 → 32x160: 1x5 merged tokens
    let usage = &done["response"]["usage"];
    assert!(
        usage["input_tokens"].as_u64().unwrap() as usize > tall + 2,
        "{usage}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_images_get_a_400_that_says_what_to_fix() {
    let s = serve("chat_vl", |c| c.max_image_pixels = Some(100 * 100)).await;
    let png = image("exact.png");
    let cases: [(Vec<u8>, &str, &str); 3] = [
        (
            png[..png.len() / 2].to_vec(),
            "image/png",
            "truncated or malformed",
        ),
        (
            b"\x89PNG\r\n\x1a\nthis is a text file named cat.png".to_vec(),
            "image/png",
            "truncated or malformed",
        ),
        (image("wide.jpg"), "image/jpeg", "at most 10000 pixels"),
    ];
    for (bytes, media, says) in cases {
        let (code, e) = s.post("/v1/chat/completions", &chat(&bytes, media)).await;
        assert_eq!(code, 400, "{e}");
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("messages[0].content[1]") && msg.contains(says),
            "{msg}"
        );
        assert!(msg.contains("send"), "{msg}");
        let (code, e) = s.post("/v1/messages", &anthropic(&bytes, media)).await;
        assert_eq!(code, 400, "{e}");
        assert_eq!(e["type"], "error", "{e}");
    }
    // Still serving.
    let (code, _) = s
        .post("/v1/chat/completions", &chat(&png, "image/png"))
        .await;
    assert_eq!(code, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_text_only_checkpoint_refuses_images_as_before() {
    let s = serve("chat", |_| {}).await;
    let (code, e) = s
        .post(
            "/v1/chat/completions",
            &chat(&image("exact.png"), "image/png"),
        )
        .await;
    assert_eq!(code, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("images are not supported by this model"),
        "{msg}"
    );
}
