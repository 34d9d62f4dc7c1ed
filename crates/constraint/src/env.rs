//! The token environment `llguidance` matches grammars against: every id's
//! bytes in a trie, built from the model's own tokenizer (any family: GGUF
//! byte-level BPE, SentencePiece byte fallback, the fixtures' word-level
//! vocabularies, DeepSeek's `tokenizer.json`).

use std::sync::Arc;

use ds4_text::{TokenBytes, Tokenizer};
use llguidance::ParserFactory;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::constraint::Constraint;
use crate::error::ConstraintError;
use crate::grammar::Grammar;

/// The tokenizer as `llguidance` sees it.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
    /// Every byte is a token of its own (byte-level BPE, byte fallback):
    /// `llguidance` may then force the canonical tokens of forced bytes.
    /// A word-level vocabulary (the fixtures') cannot spell every prefix,
    /// so there masks are computed over the forced bytes instead.
    canonical: bool,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokenization of grammar text (forced bytes) when its
    /// tokens spell exactly that text, else the trie's greedy split (bytes
    /// that are not UTF-8, word-level vocabularies whose pieces carry the
    /// separating space, an `<unk>`): forced tokens must spell the bytes.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            match self.tokenizer.encode(text, false) {
                Ok(ids) if self.trie.decode_raw(&ids) == text.as_bytes() => ids,
                _ => self.trie.greedy_tokenize(text.as_bytes()),
            }
        })
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}

/// One model's vocabulary, ready to compile grammars against (built once
/// per model; compiling a request's grammar reuses it).
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    tokenizer: Arc<Tokenizer>,
    stop_ids: Vec<u32>,
    len: usize,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("len", &self.len)
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer`; a text the grammar accepts ends with
    /// any of `stop_ids` (the turn's end-of-turn tokens; at least one).
    /// Special tokens are kept by name, so a grammar can only produce one
    /// it names explicitly (`<[id]>` in Lark).
    pub fn new(tokenizer: Arc<Tokenizer>, stop_ids: &[u32]) -> Result<Self, ConstraintError> {
        let bytes = tokenizer.token_bytes();
        let len = bytes.len();
        let vocab_err = |m: String| ConstraintError::Vocabulary(m);
        let stop_ids: Vec<u32> = stop_ids
            .iter()
            .copied()
            .filter(|&t| (t as usize) < len)
            .collect();
        let Some(&eos) = stop_ids.first() else {
            return Err(vocab_err(
                "the tokenizer names no end-of-turn token inside its vocabulary".into(),
            ));
        };
        let words: Vec<Vec<u8>> = bytes
            .into_iter()
            .map(|b| match b {
                TokenBytes::Text(t) => t,
                TokenBytes::Special(name) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(name.as_bytes());
                    w
                }
                TokenBytes::Missing => Vec::new(),
            })
            .collect();
        let mut single = [false; 256];
        for w in &words {
            if let [b] = w[..] {
                single[b as usize] = true;
            }
        }
        let canonical = single.iter().all(|&s| s);
        let info = TokRxInfo::new(len as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&stop_ids);
        let env: TokEnv = Arc::new(Env {
            trie,
            tokenizer: tokenizer.clone(),
            canonical,
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| vocab_err(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory: Arc::new(factory),
            tokenizer,
            stop_ids,
            len,
        })
    }

    /// The number of ids (the tokenizer's vocabulary; a model's logits rows
    /// may be longer, and ids past it are never allowed).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ids that end an accepted text.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Compile `grammar` into a fresh per-request [`Constraint`], or say
    /// what in it is unsupported or malformed.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        self.compile_after(grammar, None)
    }

    /// [`Vocabulary::compile`] for a reply that starts inside an open
    /// reasoning block closed by `reasoning_close` (`</think>`): free
    /// reasoning up to the marker, then the grammar.
    pub fn compile_after(
        &self,
        grammar: &Grammar,
        reasoning_close: Option<&str>,
    ) -> Result<Constraint, ConstraintError> {
        let mut top = grammar.to_llguidance()?;
        if let Some(close) = reasoning_close {
            let literal = match self.tokenizer.token_to_id(close) {
                Some(id) if self.tokenizer.is_special(id) => format!("<[{id}]>"),
                _ => serde_json::to_string(close).unwrap_or_default(),
            };
            top = crate::grammar::after_reasoning(top, &literal)?;
        }
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| ConstraintError::from_compile(format!("{e:#}")))?;
        Ok(Constraint::new(parser, &self.stop_ids, self.len))
    }
}
