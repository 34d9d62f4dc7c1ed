//! The tokenizer of a Hugging Face directory as GGUF metadata
//! (`tokenizer.ggml.*`), as llama.cpp's `convert_hf_to_gguf.py` writes it
//! for a byte-level BPE (`_set_vocab_gpt2`): `model = gpt2`, every id's
//! token up to the model's vocabulary (`[PAD<id>]` where the tokenizer has
//! none), its type (1 normal, 3 control for special added tokens, 4
//! user-defined for the other added tokens, 5 unused), the merges, the
//! `pre` name of the pre-tokenizer, bos/eos/unk/pad ids, `add_bos_token` /
//! `add_eos_token` and the chat template.
//!
//! `pre` is read off `tokenizer.json`'s pre-tokenizer: GPT-2's `ByteLevel`
//! (`gpt2`), SmolLM's `Digits` + `ByteLevel` (`smollm`), or a `Split` on one
//! of the regexes our GGUF tokenizer knows (`llama-bpe`, `qwen2`, `qwen35`,
//! `gpt-4o`, `tekken`) before a regex-less `ByteLevel`. The keys are then
//! proven: the tokenizer our loader builds from them must encode a check
//! text (llama.cpp's `chktxt`: whitespace runs, digits, emoji, CJK,
//! contractions) and the special tokens to the same ids as the directory's
//! own tokenizer, with the same bos/eos and `add_bos`. Anything else (a
//! WordLevel or Unigram tokenizer, an unknown split, a mismatch) writes no
//! tokenizer and says why in a `note:`, as before.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use ds4_gguf::Value;
use ds4_text::Tokenizer;
use ds4_text::tokenizer::pretokenizers::{
    DEEPSEEK3_SPLITS, GPT4O_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT, QWEN35_SPLIT, TEKKEN_SPLIT,
};
use serde_json::Value as Json;

/// llama.cpp's `chktxt` (`convert_hf_to_gguf_update.py`).
const CHECK_TEXT: &str = "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u{200d}🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL";

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The regex of an isolating, non-inverted `Split` pre-tokenizer.
fn isolated_split(v: &Json) -> Option<&str> {
    (v.get("type").and_then(Json::as_str) == Some("Split")
        && v.get("behavior").and_then(Json::as_str) == Some("Isolated")
        && v.get("invert").and_then(Json::as_bool) != Some(true))
    .then(|| v.get("pattern")?.get("Regex")?.as_str())
    .flatten()
}

/// The `tokenizer.ggml.pre` name of a `tokenizer.json` pre-tokenizer.
fn pre_name(pre: &Json) -> Option<&'static str> {
    fn ty(v: &Json) -> &str {
        v.get("type").and_then(Json::as_str).unwrap_or("")
    }
    let use_regex = |v: &Json| v.get("use_regex").and_then(Json::as_bool).unwrap_or(true);
    match ty(pre) {
        "ByteLevel" if use_regex(pre) => Some("gpt2"),
        "Sequence" => {
            let parts = pre.get("pretokenizers")?.as_array()?;
            let (last, splits) = parts.split_last()?;
            match splits {
                [d] if ty(d) == "Digits"
                    && d.get("individual_digits").and_then(Json::as_bool) == Some(true)
                    && ty(last) == "ByteLevel"
                    && use_regex(last) =>
                {
                    Some("smollm")
                }
                _ if ty(last) != "ByteLevel" || use_regex(last) => None,
                [s] => {
                    let regex = isolated_split(s)?;
                    [
                        ("llama-bpe", LLAMA3_SPLIT),
                        ("qwen2", QWEN2_SPLIT),
                        ("qwen35", QWEN35_SPLIT),
                        ("gpt-4o", GPT4O_SPLIT),
                        ("tekken", TEKKEN_SPLIT),
                    ]
                    .into_iter()
                    .find(|(_, r)| *r == regex)
                    .map(|(n, _)| n)
                }
                // DeepSeek-V3/V4: three splits in turn, llama.cpp's `deepseek-v3`.
                _ => splits
                    .iter()
                    .map(isolated_split)
                    .collect::<Option<Vec<&str>>>()
                    .filter(|r| r.as_slice() == DEEPSEEK3_SPLITS)
                    .map(|_| "deepseek-v3"),
            }
        }
        _ => None,
    }
}

/// `tokenizer.ggml.*` for the directory `dir` and a model of `vocab_size`
/// rows; `Ok(None)` (and a note on stderr) when the directory has no
/// tokenizer this can write and prove.
pub fn metadata(dir: &Path, vocab_size: usize) -> Result<Option<Vec<(String, Value)>>> {
    let json_path = dir.join("tokenizer.json");
    if !json_path.is_file() {
        eprintln!(
            "note: {}: no tokenizer.json; the GGUF has no tokenizer",
            dir.display()
        );
        return Ok(None);
    }
    match build(dir, vocab_size)? {
        Ok(m) => Ok(Some(m)),
        Err(why) => {
            eprintln!(
                "note: {}: the tokenizer is not written to the GGUF: {why}",
                json_path.display()
            );
            Ok(None)
        }
    }
}

