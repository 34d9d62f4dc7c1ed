//! Durable sessions through the server: a server started on a
//! `--checkpoint-dir` saves the conversation's state, shuts down cleanly,
//! and a new server on the same directory serves the same request warm
//! (`cached_tokens > 0`) with the identical greedy output.

use std::net::SocketAddr;
use std::path::Path;

use ds4_engine::families::LoadedModel;
use ds4_server::{CheckpointConfig, ServerConfig};
use ds4_text::Tokenizer;
use serde_json::{Value, json};

async fn start(dir: &Path) -> ds4_server::Running {
    let path = ds4_models::default_model_path().expect("the default model");
    let tokenizer = Tokenizer::from_gguf(&path).expect("tokenizer");
    let model = LoadedModel::load(&path).expect("model");
    let mut config = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), "smollm2");
    config.checkpoints = Some(CheckpointConfig {
        dir: dir.to_path_buf(),
        model_path: path,
        budget: 1 << 30,
        min_tokens: 1,
    });
    let state = ds4_server::build_state(config, model, tokenizer).expect("state");
    ds4_server::start(state).await.expect("listening")
}

async fn chat(addr: SocketAddr, body: &Value) -> Value {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.expect("JSON body")
}

async fn metrics(addr: SocketAddr) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text")
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_restart_on_the_same_checkpoint_dir_is_warm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}
        ],
        "max_tokens": 12,
        "temperature": 0,
    });

    let first = start(dir.path()).await;
    let cold = chat(first.addr, &body).await;
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let m = metrics(first.addr).await;
    assert!(m.contains("ds4_checkpoint_saves_total 1"), "{m}");
    assert!(m.contains("ds4_cache_misses_total 1"), "{m}");
    first.shutdown().await.expect("clean shutdown");
    let files = std::fs::read_dir(dir.path()).expect("dir").count();
    assert!(files >= 1, "a checkpoint was written");

    let second = start(dir.path()).await;
    let warm = chat(second.addr, &body).await;
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens");
    let prompt_tokens = warm["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    assert!(cached > 0, "{warm}");
    assert!(cached < prompt_tokens);
    assert_eq!(
        warm["choices"][0]["message"]["content"],
        cold["choices"][0]["message"]["content"]
    );
    assert_eq!(
        warm["usage"]["completion_tokens"],
        cold["usage"]["completion_tokens"]
    );
    let m = metrics(second.addr).await;
    assert!(
        m.contains("ds4_cache_hits_by_source_total{source=\"disk\"} 1"),
        "{m}"
    );
    assert!(m.contains("ds4_cache_hits_total 1"), "{m}");
    second.shutdown().await.expect("clean shutdown");
}
