//! Pre-tokenizers for byte-level BPE vocabularies read from GGUF, keyed by `tokenizer.ggml.pre`.
//!
//! transformers is the oracle, so this mirrors `GGUF_PRE_TOKENIZER_SPLITS` in its
//! `integrations/gguf/gguf_tokenizer_mapping.py` (5.24): a name in that table gets
//! `Sequence[Split(regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)]`; any
//! other name keeps `GPT2Tokenizer`'s plain `ByteLevel(add_prefix_space=false)` pre-tokenizer,
//! whose built-in regex is GPT-2's.
//!
//! Where llama.cpp differs (its `llama-vocab.cpp` table):
//! * `smollm` (and starcoder, refact, ...): llama.cpp splits every digit (`\p{N}` first, then the
//!   GPT-2 regex), transformers does not. For SmolLM's vocabulary the ids agree anyway, because
//!   its merges never join digits.
//! * `deepseek-llm`, `deepseek-coder`: llama.cpp has dedicated regex lists; transformers falls
//!   back to GPT-2's regex. We follow transformers, so on digit runs and CJK our ids can differ
//!   from llama.cpp's.
//! * `deepseek-v3`: here we follow llama.cpp (`LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM`), not
//!   transformers' GPT-2 fallback: its three regexes are exactly the three `Split`s of
//!   DeepSeek-V3/V4's own `tokenizer.json`, so the GGUF tokenizes as the model's tokenizer does
//!   (`ds4server quantize` proves it before writing such a file).
//! * `llama-bpe`/`llama3`, `qwen2`: identical regexes in both.
//!
//! Unknown names are an error here (transformers silently falls back to GPT-2), so a new
//! vocabulary is never mis-split without anyone noticing.

use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

/// Llama 3's split: contractions case-insensitive, digits in runs of at most 3.
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: as Llama 3's but every digit alone.
pub const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen3.5's split: Qwen2's with combining marks kept inside words.
pub const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's tekken split.
pub const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k) split, also Llama 4's.
pub const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek-V3/V4's three splits, applied in turn (llama.cpp's `deepseek-v3`; the same strings
/// as the `Split`s of DeepSeek-V4's `tokenizer.json`): digit runs of at most 3, CJK runs, then
/// words, punctuation and whitespace.
pub const DEEPSEEK3_SPLITS: &[&str] = &[
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];

/// transformers' table: `tokenizer.ggml.pre` value → split regex.
const SPLITS: &[(&str, &str)] = &[
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    ("llama-bpe", LLAMA3_SPLIT),
    ("falcon3", LLAMA3_SPLIT),
    ("falcon-h1", LLAMA3_SPLIT),
    ("pixtral", LLAMA3_SPLIT),
    ("midm-2.0", LLAMA3_SPLIT),
    ("lfm2", LLAMA3_SPLIT),
    ("jina-v5-nano", LLAMA3_SPLIT),
    ("dbrx", LLAMA3_SPLIT),
    ("smaug-bpe", LLAMA3_SPLIT),
    ("tekken", TEKKEN_SPLIT),
    ("qwen2", QWEN2_SPLIT),
    ("deepseek-r1-qwen", QWEN2_SPLIT),
    ("kormo", QWEN2_SPLIT),
    ("f2llmv2", QWEN2_SPLIT),
    ("megrez", QWEN2_SPLIT),
    ("qwen35", QWEN35_SPLIT),
    ("gpt-4o", GPT4O_SPLIT),
    ("llama4", GPT4O_SPLIT),
    ("kanana2", GPT4O_SPLIT),
    ("talkie", GPT4O_SPLIT),
    ("minimax-m2", GPT4O_SPLIT),
];

/// Names for which transformers keeps GPT-2's byte-level regex (it does so for every name not in
/// [`SPLITS`]; we list the ones we have checked so an unknown name is an error, not a guess).
const GPT2_REGEX: &[&str] = &[
    "default",
    "gpt-2",
    "gpt2",
    "smollm",
    "starcoder",
    "refact",
    "codeshell",
    "deepseek-llm",
    "deepseek-coder",
];

/// How a `tokenizer.ggml.pre` value splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreSplit {
    /// GPT-2's regex inside the `ByteLevel` pre-tokenizer.
    Gpt2,
    /// A dedicated split regex, then `ByteLevel` without its own regex.
    Regex(&'static str),
    /// Several split regexes applied in turn, then `ByteLevel` without its own regex.
    Regexes(&'static [&'static str]),
}