/// `Err(Ok(why))`-style: the outer error is an unreadable file, the inner
/// one a tokenizer this conversion does not cover.
fn build(dir: &Path, vocab_size: usize) -> Result<Result<Vec<(String, Value)>, String>> {
    let json_path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&json_path)
        .with_context(|| format!("reading {}", json_path.display()))?;
    let json: Json = serde_json::from_str(&text)
        .with_context(|| format!("{}: not JSON", json_path.display()))?;
    let model = &json["model"];
    let model_type = model.get("type").and_then(Json::as_str).unwrap_or("?");
    if model_type != "BPE" {
        return Ok(Err(format!(
            "a {model_type} model (only byte-level BPE has a GGUF form here)"
        )));
    }
    let Some(pre) = pre_name(&json["pre_tokenizer"]) else {
        return Ok(Err(format!(
            "pre-tokenizer {} has no tokenizer.ggml.pre name known here",
            json["pre_tokenizer"]
        )));
    };
    let hf = match Tokenizer::from_hf_dir(dir) {
        Ok(t) => t,
        Err(e) => return Ok(Err(format!("the directory's tokenizer does not load: {e}"))),
    };

    // Every id's token and type, as `_set_vocab_gpt2`.
    let mut by_id: HashMap<u32, (String, i32)> = HashMap::new();
    if let Some(vocab) = model.get("vocab").and_then(Json::as_object) {
        for (tok, id) in vocab {
            if let Some(id) = id.as_u64().and_then(|i| u32::try_from(i).ok()) {
                by_id.insert(id, (tok.clone(), NORMAL));
            }
        }
    }
    for a in json["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (
            a.get("id")
                .and_then(Json::as_u64)
                .and_then(|i| u32::try_from(i).ok()),
            a.get("content").and_then(Json::as_str),
        ) else {
            continue;
        };
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        by_id.insert(
            id,
            (
                content.to_string(),
                if special { CONTROL } else { USER_DEFINED },
            ),
        );
    }
    if let Some(max) = by_id.keys().max()
        && *max as usize >= vocab_size
    {
        return Ok(Err(format!(
            "token id {max} is outside the model's vocabulary of {vocab_size} (config.json vocab_size)"
        )));
    }
    let (mut tokens, mut types) = (
        Vec::with_capacity(vocab_size),
        Vec::with_capacity(vocab_size),
    );
    for id in 0..vocab_size as u32 {
        match by_id.remove(&id) {
            Some((t, ty)) => {
                tokens.push(Value::String(t));
                types.push(Value::I32(ty));
            }
            None => {
                tokens.push(Value::String(format!("[PAD{id}]")));
                types.push(Value::I32(UNUSED));
            }
        }
    }
    let merges = model
        .get("merges")
        .and_then(Json::as_array)
        .map(|m| {
            m.iter()
                .map(|x| match x {
                    Json::String(s) => Some(s.clone()),
                    Json::Array(p) => match p.as_slice() {
                        [Json::String(a), Json::String(b)] => Some(format!("{a} {b}")),
                        _ => None,
                    },
                    _ => None,
                })
                .collect::<Option<Vec<String>>>()
        })
        .unwrap_or(Some(Vec::new()));
    let Some(merges) = merges else {
        bail!(
            "{}: a merge is neither \"a b\" nor [a, b]",
            json_path.display()
        );
    };

    let mut m: Vec<(String, Value)> = vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.into_iter().map(Value::String).collect()),
        ),
    ];
    if let Some(t) = hf.bos_token() {
        m.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(t.id)));
    }
    if let Some(t) = hf.eos_token() {
        m.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(t.id)));
    }
    let config = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<Json>(&s).ok())
        .unwrap_or(Json::Null);
    for (key, field) in [
        ("tokenizer.ggml.unknown_token_id", "unk_token"),
        ("tokenizer.ggml.padding_token_id", "pad_token"),
    ] {
        let text = match config.get(field) {
            Some(Json::String(s)) => Some(s.as_str()),
            Some(o) => o.get("content").and_then(Json::as_str),
            None => None,
        };
        if let Some(id) = text.and_then(|t| hf.token_to_id(t)) {
            m.push((key.into(), Value::U32(id)));
        }
    }
    m.push((
        "tokenizer.ggml.add_bos_token".into(),
        Value::Bool(hf.add_bos()),
    ));
    m.push((
        "tokenizer.ggml.add_eos_token".into(),
        Value::Bool(hf.add_eos()),
    ));
    if let Some(t) = hf.chat_template() {
        m.push(("tokenizer.chat_template".into(), Value::String(t.into())));
    }

    // The proof: our GGUF tokenizer from these keys against the directory's.
    let map: HashMap<String, Value> = m.iter().cloned().collect();
    let gguf = match Tokenizer::from_gguf_metadata(&map, dir) {
        Ok(t) => t,
        Err(e) => return Ok(Err(format!("the keys do not load: {e}"))),
    };
    let specials: String = [hf.bos_token(), hf.eos_token()]
        .into_iter()
        .flatten()
        .map(|t| format!("{} x{}", t.text, t.text))
        .collect();
    for (what, text, parse) in [
        ("the check text", CHECK_TEXT, false),
        ("the special tokens", specials.as_str(), true),
    ] {
        let (a, b) = (hf.encode(text, parse), gguf.encode(text, parse));
        match (a, b) {
            (Ok(a), Ok(b)) if a == b => {}
            (Ok(a), Ok(b)) => {
                let at = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
                return Ok(Err(format!(
                    "{what} encodes differently from the GGUF keys (pre = {pre}): first difference at token {at} of {}",
                    a.len()
                )));
            }
            (Err(e), _) | (_, Err(e)) => return Ok(Err(format!("encoding {what}: {e}"))),
        }
    }
    let id = |t: Option<&ds4_text::tokenizer::SpecialToken>| t.map(|t| t.id);
    if id(hf.bos_token()) != id(gguf.bos_token())
        || id(hf.eos_token()) != id(gguf.eos_token())
        || hf.add_bos() != gguf.add_bos()
    {
        return Ok(Err("bos/eos or add_bos differ once read back".into()));
    }
    eprintln!(
        "tokenizer: {} -> tokenizer.ggml.* (gpt2, pre = {pre}, {vocab_size} tokens, checked against the directory's)",
        json_path.display()
    );
    Ok(Ok(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_tokenizers_map_to_llama_cpp_names() {
        let j = |s: &str| serde_json::from_str::<Json>(s).unwrap();
        assert_eq!(
            pre_name(&j(r#"{"type":"ByteLevel","add_prefix_space":false}"#)),
            Some("gpt2")
        );
        assert_eq!(
            pre_name(&j(r#"{"type":"ByteLevel","use_regex":false}"#)),
            None
        );
        assert_eq!(
            pre_name(&j(
                r#"{"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},{"type":"ByteLevel","use_regex":true}]}"#
            )),
            Some("smollm")
        );
        let split = |r: &str| {
            serde_json::json!({"type":"Sequence","pretokenizers":[
                {"type":"Split","pattern":{"Regex":r},"behavior":"Isolated","invert":false},
                {"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]})
        };
        assert_eq!(pre_name(&split(LLAMA3_SPLIT)), Some("llama-bpe"));
        assert_eq!(pre_name(&split(QWEN2_SPLIT)), Some("qwen2"));
        assert_eq!(pre_name(&split(r"\s+")), None);
        let mut deepseek: Vec<Json> = DEEPSEEK3_SPLITS
            .iter()
            .map(|r| serde_json::json!({"type":"Split","pattern":{"Regex":r},"behavior":"Isolated","invert":false}))
            .collect();
        deepseek.push(
            serde_json::json!({"type":"ByteLevel","add_prefix_space":false,"use_regex":false}),
        );
        let seq = |p: &[Json]| serde_json::json!({"type":"Sequence","pretokenizers":p});
        assert_eq!(pre_name(&seq(&deepseek)), Some("deepseek-v3"));
        // The same splits in another order are not llama.cpp's.
        deepseek.swap(0, 1);
        assert_eq!(pre_name(&seq(&deepseek)), None);
        assert_eq!(pre_name(&j(r#"{"type":"WhitespaceSplit"}"#)), None);
    }

    /// DeepSeek-V4's real tokenizer (three splits) converts as llama.cpp's
    /// `deepseek-v3` and passes the proof: the check text and the special
    /// tokens encode as the directory's tokenizer encodes them.
    #[test]
    fn deepseek_v4s_tokenizer_is_written_and_proven() {
        let dir = ds4_models::deepseek_v4_tokenizer_dir()
            .expect("the DeepSeek-V4 tokenizer (pulled with pip, as for the other DeepSeek tests)");
        let m = build(&dir, 129_280)
            .expect("readable")
            .unwrap_or_else(|why| panic!("not written: {why}"));
        let get = |k: &str| m.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        assert!(matches!(get("tokenizer.ggml.pre"), Some(Value::String(s)) if s == "deepseek-v3"));
        assert!(
            matches!(get("tokenizer.ggml.tokens"), Some(Value::Array(t)) if t.len() == 129_280)
        );
        // Its added tokens outside the byte-level alphabet (a conversation's
        // markers, DSML) are matched whole, as the directory's are.
        let map: HashMap<String, Value> = m.iter().cloned().collect();
        let gguf = Tokenizer::from_gguf_metadata(&map, &dir).expect("keys load");
        let hf = Tokenizer::from_hf_dir(&dir).expect("directory loads");
        let chat = "<｜begin▁of▁sentence｜>You are terse.<｜User｜>Hi 12345 我想在apple工作<｜Assistant｜><think>ok</think>Hello!<｜end▁of▁sentence｜><｜fim▁hole｜>";
        for parse in [true, false] {
            assert_eq!(
                gguf.encode(chat, parse).unwrap(),
                hf.encode(chat, parse).unwrap(),
                "parse_special = {parse}"
            );
        }
    }
}
