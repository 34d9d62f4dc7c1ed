//! Loading a Hugging Face directory. No HF checkpoint is stored here, so the test writes one:
//! `tokenizer.json` serialized from the GGUF-built tokenizer, plus hand-written config files.
//! Ids are still checked against transformers' fixture ids.

mod common;

use common::{ids, read_jsonl, tokenizer};
use ds4_text::Tokenizer;

fn write_dir(
    config: &str,
    generation: Option<&str>,
    template_file: Option<&str>,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    tokenizer()
        .inner()
        .save(dir.path().join("tokenizer.json"), false)
        .expect("save tokenizer.json");
    std::fs::write(dir.path().join("tokenizer_config.json"), config).expect("write config");
    if let Some(g) = generation {
        std::fs::write(dir.path().join("generation_config.json"), g)
            .expect("write generation config");
    }
    if let Some(t) = template_file {
        std::fs::write(dir.path().join("chat_template.jinja"), t).expect("write template");
    }
    dir
}

#[test]
fn hf_dir_reads_config_and_matches_transformers_ids() {
    let dir = write_dir(
        r#"{"bos_token": {"content": "<|im_start|>", "special": true}, "eos_token": "<|im_end|>",
            "chat_template": "{{ messages[0]['content'] }}"}"#,
        Some(r#"{"eos_token_id": [2, 5]}"#),
        None,
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).expect("loads");
    assert_eq!(tok.bos_token().map(|t| t.id), Some(1));
    assert_eq!(tok.eos_token().map(|t| t.text.as_str()), Some("<|im_end|>"));
    assert_eq!(tok.chat_template(), Some("{{ messages[0]['content'] }}"));
    assert_eq!(
        tok.stop_token_ids(),
        [2, 5, 0],
        "eos, generation_config ids, <|endoftext|>"
    );
    assert!(
        !tok.add_bos(),
        "no flag and the post-processor adds nothing"
    );
    for row in read_jsonl("smollm_gguf_ids.jsonl") {
        let text = row["text"].as_str().expect("text");
        assert_eq!(
            tok.encode_prompt(text).expect("encode"),
            ids(&row["ids"]),
            "{text:?}"
        );
    }
}

#[test]
fn explicit_add_bos_rebuilds_the_post_processor_and_template_file_wins() {
    let dir = write_dir(
        r#"{"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": true,
            "chat_template": [{"name": "default", "template": "from config"}]}"#,
        None,
        Some("from file"),
    );
    let tok = Tokenizer::from_hf_dir(dir.path()).expect("loads");
    assert!(tok.add_bos());
    assert_eq!(
        tok.encode_prompt("Hello world").expect("encode"),
        [1, 19556, 905]
    );
    assert_eq!(
        tok.encode("Hello world", true).expect("encode"),
        [19556, 905]
    );
    assert_eq!(tok.chat_template(), Some("from file"));
}

#[test]
fn named_template_list_and_missing_files() {
    let dir = write_dir(
        r#"{"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]}"#,
        None,
        None,
    );
    let tok = Tokenizer::load(dir.path()).expect("loads");
    assert_eq!(tok.chat_template(), Some("d"));
    assert_eq!(tok.bos_token(), None);

    let bare = Tokenizer::load(dir.path().join("tokenizer.json")).expect("loads");
    assert_eq!(
        bare.eos_token().map(|t| t.text.as_str()),
        Some("<|endoftext|>")
    );
    assert!(
        bare.kind().starts_with("tokenizer.json BPE"),
        "{}",
        bare.kind()
    );

    let empty = tempfile::tempdir().expect("tempdir");
    let err = Tokenizer::from_hf_dir(empty.path()).expect_err("no tokenizer.json");
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    std::fs::write(dir.path().join("tokenizer_config.json"), "{not json").expect("write");
    let err = Tokenizer::from_hf_dir(dir.path()).expect_err("bad json");
    assert!(err.to_string().contains("tokenizer_config.json"), "{err}");
}
