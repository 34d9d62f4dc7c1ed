//! The text side of a streamed turn, shared by the server's worker and the
//! CLI's `run` and `chat`: emitted tokens become text through the
//! incremental [`Detokenizer`], then pass the [`StopMatcher`], which holds
//! back any tail that could still grow into a stop string. Stop tokens end
//! the turn but are not text.

use crate::detokenizer::Detokenizer;
use crate::error::Result;
use crate::stop::StopMatcher;
use crate::tokenizer::Tokenizer;

/// Detokenizer + stop strings + stop-token handling for one turn.
pub struct TextStream<'t> {
    detokenizer: Detokenizer<'t>,
    stops: StopMatcher,
    /// The stop strings the matcher uses (empty ones dropped), to name the
    /// one that matched.
    stop_strings: Vec<String>,
    matched: Option<usize>,
    stop_token: bool,
    text: String,
}

/// What one token added.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Piece {
    /// Text that is final now (often empty while a character or a possible
    /// stop string is held back).
    pub text: String,
    /// A stop string has matched: the turn should end.
    pub stop_string: bool,
}

impl<'t> TextStream<'t> {
    /// Special tokens are skipped in the text; empty stop strings are
    /// ignored (they would match everywhere).
    pub fn new(tokenizer: &'t Tokenizer, stops: Vec<String>) -> Self {
        let stop_strings: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            detokenizer: Detokenizer::new(tokenizer, true),
            stops: StopMatcher::new(stop_strings.clone()),
            stop_strings,
            matched: None,
            stop_token: false,
            text: String::new(),
        }
    }

    /// Feed one emitted token. A stop token (`is_stop_token`) is not text;
    /// after a stop string matched nothing more is emitted. An error is the
    /// detokenizer's: the token stays pushed and nothing is emitted for it
    /// (the caller decides whether the turn goes on).
    pub fn push(&mut self, token: u32, is_stop_token: bool) -> Result<Piece> {
        self.stop_token = is_stop_token;
        if is_stop_token || self.stopped() {
            return Ok(Piece {
                text: String::new(),
                stop_string: self.stopped(),
            });
        }
        let fresh = self.detokenizer.push(token)?;
        let outcome = self.stops.push(&fresh);
        self.matched = self.matched.or(outcome.matched);
        self.text.push_str(&outcome.emit);
        Ok(Piece {
            text: outcome.emit,
            stop_string: outcome.stopped,
        })
    }

    /// End of turn: release the text held back for a character or a stop
    /// string that never completed (nothing, if a stop string matched; a
    /// stop string completed by the tail still cuts it).
    pub fn finish(&mut self) -> String {
        if self.stopped() {
            return String::new();
        }
        let tail = self.detokenizer.finish();
        let outcome = self.stops.push(&tail);
        self.matched = self.matched.or(outcome.matched);
        let mut out = outcome.emit;
        if !outcome.stopped {
            out.push_str(&self.stops.finish());
        }
        self.text.push_str(&out);
        out
    }

    /// Whether a stop string matched.
    pub fn stopped(&self) -> bool {
        self.stops.stopped()
    }

    /// The stop string that matched, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.matched
            .and_then(|i| self.stop_strings.get(i))
            .map(String::as_str)
    }

    /// Whether the last token pushed was a stop token.
    pub fn ended_on_stop_token(&self) -> bool {
        self.stop_token
    }

    /// All text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}
