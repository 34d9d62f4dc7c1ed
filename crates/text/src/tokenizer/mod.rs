//! The tokenizer: a `tokenizers::Tokenizer` plus what the server needs around it (bos/eos,
//! stop ids, chat template, add-bos flag), built from a `tokenizer.json` directory or from GGUF
//! metadata.
//!
//! Encoding never adds bos/eos by itself ([`Tokenizer::encode`]); [`Tokenizer::encode_prompt`]
//! does, exactly as transformers' `tokenizer.encode(text)` (`add_special_tokens=True`) would.
//! A rendered chat template is encoded with [`Tokenizer::encode`] and `parse_special = true`,
//! which is what transformers' `apply_chat_template(tokenize=True)` does: templates write their
//! own bos text.

mod bytes;
mod gguf;
mod hf;
pub mod pretokenizers;
pub mod tiktoken;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::Tokenizer as HfTokenizer;
use tokenizers::processors::template::TemplateProcessing;

use crate::error::{Result, TextError};

pub use bytes::TokenBytes;

/// A special token: its text and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    pub text: String,
    pub id: u32,
}

/// Control tokens that end a turn or a document in common vocabularies. Each one present in the
/// vocabulary as a special token is a stop id, besides eos.
const EOT_LIKE: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<|return|>",
    "<|call|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
];