/// The split for a `tokenizer.ggml.pre` value, or `None` if it is not one we support.
pub fn pre_split(pre: &str) -> Option<PreSplit> {
    if let Some((_, regex)) = SPLITS.iter().find(|(name, _)| *name == pre) {
        return Some(PreSplit::Regex(regex));
    }
    if pre == "deepseek-v3" {
        return Some(PreSplit::Regexes(DEEPSEEK3_SPLITS));
    }
    GPT2_REGEX.contains(&pre).then_some(PreSplit::Gpt2)
}

/// Whether a GGUF with this split takes its added tokens as llama.cpp does (matched by their raw
/// text, whatever their spelling): only where the split itself is llama.cpp's rather than
/// transformers' (`deepseek-v3`), so no other name's tokens change.
pub fn added_tokens_as_llama_cpp(split: PreSplit) -> bool {
    matches!(split, PreSplit::Regexes(_))
}

/// Every supported name, for error messages.
pub fn supported_names() -> String {
    let mut names: Vec<&str> = GPT2_REGEX.to_vec();
    names.push("deepseek-v3");
    names.extend(SPLITS.iter().map(|(name, _)| *name));
    names.join(", ")
}

/// Builds the pre-tokenizer transformers builds for `split`.
pub fn build(split: PreSplit) -> Result<PreTokenizerWrapper, String> {
    Ok(match split {
        // GPT2Tokenizer: ByteLevel(add_prefix_space=False), trim_offsets and use_regex default on.
        PreSplit::Gpt2 => ByteLevel::new(false, true, true).into(),
        PreSplit::Regex(regex) => splits_then_bytes(&[regex])?,
        PreSplit::Regexes(regexes) => splits_then_bytes(regexes)?,
    })
}

/// `Sequence[Split(r, Isolated) for r in regexes, ByteLevel(use_regex=false)]`.
fn splits_then_bytes(regexes: &[&str]) -> Result<PreTokenizerWrapper, String> {
    let mut parts: Vec<PreTokenizerWrapper> = regexes
        .iter()
        .map(|r| {
            Split::new(
                SplitPattern::Regex((*r).to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(Into::into)
            .map_err(|e| format!("split regex does not compile: {e}"))
        })
        .collect::<Result<_, _>>()?;
    parts.push(ByteLevel::new(false, true, false).into());
    Ok(Sequence::new(parts).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let pt = build(pre_split(pre).expect("known name")).expect("builds");
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).expect("pre-tokenizes");
        s.get_splits(OffsetReferential::Original, OffsetType::Char)
            .into_iter()
            .map(|(piece, _, _)| piece.to_string())
            .collect()
    }

    #[test]
    fn every_listed_name_builds() {
        for (name, _) in SPLITS {
            assert!(pre_split(name).is_some_and(|s| build(s).is_ok()), "{name}");
        }
        for name in GPT2_REGEX {
            assert_eq!(pre_split(name), Some(PreSplit::Gpt2), "{name}");
        }
        assert_eq!(pre_split("no-such-pre"), None);
        assert!(pre_split("deepseek-v3").is_some_and(|s| build(s).is_ok()));
    }

    #[test]
    fn deepseek3_splits_digits_cjk_and_words_in_turn() {
        // Digits by three, a CJK run alone, a punctuation-led word kept whole.
        assert_eq!(
            pieces("deepseek-v3", "ab 12345我想在apple.Hi"),
            ["ab", "Ġ", "123", "45", "æĪĳæĥ³åľ¨", "apple", ".Hi"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_gpt2_does_not() {
        // Ġ is the byte-level spelling of a space.
        assert_eq!(pieces("llama-bpe", "x 12345"), ["x", "Ġ", "123", "45"]);
        assert_eq!(
            pieces("qwen2", "x 12345"),
            ["x", "Ġ", "1", "2", "3", "4", "5"]
        );
        assert_eq!(pieces("smollm", "x 12345"), ["x", "Ġ12345"]);
    }

    #[test]
    fn llama3_contractions_are_case_insensitive() {
        assert_eq!(pieces("llama3", "IT'S"), ["IT", "'S"]);
        assert_eq!(pieces("gpt-2", "IT'S"), ["IT", "'", "S"]);
    }
}
