//! The text side of a streaming turn: tokens become text through the
//! incremental detokenizer, then pass the stop-string matcher, which holds
//! back any tail that could still grow into a stop string.

use ds4_text::{Detokenizer, StopMatcher, Tokenizer};

pub struct TextStream<'t> {
    detokenizer: Detokenizer<'t>,
    stops: StopMatcher,
    text: String,
    stopped: bool,
}

/// What one token added.
pub struct Piece {
    pub text: String,
    /// A stop string matched: the turn should end.
    pub stop_string: bool,
}

impl<'t> TextStream<'t> {
    pub fn new(tokenizer: &'t Tokenizer, stops: Vec<String>) -> Self {
        Self {
            detokenizer: Detokenizer::new(tokenizer, true),
            stops: StopMatcher::new(stops),
            text: String::new(),
            stopped: false,
        }
    }

    /// Feed one emitted token. Stop tokens are not text and are skipped.
    pub fn push(&mut self, token: u32, is_stop_token: bool) -> anyhow::Result<Piece> {
        if is_stop_token || self.stopped {
            return Ok(Piece {
                text: String::new(),
                stop_string: self.stopped,
            });
        }
        let fresh = self.detokenizer.push(token)?;
        let outcome = self.stops.push(&fresh);
        self.stopped = outcome.stopped;
        self.text.push_str(&outcome.emit);
        Ok(Piece {
            text: outcome.emit,
            stop_string: outcome.stopped,
        })
    }

    /// End of turn: release text held back for a stop string that never
    /// completed (nothing, if a stop string matched).
    pub fn finish(&mut self) -> anyhow::Result<String> {
        if self.stopped {
            return Ok(String::new());
        }
        let tail = self.detokenizer.finish();
        let outcome = self.stops.push(&tail);
        let mut out = outcome.emit;
        if outcome.stopped {
            self.stopped = true;
        } else {
            out.push_str(&self.stops.finish());
        }
        self.text.push_str(&out);
        Ok(out)
    }

    /// All text emitted so far.
    pub fn text(&self) -> &str {
        &self.text
    }
}