/// What a loader hands to [`Tokenizer::assemble`].
pub(crate) struct TokenizerParts {
    pub inner: HfTokenizer,
    pub bos: Option<SpecialToken>,
    pub eos: Option<SpecialToken>,
    /// Stop ids named by the source besides eos (GGUF eot/eom, generation_config eos lists).
    pub extra_stop_ids: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Replace the post-processor by one adding exactly bos/eos per the flags (transformers'
    /// `update_post_processor`, run when the flags are given explicitly).
    pub set_post_processor: bool,
    pub chat_template: Option<String>,
    pub kind: String,
    pub source: PathBuf,
}

/// A text tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    /// Parses control-token text (`<|im_start|>`) into its id.
    inner: HfTokenizer,
    /// The same tokenizer with `encode_special_tokens` set, so control-token text is encoded as
    /// plain text; built on first use since few callers need it.
    plain: OnceLock<HfTokenizer>,
    bos: Option<SpecialToken>,
    eos: Option<SpecialToken>,
    stop_ids: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    kind: String,
    source: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads whatever `path` is: a directory (Hugging Face layout), a GGUF file (by its `GGUF`
    /// magic), or else a `tokenizer.json`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Self::from_hf_dir(path);
        }
        let mut magic = [0u8; 4];
        let io = |source| TextError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let is_gguf = std::io::Read::read_exact(&mut file, &mut magic).is_ok() && &magic == b"GGUF";
        if is_gguf {
            Self::from_gguf(path)
        } else {
            Self::from_tokenizer_json(path)
        }
    }

    /// Loads a bare `tokenizer.json` (no config: bos/eos unknown unless the vocabulary has the
    /// usual names, no chat template).
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Self> {
        hf::from_tokenizer_json(path.as_ref())
    }

    /// Loads a Hugging Face model directory: `tokenizer.json`, plus `tokenizer_config.json`
    /// (bos/eos, `add_bos_token`, `chat_template`), `chat_template.jinja` and
    /// `generation_config.json` (extra eos ids) when present.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Self> {
        hf::from_hf_dir(dir.as_ref())
    }

    /// Reads a GGUF file's metadata (not its tensors) and builds its tokenizer.
    pub fn from_gguf(path: impl AsRef<Path>) -> Result<Self> {
        gguf::from_gguf(path.as_ref())
    }

    /// Builds the tokenizer from GGUF metadata already read; `path` labels errors.
    pub fn from_gguf_metadata(
        metadata: &HashMap<String, Value>,
        path: impl AsRef<Path>,
    ) -> Result<Self> {
        gguf::from_gguf_metadata(metadata, path.as_ref())
    }

    pub(crate) fn assemble(mut parts: TokenizerParts) -> Result<Self> {
        if parts.set_post_processor {
            install_post_processor(&mut parts)?;
        }
        let mut stop_ids: Vec<u32> = parts.eos.iter().map(|t| t.id).collect();
        stop_ids.extend(parts.extra_stop_ids.iter().copied());
        let added = parts.inner.get_added_vocabulary();
        for name in EOT_LIKE {
            if added.is_special_token(name)
                && let Some(id) = parts.inner.token_to_id(name)
            {
                stop_ids.push(id);
            }
        }
        let mut seen = std::collections::HashSet::new();
        stop_ids.retain(|id| seen.insert(*id));
        Ok(Self {
            inner: parts.inner,
            plain: OnceLock::new(),
            bos: parts.bos,
            eos: parts.eos,
            stop_ids,
            add_bos: parts.add_bos,
            add_eos: parts.add_eos,
            chat_template: parts.chat_template,
            kind: parts.kind,
            source: parts.source,
        })
    }

    /// Encodes `text` without adding bos/eos.
    ///
    /// `parse_special = true`: special-token text in `text` (`<|im_start|>`) becomes that token's
    /// id, as needed for chat-template output. `false`: special tokens are encoded as the plain
    /// text they spell (`<`, `|`, `im`, ...), which is what untrusted user text should get.
    /// Non-special added tokens (GGUF "user-defined", like `<think>`) are matched whole either
    /// way: the `tokenizers` crate only has a switch for special ones, and transformers'
    /// `split_special_tokens=True` behaves the same.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        self.encode_with(text, parse_special, false)
    }

    /// Encodes a raw (non-chat) prompt the way transformers' `tokenizer.encode(text)` does:
    /// special-token text is parsed, and bos (eos) is added when the tokenizer says so
    /// ([`Self::add_bos`]).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_with(text, true, true)
    }

    fn encode_with(&self, text: &str, parse_special: bool, add_special: bool) -> Result<Vec<u32>> {
        let tk = if parse_special {
            &self.inner
        } else {
            self.plain.get_or_init(|| {
                let mut plain = self.inner.clone();
                plain.set_encode_special_tokens(true);
                plain
            })
        };
        let encoding = tk.encode(text, add_special).map_err(TextError::tokenizer)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes ids to text; `skip_special` drops special tokens. Invalid UTF-8 (a sequence cut
    /// mid-character) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(TextError::tokenizer)
    }

    /// The beginning-of-sequence token, if the source names one.
    pub fn bos_token(&self) -> Option<&SpecialToken> {
        self.bos.as_ref()
    }

    /// The end-of-sequence token, if the source names one.
    pub fn eos_token(&self) -> Option<&SpecialToken> {
        self.eos.as_ref()
    }

    /// Ids that end generation: eos, the source's other eos/eot ids, and turn-ending control
    /// tokens present in the vocabulary (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...).
    pub fn stop_token_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The chat template the source ships, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// A one-line description for `inspect`.
    pub fn kind(&self) -> String {
        self.kind.clone()
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether a raw prompt should start with bos (`tokenizer.ggml.add_bos_token`, or the
    /// `tokenizer.json` post-processor / `add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether a raw prompt should end with eos.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// The token's text as the vocabulary spells it (byte-level pieces look like `Ġword`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token spelled exactly `token`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The file or directory this tokenizer came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &HfTokenizer {
        &self.inner
    }
}

/// transformers' `update_post_processor`: `bos:0 $A:0 eos:0`, each part only when its flag is set.
fn install_post_processor(parts: &mut TokenizerParts) -> Result<()> {
    let err = |message: String| TextError::Build {
        path: parts.source.clone(),
        message,
    };
    let mut single = Vec::new();
    let mut specials = Vec::new();
    for (flag, token, name) in [
        (parts.add_bos, &parts.bos, "bos"),
        (parts.add_eos, &parts.eos, "eos"),
    ] {
        if !flag {
            continue;
        }
        let token = token.as_ref().ok_or_else(|| {
            err(format!(
                "add_{name}_token is set but there is no {name} token"
            ))
        })?;
        single.push(format!("{}:0", token.text));
        specials.push((token.text.clone(), token.id));
    }
    single.insert(usize::from(parts.add_bos), "$A:0".to_string());
    let processor = TemplateProcessing::builder()
        .try_single(single.join(" "))
        .map_err(|e| err(format!("post-processor template: {e}")))?
        .special_tokens(specials)
        .build()
        .map_err(|e| err(format!("post-processor: {e}")))?;
    parts.inner.with_post_processor(Some(processor));
    Ok(())
}
