//! Incremental detokenization for streaming.
//!
//! Byte-level BPE splits characters across tokens (an emoji is often 2–4 tokens), and some
//! decoders change a token's text depending on its neighbours. So, as TGI and vLLM do, each step
//! decodes a small window of ids twice — `ids[prefix..read]` (already emitted) and
//! `ids[prefix..]` — and emits the difference, but only once it no longer ends in U+FFFD (an
//! incomplete character). The window then slides forward.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// After this many held-back tokens the window is flushed anyway: a sequence that still ends in
/// U+FFFD is genuinely invalid (or the text really ends with U+FFFD), not a character in
/// progress (UTF-8 needs at most 4 bytes, hence at most 4 byte-level tokens).
const MAX_HELD_TOKENS: usize = 8;

/// Turns a stream of token ids into a stream of complete text pieces.
pub struct Detokenizer<'t> {
    tokenizer: &'t Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the window: `ids[prefix..read]` decodes to text already emitted.
    prefix: usize,
    /// End of what has been emitted.
    read: usize,
}

impl<'t> Detokenizer<'t> {
    pub fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        Self {
            tokenizer,
            skip_special,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// Adds one token and returns the newly completed text (often empty while a character is
    /// still incomplete).
    pub fn push(&mut self, token: u32) -> Result<String> {
        self.ids.push(token);
        let (emitted, text) = self.window()?;
        let held = self.ids.len() - self.read;
        if text.ends_with('\u{FFFD}') && held < MAX_HELD_TOKENS {
            return Ok(String::new());
        }
        Ok(self.advance(&emitted, text))
    }

    /// Flushes whatever is held back; an incomplete character at the very end comes out as
    /// U+FFFD, as a full decode would show it.
    ///
    /// Infallible: every id here was already decoded successfully by [`Self::push`] (the window
    /// only ever holds pushed ids), so a decode error cannot newly appear; if the tokenizer
    /// still failed, nothing is flushed rather than making every caller handle the impossible.
    pub fn finish(&mut self) -> String {
        if self.read == self.ids.len() {
            return String::new();
        }
        match self.window() {
            Ok((emitted, text)) => self.advance(&emitted, text),
            Err(_) => String::new(),
        }
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn window(&self) -> Result<(String, String)> {
        let emitted = self
            .tokenizer
            .decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let text = self
            .tokenizer
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        Ok((emitted, text))
    }

    fn advance(&mut self, emitted: &str, text: String) -> String {
        let new = match text.strip_prefix(emitted) {
            Some(rest) => rest.to_string(),
            // A decoder that rewrites earlier text (rare): emit what lies past the old length,
            // on a character boundary.
            None => text.chars().skip(emitted.chars().count()).collect(),
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        new
    }
}
