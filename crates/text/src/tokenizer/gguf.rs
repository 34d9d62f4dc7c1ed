//! Builds a [`Tokenizer`] from GGUF metadata (`tokenizer.ggml.*`), the way transformers does
//! when it loads a GGUF with `gguf_file=` (`integrations/gguf/gguf_tokenizer_mapping.py`):
//!
//! * `tokenizer.ggml.model = gpt2`: byte-level BPE over `tokens` and `merges`. A token written
//!   outside the byte-level alphabet (a few files store raw text) is respelled byte by byte.
//! * the pre-tokenizer named by `tokenizer.ggml.pre` ([`super::pretokenizers`]).
//! * `ByteLevel` decoder, no normalizer.
//! * token type 3 (control) → special added tokens, but only those spelled in the byte-level
//!   alphabet (others are llama.cpp mislabels); type 4 (user-defined) → plain added tokens, matched
//!   whole in the text; then bos/eos/unk/pad as special, as transformers' tokenizer base does.
//! * `add_bos_token`/`add_eos_token` → a post-processor that adds them when asked to add special
//!   tokens (transformers' `update_post_processor`).
//!
//! Only metadata is read, never tensor data.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use super::pretokenizers;
use super::{SpecialToken, Tokenizer, TokenizerParts};
use crate::error::{Result, TextError};

const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// Typed access to the metadata map, with errors naming the file and key.
struct Meta<'a> {
    map: &'a HashMap<String, Value>,
    path: &'a Path,
}

impl<'a> Meta<'a> {
    fn wrong(&self, key: &str, expected: &'static str) -> TextError {
        TextError::WrongType {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            expected,
        }
    }

    fn missing(&self, key: &str) -> TextError {
        TextError::MissingKey {
            path: self.path.to_path_buf(),
            key: key.to_string(),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&'a str>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(key, "string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.map.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong(key, "bool")),
        }
    }

