//! The token environment of every family's real tokenizer (the default
//! model's GGUF, the qwen4_exp and glm5_next fixtures, DeepSeek-V4's
//! `tokenizer.json`): each vocabulary's bytes spell the text its tokens
//! decode to, and a compiled grammar allows exactly the tokens of a valid
//! text, position by position, then a stop token.

use std::path::PathBuf;
use std::sync::Arc;

use ds4_constraint::{ConstraintError, Grammar, Vocabulary};
use ds4_text::{TokenBytes, Tokenizer};
use serde_json::json;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn default_model_tokenizer() -> Arc<Tokenizer> {
    let path = ds4_models::default_model_path().expect("default model available");
    Arc::new(Tokenizer::load(path).unwrap())
}

/// The bytes of `ids` concatenated.
fn spelled(bytes: &[TokenBytes], ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&i| match &bytes[i as usize] {
            TokenBytes::Text(b) => b.clone(),
            other => panic!("token {i} is {other:?}"),
        })
        .collect()
}

/// Walk `text`'s tokens through a constraint compiled from `grammar`: each
/// token is allowed where it stands, and a stop token is allowed after.
fn walk(vocab: &Vocabulary, tok: &Tokenizer, grammar: &Grammar, text: &str) {
    let mut c = vocab.compile(grammar).unwrap();
    let ids = tok.encode(text, false).unwrap();
    for &t in &ids {
        let mask = c.allowed_after(&[]);
        assert!(
            mask.allows(t),
            "{text:?}: token {t} refused after {:?}",
            c.emitted()
        );
        c.push(t);
    }
    let end = c.allowed_after(&[]);
    assert!(
        vocab.stop_ids().iter().any(|&s| end.allows(s)),
        "{text:?}: no stop"
    );
    assert!(c.error().is_none());
}

#[test]
fn the_default_model_vocabulary_spells_its_text_default_model() {
    let tok = default_model_tokenizer();
    let bytes = tok.token_bytes();
    assert_eq!(bytes.len(), tok.vocab_size());
    for text in [
        "{\"a\": [1, 2.5, \"é€😀\"]}\n",
        " hello  world\t!",
        "naïve café",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(spelled(&bytes, &ids), text.as_bytes(), "{text:?}");
    }
    let vocab = Vocabulary::new(tok.clone(), tok.stop_token_ids()).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": false
    });
    walk(
        &vocab,
        &tok,
        &Grammar::JsonSchema(schema),
        "{\"name\": \"Ada\", \"n\": 36}",
    );
    walk(
        &vocab,
        &tok,
        &Grammar::JsonObject,
        "{\"x\": {\"y\": [true, null]}}",
    );
    walk(
        &vocab,
        &tok,
        &Grammar::Regex("[a-z]+ [0-9]{2}".into()),
        "hello 42",
    );
    // A JSON value that breaks the schema is refused at the first token
    // that cannot lead to a valid text.
    let mut c = vocab
        .compile(&Grammar::JsonSchema(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        ))
        .unwrap();
    let ids = tok.encode("{\"n\": \"x\"}", false).unwrap();
    let refused = ids.iter().any(|&t| {
        let ok = c.allowed_after(&[]).allows(t);
        c.push(t);
        !ok
    });
    assert!(refused);
}

#[test]
fn fixture_and_deepseek_vocabularies_back_grammars() {
    let qwen = Arc::new(Tokenizer::from_hf_dir(fixtures().join("qwen4_exp/tiny_a")).unwrap());
    let vocab = Vocabulary::new(qwen.clone(), qwen.stop_token_ids()).unwrap();
    let bytes = qwen.token_bytes();
    assert_eq!(bytes[5], TokenBytes::Text(b" w5".to_vec()));
    assert_eq!(bytes[2], TokenBytes::Special("</s>".into()));
    let ids = qwen.encode("w12 w7 w100", false).unwrap();
    assert_eq!(ids, vec![12, 7, 100]);
    walk(
        &vocab,
        &qwen,
        &Grammar::Regex("( w1[0-9])* w7( w[0-9]+)?".into()),
        "w12 w7 w100",
    );

    let glm_dir = fixtures().join("glm5_next/tiny_a");
    let glm = Arc::new(Tokenizer::from_hf_dir(&glm_dir).unwrap());
    let vocab = Vocabulary::new(glm.clone(), glm.stop_token_ids()).unwrap();
    assert_eq!(vocab.len(), glm.vocab_size());

    let ds = ds4_models::deepseek_v4_tokenizer_dir().expect("DeepSeek-V4 tokenizer available");
    let ds = Arc::new(Tokenizer::from_hf_dir(ds).unwrap());
    let bytes = ds.token_bytes();
    let text = "{\"city\": \"Zürich\", \"days\": 3}";
    assert_eq!(
        spelled(&bytes, &ds.encode(text, false).unwrap()),
        text.as_bytes()
    );
    let vocab = Vocabulary::new(ds.clone(), ds.stop_token_ids()).unwrap();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"]});
    walk(&vocab, &ds, &Grammar::JsonSchema(schema), text);
}

