//! A real server on a loopback port, serving the default model.

#![allow(dead_code)]

use std::net::SocketAddr;

use ds4_engine::families::LoadedModel;
use ds4_server::ServerConfig;
use ds4_text::Tokenizer;
use serde_json::{Value, json};

pub const MODEL_ID: &str = "smollm2";

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    pub _running: ds4_server::Running,
}

pub async fn start() -> TestServer {
    start_with(|_| {}).await
}

pub async fn start_with(configure: impl FnOnce(&mut ServerConfig)) -> TestServer {
    start_model(false, configure).await
}

/// [`start_with`] with the default model's trained MTP head attached.
pub async fn start_with_mtp_head(configure: impl FnOnce(&mut ServerConfig)) -> TestServer {
    start_model(true, configure).await
}

async fn start_model(mtp_head: bool, configure: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let path = ds4_models::default_model_path().expect("the default model");
    let tokenizer = Tokenizer::from_gguf(&path).expect("tokenizer");
    let mut model = LoadedModel::load(&path).expect("model");
    if mtp_head {
        let head = ds4_models::mtp_head_for(&path)
            .expect("the default model has a head")
            .expect("the head file checks out");
        model.attach_mtp_head(&head).expect("the head attaches");
    }
    let mut config = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), MODEL_ID);
    configure(&mut config);
    let state = ds4_server::build_state(config, model, tokenizer).expect("state");
    let running = ds4_server::start(state).await.expect("listening");
    TestServer {
        base: format!("http://{}", running.addr),
        client: reqwest::Client::new(),
        _running: running,
    }
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.client.get(self.url(path)).send().await.expect("GET");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, serde_json::to_vec(body).expect("json"))
            .await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POST and read the whole SSE stream: (event name, data) pairs.
    pub async fn post_sse(&self, path: &str, body: &Value) -> (u16, Vec<(Option<String>, String)>) {
        let r = self
            .client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("POST");
        let status = r.status().as_u16();
        let text = r.text().await.expect("body");
        (status, parse_sse(&text))
    }
}

pub fn parse_sse(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = Some(e.trim().to_string());
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                }
            }
            (!data.is_empty()).then(|| (event, data.join("\n")))
        })
        .collect()
}

pub fn user(text: &str) -> Value {
    json!([{ "role": "user", "content": text }])
}