    /// Token ids are stored as u32 by llama.cpp, but any integer type is accepted.
    fn id(&self, key: &str) -> Result<Option<u32>> {
        let Some(v) = self.map.get(key) else {
            return Ok(None);
        };
        int(v)
            .and_then(|i| u32::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| self.wrong(key, "non-negative integer"))
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(v) = self.map.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = v else {
            return Err(self.wrong(key, "array of strings"));
        };
        items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.as_str()),
                _ => Err(self.wrong(key, "array of strings")),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.map.get(key) else {
            return Ok(None);
        };
        let Value::Array(items) = v else {
            return Err(self.wrong(key, "array of integers"));
        };
        items
            .iter()
            .map(|item| int(item).ok_or_else(|| self.wrong(key, "array of integers")))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

fn int(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

/// GPT-2's byte → printable char table (`bytes_to_unicode`): printable Latin-1 bytes stand for
/// themselves, the other 68 are shifted to U+0100 onwards in byte order.
pub(crate) fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let b = b as u32;
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let code = if printable {
            b
        } else {
            shifted += 1;
            255 + shifted
        };
        // Every code here is below U+0200, always a valid char.
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// Whether every char of `token` is one of the 256 in [`bytes_to_unicode`]: the printable ranges
/// and U+0100..=U+0143 (the 68 shifted bytes). Arithmetic, not a table scan: this runs on every
/// vocabulary entry.
fn in_alphabet(token: &str) -> bool {
    token
        .chars()
        .all(|c| matches!(c as u32, 33..=126 | 161..=172 | 174..=323))
}

/// Reads the GGUF header and metadata (from a memory map; tensor data is
/// never touched) and builds the tokenizer. The container parser knows every
/// GGML type id, so a model whose weights use types candle lacks (ds4's
/// IQ2_XXS experts) still gives its tokenizer.
pub(crate) fn from_gguf(path: &Path) -> Result<Tokenizer> {
    let gguf = ds4_gguf::Gguf::open(path).map_err(|e| TextError::GgufRead {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    from_gguf_metadata(&gguf.metadata, path)
}

/// Builds the tokenizer from already-read metadata; `path` only labels errors.
pub(crate) fn from_gguf_metadata(
    metadata: &HashMap<String, Value>,
    path: &Path,
) -> Result<Tokenizer> {
    let meta = Meta {
        map: metadata,
        path,
    };
    let model_key = "tokenizer.ggml.model";
    let model = meta
        .string(model_key)?
        .ok_or_else(|| meta.missing(model_key))?;
    if model != "gpt2" {
        return Err(TextError::Unsupported {
            path: path.to_path_buf(),
            key: model_key.into(),
            value: model.into(),
            supported: "gpt2 (byte-level BPE)".into(),
        });
    }
    // llama.cpp and transformers both treat a missing `pre` as the GPT-2 default.
    let pre_key = "tokenizer.ggml.pre";
    let pre = meta.string(pre_key)?.unwrap_or("default");
    let split = pretokenizers::pre_split(pre).ok_or_else(|| TextError::Unsupported {
        path: path.to_path_buf(),
        key: pre_key.into(),
        value: pre.into(),
        supported: pretokenizers::supported_names(),
    })?;

    let tokens_key = "tokenizer.ggml.tokens";
    let tokens = meta
        .strings(tokens_key)?
        .ok_or_else(|| meta.missing(tokens_key))?;
    let merges_key = "tokenizer.ggml.merges";
    let merge_lines = meta
        .strings(merges_key)?
        .ok_or_else(|| meta.missing(merges_key))?;
    let types = meta.ints("tokenizer.ggml.token_type")?.unwrap_or_default();

    let table = bytes_to_unicode();
    let type_of = |id: usize| types.get(id).copied().unwrap_or(1);
    // Where we follow llama.cpp's split (`deepseek-v3`), its added tokens
    // are llama.cpp's too: a control or user-defined token is matched whole
    // by its raw text whatever its spelling (DeepSeek's `<｜User｜>` is outside
    // the byte-level alphabet), not respelled and dropped as transformers
    // does.
    let raw_added = |id: usize, token: &str| {
        pretokenizers::added_tokens_as_llama_cpp(split)
            && matches!(type_of(id), TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED)
            && !in_alphabet(token)
    };
    let mut vocab = Vocab::default();
    for (i, token) in tokens.iter().enumerate() {
        let id = u32::try_from(i).map_err(|_| TextError::InvalidMetadata {
            path: path.to_path_buf(),
            key: tokens_key.into(),
            message: "more than 2^32 tokens".into(),
        })?;
        let spelled = if in_alphabet(token) || raw_added(i, token) {
            (*token).to_string()
        } else {
            token.bytes().map(|b| table[usize::from(b)]).collect()
        };
        // As in transformers' dict comprehension, a later duplicate wins.
        vocab.insert(spelled, id);
    }
    let merges = merge_lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            line.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| TextError::InvalidMetadata {
                    path: path.to_path_buf(),
                    key: merges_key.into(),
                    message: format!("merge {i} {line:?} is not two tokens separated by a space"),
                })
        })
        .collect::<Result<Vec<_>>>()?;

    let build_err = |message: String| TextError::Build {
        path: path.to_path_buf(),
        message,
    };
    // GPT2Tokenizer's BPE: no dropout, no unk, empty (not absent) prefix/suffix, no fusing.
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .continuing_subword_prefix(String::new())
        .end_of_word_suffix(String::new())
        .fuse_unk(false)
        .build()
        .map_err(|e| build_err(format!("BPE: {e}")))?;
    let mut inner = HfTokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(pretokenizers::build(split).map_err(build_err)?));
    inner.with_decoder(Some(ByteLevel::default()));

    let control: Vec<AddedToken> = tokens
        .iter()
        .enumerate()
        .filter(|&(id, t)| {
            type_of(id) == TOKEN_TYPE_CONTROL && (in_alphabet(t) || raw_added(id, t))
        })
        .map(|(_, t)| AddedToken::from(*t, true).normalized(false))
        .collect();
    inner
        .add_special_tokens(control)
        .map_err(|e| build_err(format!("control tokens: {e}")))?;
    // transformers checks `token in tokenizer.get_vocab()`, i.e. the spelled vocabulary.
    let user_defined: Vec<AddedToken> = tokens
        .iter()
        .enumerate()
        .filter(|&(id, t)| type_of(id) == TOKEN_TYPE_USER_DEFINED && inner.token_to_id(t).is_some())
        .map(|(_, t)| AddedToken::from(*t, false).normalized(false))
        .collect();
    inner
        .add_tokens(user_defined)
        .map_err(|e| build_err(format!("user-defined tokens: {e}")))?;

