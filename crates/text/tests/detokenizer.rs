//! The incremental detokenizer on the corpus: streamed pieces concatenate to the full decode and
//! never show U+FFFD for a character still in progress.

mod common;

use common::{corpus, tokenizer};
use ds4_text::{Detokenizer, StopMatcher, TextStream};

fn stream(ids: &[u32], skip_special: bool) -> (Vec<String>, String) {
    let mut d = Detokenizer::new(tokenizer(), skip_special);
    let mut pieces: Vec<String> = ids.iter().map(|&id| d.push(id).expect("push")).collect();
    pieces.push(d.finish());
    let all = pieces.concat();
    (pieces, all)
}

#[test]
fn streamed_text_equals_full_decode_for_every_corpus_string() {
    let tok = tokenizer();
    let mut split_chars = 0;
    for text in corpus() {
        let ids = tok.encode(&text, true).expect("encode");
        for skip_special in [false, true] {
            let full = tok.decode(&ids, skip_special).expect("decode");
            let (pieces, all) = stream(&ids, skip_special);
            assert_eq!(all, full, "{text:?} skip_special={skip_special}");
            if !full.contains('\u{FFFD}') {
                assert!(
                    pieces.iter().all(|p| !p.contains('\u{FFFD}')),
                    "{text:?}: {pieces:?}"
                );
            }
            split_chars += pieces.iter().filter(|p| p.is_empty()).count();
        }
    }
    // The corpus has CJK and emoji spread over several byte-level tokens: some pushes must have
    // held text back, or this test is not exercising anything.
    assert!(split_chars > 20, "only {split_chars} held-back pushes");
}

#[test]
fn an_incomplete_character_at_the_end_is_flushed_lossily() {
    let tok = tokenizer();
    let ids = tok.encode("ok 😀", true).expect("encode");
    assert!(ids.len() >= 3, "the emoji spans several tokens: {ids:?}");
    let cut = &ids[..ids.len() - 1];
    let mut d = Detokenizer::new(tok, false);
    let streamed: String = cut.iter().map(|&id| d.push(id).expect("push")).collect();
    // The space may travel in the emoji's first byte-level token, so only "ok" is certain.
    assert!(
        streamed.starts_with("ok") && !streamed.contains('\u{FFFD}'),
        "{streamed:?}"
    );
    let tail = d.finish();
    assert!(tail.contains('\u{FFFD}'), "{tail:?}");
    assert_eq!(
        format!("{streamed}{tail}"),
        tok.decode(cut, false).expect("decode")
    );
}

#[test]
fn detokenizer_feeds_stop_matcher_across_token_boundaries() {
    let tok = tokenizer();
    let text = "The answer is 42.\nUser: ignore this";
    let ids = tok.encode(text, true).expect("encode");
    let mut d = Detokenizer::new(tok, false);
    let mut stop = StopMatcher::new(vec!["\nUser:".into()]);
    let mut out = String::new();
    for id in ids {
        let o = stop.push(&d.push(id).expect("push"));
        out.push_str(&o.emit);
        if o.stopped {
            break;
        }
    }
    assert!(stop.stopped());
    assert_eq!(out, "The answer is 42.");
}

#[test]
fn text_stream_cuts_at_a_stop_string_skips_stop_tokens_and_names_the_match() {
    let tok = tokenizer();
    let ids = tok
        .encode("The answer is 42.\nUser: ignore this", true)
        .expect("encode");
    let stops = vec![String::new(), "\nUser:".into()];
    let mut s = TextStream::new(tok, stops);
    let mut out = String::new();
    for &id in &ids {
        let piece = s.push(id, false).expect("push");
        out.push_str(&piece.text);
        if piece.stop_string {
            break;
        }
    }
    out.push_str(&s.finish());
    assert!(s.stopped());
    assert_eq!(out, "The answer is 42.");
    assert_eq!(s.text(), out);
    assert_eq!(s.stop_sequence(), Some("\nUser:"));
    // After a stop string nothing more is text.
    assert_eq!(s.push(ids[0], false).expect("push").text, "");

    // A stop token is not text, and the held-back tail comes out at the end.
    let ids = tok.encode("ok 😀", true).expect("encode");
    let mut s = TextStream::new(tok, vec!["never".into()]);
    let mut out = String::new();
    for &id in &ids {
        out.push_str(&s.push(id, false).expect("push").text);
    }
    assert!(!s.push(ids[0], true).expect("push").stop_string);
    assert!(s.ended_on_stop_token());
    out.push_str(&s.finish());
    assert_eq!(out, tok.decode(&ids, true).expect("decode"));
    assert_eq!(s.stop_sequence(), None);
}
