//! Splitting reasoning from the answer in streamed text.
//!
//! Text arrives in arbitrary pieces, so a marker can be split across them:
//! the splitter holds back any tail that could still grow into the marker it
//! is waiting for, exactly as the stop-string matcher does.

/// The strings that open and close a reasoning block (e.g. `<think>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningMarkers {
    pub open: &'static str,
    pub close: &'static str,
    /// Drop the blank text right after the closing marker (the answer
    /// conventionally starts after a blank line). Off where that text is
    /// part of what the client must send back unchanged (DeepSeek-V4: ds4
    /// returns everything after `</think>` as the answer, and the whitespace
    /// before a tool-call block belongs to the block).
    pub skip_blank_after_close: bool,
}

/// A piece of split output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Split {
    Reasoning(String),
    Text(String),
}

/// Incremental reasoning splitter. Only a block at the very start of the
/// output (after optional whitespace) counts as reasoning; markers later in
/// the answer are ordinary text.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    markers: ReasoningMarkers,
    phase: Phase,
    held: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace seen: an opening marker may still come.
    Start,
    Reasoning,
    /// Just after the closing marker: blank text before the answer is
    /// dropped (the answer conventionally starts after a blank line).
    AfterClose,
    Answer,
}

impl ReasoningSplitter {
    /// `inside`: the prompt already opened the block (templates that end the
    /// generation prompt with `<think>\n`), so output starts as reasoning.
    pub fn new(markers: ReasoningMarkers, inside: bool) -> Self {
        Self {
            markers,
            phase: if inside {
                Phase::Reasoning
            } else {
                Phase::Start
            },
            held: String::new(),
        }
    }

    /// Feed a piece of text; returns what can be told apart so far.
    pub fn push(&mut self, text: &str) -> Vec<Split> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Start => {
                    let trimmed = self.held.trim_start();
                    if trimmed.starts_with(self.markers.open) {
                        let skip = self.held.len() - trimmed.len() + self.markers.open.len();
                        self.held.drain(..skip);
                        self.phase = Phase::Reasoning;
                        continue;
                    }
                    if !trimmed.is_empty() && !self.markers.open.starts_with(trimmed) {
                        self.phase = Phase::Answer;
                        continue;
                    }
                    return out;
                }
                Phase::Reasoning => {
                    if let Some(at) = self.held.find(self.markers.close) {
                        let reasoning: String = self.held.drain(..at).collect();
                        self.held.drain(..self.markers.close.len());
                        push(&mut out, Split::Reasoning(reasoning));
                        self.phase = if self.markers.skip_blank_after_close {
                            Phase::AfterClose
                        } else {
                            Phase::Answer
                        };
                        continue;
                    }
                    let keep = partial_suffix(&self.held, self.markers.close);
                    let ready: String = self.held.drain(..self.held.len() - keep).collect();
                    push(&mut out, Split::Reasoning(ready));
                    return out;
                }
                Phase::AfterClose => {
                    let rest = self.held.trim_start().to_string();
                    self.held = rest;
                    if self.held.is_empty() {
                        return out;
                    }
                    self.phase = Phase::Answer;
                }
                Phase::Answer => {
                    let text = std::mem::take(&mut self.held);
                    push(&mut out, Split::Text(text));
                    return out;
                }
            }
        }
    }

    /// Whether the text so far is inside the reasoning block (opened and
    /// not yet closed).
    pub fn in_reasoning(&self) -> bool {
        self.phase == Phase::Reasoning
    }

    /// End of output: release what was held back.
    pub fn finish(&mut self) -> Vec<Split> {
        let held = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.phase {
            Phase::Reasoning => push(&mut out, Split::Reasoning(held)),
            Phase::Start | Phase::Answer => push(&mut out, Split::Text(held)),
            Phase::AfterClose => {}
        }
        out
    }
}

fn push(out: &mut Vec<Split>, split: Split) {
    let empty = match &split {
        Split::Reasoning(s) | Split::Text(s) => s.is_empty(),
    };
    if !empty {
        out.push(split);
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `marker`.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .filter(|&n| text.is_char_boundary(text.len() - n))
        .find(|&n| marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const THINK: ReasoningMarkers = ReasoningMarkers {
        open: "<think>",
        close: "</think>",
        skip_blank_after_close: true,
    };

    /// Feed `text` split at `cuts` and merge adjacent pieces of one kind.
    fn run(text: &str, cuts: &[usize], inside: bool) -> (String, String) {
        let mut s = ReasoningSplitter::new(THINK, inside);
        let mut pieces = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
            pieces.extend(s.push(&text[from..cut]));
            from = cut;
        }
        pieces.extend(s.finish());
        let (mut r, mut t) = (String::new(), String::new());
        for p in pieces {
            match p {
                Split::Reasoning(x) => r.push_str(&x),
                Split::Text(x) => t.push_str(&x),
            }
        }
        (r, t)
    }

    #[test]
    fn splits_at_every_boundary_identically() {
        let text = "<think>\nweigh it</think>\n\nThe answer.";
        for a in 0..=text.len() {
            for b in a..=text.len() {
                assert_eq!(
                    run(text, &[a, b], false),
                    ("\nweigh it".to_string(), "The answer.".to_string()),
                    "cuts {a} {b}"
                );
            }
        }
    }

    #[test]
    fn text_without_markers_is_all_answer() {
        for cut in 0..=5 {
            assert_eq!(run("<thin", &[cut], false), (String::new(), "<thin".into()));
        }
        assert_eq!(
            run("hi <think>x</think>", &[2], false),
            (String::new(), "hi <think>x</think>".into())
        );
    }

    #[test]
    fn prompt_opened_block_and_unclosed_block() {
        assert_eq!(run("a</think>b", &[3], true), ("a".into(), "b".into()));
        assert_eq!(
            run("<think>still", &[4], false),
            ("still".into(), String::new())
        );
    }
}
