//! The GGUF tokenizer against transformers (`AutoTokenizer.from_pretrained(..., gguf_file=)`):
//! fixtures from tools/oracle/text/generate.py.

mod common;

use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use common::{content, corpus, ids, model_path, read_jsonl, tokenizer};
use ds4_text::Tokenizer;

#[test]
fn ids_match_transformers_on_the_whole_corpus() {
    let tok = tokenizer();
    let rows = read_jsonl("smollm_gguf_ids.jsonl");
    assert_eq!(
        rows.len(),
        corpus().len(),
        "fixture is stale: rerun generate.py"
    );
    let mut mismatches = Vec::new();
    for row in &rows {
        let text = row["text"].as_str().expect("text");
        // transformers' encode() with add_special_tokens=True == our encode_prompt (add_bos=false).
        let ours = tok.encode_prompt(text).expect("encode");
        if ours != ids(&row["ids"]) {
            mismatches.push(format!(
                "{text:?}: ours {ours:?}, transformers {:?}",
                ids(&row["ids"])
            ));
        }
        assert_eq!(
            tok.encode(text, true).expect("encode"),
            ours,
            "no bos/eos is added for this file"
        );
        let plain = tok.encode(text, false).expect("encode");
        if plain != ids(&row["ids_plain"]) {
            mismatches.push(format!(
                "plain {text:?}: ours {plain:?}, transformers {:?}",
                ids(&row["ids_plain"])
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} differ:\n{}",
        mismatches.len(),
        rows.len(),
        mismatches.join("\n")
    );
}

#[test]
fn decode_round_trips_and_matches_transformers() {
    let tok = tokenizer();
    for row in read_jsonl("smollm_gguf_ids.jsonl") {
        let text = row["text"].as_str().expect("text");
        let row_ids = ids(&row["ids"]);
        let decoded = tok.decode(&row_ids, false).expect("decode");
        assert_eq!(decoded, text, "decode(encode(x)) == x");
        assert_eq!(decoded, row["decoded"].as_str().expect("decoded"));
        let skipped = tok.decode(&row_ids, true).expect("decode");
        assert_eq!(
            skipped,
            row["decoded_skip_special"]
                .as_str()
                .expect("decoded_skip_special"),
            "{text:?}"
        );
        let plain = tok
            .decode(&tok.encode(text, false).expect("encode"), false)
            .expect("decode");
        assert_eq!(plain, text, "plain-text encoding also round-trips");
    }
}

#[test]
fn special_tokens_and_metadata() {
    let tok = tokenizer();
    let special = &read_jsonl("smollm_special.jsonl")[0];
    assert_eq!(
        tok.bos_token().map(|t| t.text.as_str()),
        special["bos_token"].as_str()
    );
    assert_eq!(
        tok.eos_token().map(|t| t.text.as_str()),
        special["eos_token"].as_str()
    );
    assert_eq!(tok.bos_token().map(|t| t.id), Some(1));
    assert_eq!(tok.eos_token().map(|t| t.id), Some(2));
    assert_eq!(
        tok.vocab_size() as u64,
        special["vocab_size"].as_u64().expect("vocab_size")
    );
    assert_eq!(tok.chat_template(), special["chat_template"].as_str());
    assert!(!tok.add_bos());
    // eos <|im_end|> first, then <|endoftext|> (id 0) found among the control tokens.
    assert_eq!(tok.stop_token_ids(), [2, 0]);
    assert_eq!(
        tok.kind(),
        "gguf gpt2 BPE, pre=smollm, 49152 tokens, 48900 merges"
    );
    assert!(tok.is_special(1) && !tok.is_special(19556));
}

/// A copy of the default model's metadata with `pre` replaced and some tokens re-marked.
fn variant(pre: &str, user_defined: &[u32]) -> Content {
    let base = content();
    let mut metadata = base.metadata.clone();
    metadata.insert("tokenizer.ggml.pre".into(), GgufValue::String(pre.into()));
    if let Some(GgufValue::Array(types)) = metadata.get_mut("tokenizer.ggml.token_type") {
        for &id in user_defined {
            types[id as usize] = GgufValue::I32(4);
        }
    }
    Content {
        magic: base.magic,
        metadata,
        tensor_infos: Default::default(),
        tensor_data_offset: 0,
    }
}

#[test]
fn pre_tokenizer_variants_match_transformers() {
    let corpus = corpus();
    let mut failures = Vec::new();
    let mut total = 0;
    for row in read_jsonl("pre_variants_ids.jsonl") {
        let name = row["variant"].as_str().expect("variant");
        let pre = row["pre"].as_str().expect("pre");
        // transformers gives `deepseek-v3` GPT-2's regex; we take llama.cpp's three splits, the
        // real DeepSeek tokenizer's (`deepseek_v4_tokenizer.rs` checks them against it).
        if pre == "deepseek-v3" {
            continue;
        }
        let user_defined = ids(&row["user_defined"]);
        let tok =
            Tokenizer::from_gguf_metadata(&variant(pre, &user_defined).metadata, model_path())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        let expected = row["ids"].as_array().expect("ids");
        assert_eq!(expected.len(), corpus.len(), "fixture is stale");
        for (text, want) in corpus.iter().zip(expected) {
            total += 1;
            let ours = tok.encode(text, true).expect("encode");
            if ours != ids(want) {
                failures.push(format!(
                    "{name} {text:?}: ours {ours:?}, transformers {:?}",
                    ids(want)
                ));
            }
            assert_eq!(tok.decode(&ours, false).expect("decode"), *text, "{name}");
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn unknown_pre_tokenizer_is_a_typed_error() {
    let err = Tokenizer::from_gguf_metadata(&variant("klingon-bpe", &[]).metadata, "x.gguf")
        .expect_err("unknown pre");
    let msg = err.to_string();
    assert!(
        msg.contains("tokenizer.ggml.pre") && msg.contains("klingon-bpe") && msg.contains("x.gguf"),
        "{msg}"
    );
}

#[test]
fn from_gguf_reads_the_file() {
    let tok = Tokenizer::load(model_path()).expect("load detects GGUF");
    assert_eq!(
        tok.encode("Hello world", true).expect("encode"),
        [19556, 905]
    );
    let err = Tokenizer::from_gguf("/nonexistent/model.gguf").expect_err("missing file");
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
}

#[test]
fn add_bos_and_add_eos_match_transformers() {
    let rows = read_jsonl("add_bos_eos_ids.jsonl");
    let (header, rows) = rows.split_first().expect("header line");
    let base = content();
    let mut metadata = base.metadata.clone();
    for (key, value) in header["overrides"].as_object().expect("overrides") {
        let value = match value {
            serde_json::Value::Bool(b) => GgufValue::Bool(*b),
            serde_json::Value::String(s) => GgufValue::String(s.clone()),
            other => panic!("unexpected override {other}"),
        };
        metadata.insert(key.clone(), value);
    }
    let c = Content {
        magic: base.magic,
        metadata,
        tensor_infos: Default::default(),
        tensor_data_offset: 0,
    };
    let tok = Tokenizer::from_gguf_metadata(&c.metadata, "add_bos_eos.gguf").expect("builds");
    assert!(tok.add_bos() && tok.add_eos());
    for row in rows {
        let text = row["text"].as_str().expect("text");
        let want = ids(&row["ids"]);
        assert_eq!(tok.encode_prompt(text).expect("encode"), want, "{text:?}");
        // encode() never adds them: the same ids without the first and last.
        assert_eq!(
            tok.encode(text, true).expect("encode"),
            want[1..want.len() - 1],
            "{text:?}"
        );
    }
}