#[test]
fn what_the_engine_cannot_compile_is_named() {
    let qwen = Arc::new(Tokenizer::from_hf_dir(fixtures().join("qwen4_exp/tiny_a")).unwrap());
    let vocab = Vocabulary::new(qwen.clone(), qwen.stop_token_ids()).unwrap();
    let unsupported = vocab
        .compile(&Grammar::JsonSchema(
            json!({"type": "object", "not": {"required": ["a"]}}),
        ))
        .unwrap_err();
    assert!(
        matches!(&unsupported, ConstraintError::Unsupported(m) if m.contains("not")),
        "{unsupported:?}"
    );
    let invalid = vocab
        .compile(&Grammar::Lark("start: (".into()))
        .unwrap_err();
    assert!(
        matches!(invalid, ConstraintError::Invalid(_)),
        "{invalid:?}"
    );
    let invalid = vocab.compile(&Grammar::JsonSchema(json!([1]))).unwrap_err();
    assert!(
        invalid.to_string().contains("object or a boolean"),
        "{invalid}"
    );
}

/// One forced call in each family's format, walked token by token (special
/// tokens parsed as the model would emit them) through its grammar.
#[test]
fn forced_calls_follow_each_family_format() {
    use ds4_constraint::{ForcedTool, tool_call_grammar};
    use ds4_text::ToolCallFormat;
    let tool = ForcedTool {
        name: "get_weather".into(),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}),
    };
    let ds = ds4_models::deepseek_v4_tokenizer_dir().expect("DeepSeek-V4 tokenizer available");
    let ds = Arc::new(Tokenizer::from_hf_dir(ds).unwrap());
    let glm = Arc::new(Tokenizer::from_hf_dir(fixtures().join("glm5_next/tiny_a")).unwrap());
    let qwen = ds4_models::qwen3_5_tokenizer_dir().expect("Qwen3.5 tokenizer available");
    let qwen = Arc::new(Tokenizer::from_hf_dir(qwen).unwrap());
    let cases = [
        (
            qwen,
            ToolCallFormat::QwenXml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n4\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            ds.clone(),
            ToolCallFormat::Dsml,
            "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        ),
        (
            ds.clone(),
            ToolCallFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        ),
        (
            ds.clone(),
            ToolCallFormat::Llama3Json,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 2}}",
        ),
        // The GLM fixture's vocabulary is word-level (it cannot spell the
        // markup), so the format is walked on a byte-level vocabulary; the
        // fixture's own vocabulary still compiles it (below).
        (
            ds.clone(),
            ToolCallFormat::Glm,
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>",
        ),
    ];
    for (tok, format, text) in cases {
        let vocab = Vocabulary::new(tok.clone(), tok.stop_token_ids()).unwrap();
        let grammar = tool_call_grammar(format, std::slice::from_ref(&tool)).unwrap();
        let mut c = vocab.compile(&grammar).unwrap();
        // The grammar spells markup as text: Qwen's `<tool_call>` special
        // token is not forced (its bytes are; the parser reads the text).
        let ids = tok.encode(text, format != ToolCallFormat::QwenXml).unwrap();
        for &t in &ids {
            assert!(
                c.allowed_after(&[]).allows(t),
                "{format:?}: {t} refused after {:?}",
                c.emitted()
            );
            c.push(t);
        }
        let end = c.allowed_after(&[]);
        assert!(
            vocab.stop_ids().iter().any(|&s| end.allows(s)),
            "{format:?}: no stop"
        );
    }
    let vocab = Vocabulary::new(glm.clone(), glm.stop_token_ids()).unwrap();
    let grammar = tool_call_grammar(ToolCallFormat::Glm, std::slice::from_ref(&tool)).unwrap();
    vocab.compile(&grammar).unwrap();
}