    let named = |key: &str| -> Result<Option<SpecialToken>> {
        let Some(id) = meta.id(key)? else {
            return Ok(None);
        };
        let text = tokens
            .get(id as usize)
            .ok_or_else(|| TextError::InvalidMetadata {
                path: path.to_path_buf(),
                key: key.into(),
                message: format!("id {id} is outside the {}-token vocabulary", tokens.len()),
            })?;
        Ok(Some(SpecialToken {
            text: (*text).to_string(),
            id,
        }))
    };
    let bos = named("tokenizer.ggml.bos_token_id")?;
    let eos = named("tokenizer.ggml.eos_token_id")?;
    let unk = named("tokenizer.ggml.unknown_token_id")?;
    let pad = named("tokenizer.ggml.padding_token_id")?;
    let eot = named("tokenizer.ggml.eot_token_id")?;
    let eom = named("tokenizer.ggml.eom_token_id")?;
    // transformers' tokenizer base adds its named special tokens that are not added tokens yet.
    let added = inner.get_added_vocabulary().get_vocab().clone();
    let extra: Vec<AddedToken> = [&bos, &eos, &unk, &pad]
        .into_iter()
        .flatten()
        .filter(|t| !added.contains_key(&t.text))
        .map(|t| AddedToken::from(t.text.clone(), true).normalized(false))
        .collect();
    inner
        .add_special_tokens(extra)
        .map_err(|e| build_err(format!("bos/eos/unk/pad tokens: {e}")))?;

    let kind = format!(
        "gguf gpt2 BPE, pre={pre}, {} tokens, {} merges",
        tokens.len(),
        merge_lines.len()
    );
    let add_bos = meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    Tokenizer::assemble(TokenizerParts {
        inner,
        bos,
        eos,
        extra_stop_ids: [eot, eom].into_iter().flatten().map(|t| t.id).collect(),
        add_bos,
        add_eos,
        // Without either flag there is nothing to add, and no post-processor is equivalent.
        set_post_processor: add_bos || add_eos,
        chat_template: meta.string("tokenizer.chat_template")?.map(str::to_string),
        kind,
        source: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        assert!(t.iter().all(|c| in_alphabet(&c.to_string())));
        assert!(!in_alphabet(" ") && !in_alphabet("\u{144}") && !in_alphabet("\u{AD}"));
        let mut sorted = t.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 256, "the table is a bijection");
    }

    fn content(entries: Vec<(&str, Value)>) -> HashMap<String, Value> {
        entries
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    fn strs(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| Value::String((*s).into())).collect())
    }

    #[test]
    fn unknown_model_and_pre_name_the_key() {
        let path = Path::new("x.gguf");
        let err = from_gguf_metadata(
            &content(vec![(
                "tokenizer.ggml.model",
                Value::String("llama".into()),
            )]),
            path,
        )
        .expect_err("llama is not supported");
        assert!(
            err.to_string().contains("tokenizer.ggml.model") && err.to_string().contains("llama"),
            "{err}"
        );
        let err = from_gguf_metadata(
            &content(vec![
                ("tokenizer.ggml.model", Value::String("gpt2".into())),
                ("tokenizer.ggml.pre", Value::String("martian".into())),
            ]),
            path,
        )
        .expect_err("unknown pre");
        assert!(
            err.to_string().contains("tokenizer.ggml.pre") && err.to_string().contains("martian"),
            "{err}"
        );
        let err = from_gguf_metadata(
            &content(vec![("tokenizer.ggml.model", Value::String("gpt2".into()))]),
            path,
        )
        .expect_err("no tokens");
        assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
    }

    #[test]
    fn tiny_vocab_builds_and_round_trips() {
        let c = content(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            (
                "tokenizer.ggml.tokens",
                strs(&["<eos>", "a", "b", "ab", "Ġ", "Ġab"]),
            ),
            ("tokenizer.ggml.merges", strs(&["a b", "Ġ ab"])),
            (
                "tokenizer.ggml.token_type",
                Value::Array(vec![
                    Value::I32(3),
                    Value::I32(1),
                    Value::I32(1),
                    Value::I32(1),
                    Value::I32(1),
                    Value::I32(1),
                ]),
            ),
            ("tokenizer.ggml.eos_token_id", Value::U32(0)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(false)),
        ]);
        let tok = from_gguf_metadata(&c, Path::new("tiny.gguf")).expect("builds");
        assert_eq!(tok.encode("ab ab<eos>", true).expect("encodes"), [3, 5, 0]);
        assert_eq!(
            tok.decode(&[3, 5, 0], false).expect("decodes"),
            "ab ab<eos>"
        );
        assert_eq!(tok.decode(&[3, 5, 0], true).expect("decodes"), "ab ab");
        assert_eq!(tok.eos_token().map(|t| t.id), Some(0));
        assert_eq!(tok.kind(), "gguf gpt2 BPE, pre=default, 6 tokens, 2 merges");
    }

    #[test]
    fn malformed_merge_is_reported() {
        let c = content(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&["a", "b"])),
            ("tokenizer.ggml.merges", strs(&["ab"])),
        ]);
        let err = from_gguf_metadata(&c, Path::new("m.gguf")).expect_err("bad merge");
        assert!(err.to_string().contains("tokenizer.ggml.merges"), "{err}");
    }
}
