//! Stop strings matched across token boundaries.
//!
//! Text arrives in arbitrary pieces, so a stop string can be split over several of them. The
//! matcher holds back the longest suffix that could still grow into a stop string, emits the
//! rest, and on a match emits only the text before it: the stop string itself never reaches the
//! client.

/// Result of [`StopMatcher::push`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutcome {
    /// Text that is safe to send now.
    pub emit: String,
    /// A stop string was found; generation should end. Later pushes emit nothing.
    pub stopped: bool,
    /// Index (in the `stops` given to [`StopMatcher::new`]) of the stop string that matched.
    pub matched: Option<usize>,
}

/// Finds stop strings in streamed text.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match everywhere).
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            stops,
            held: String::new(),
            stopped: false,
        }
    }

    /// Adds a piece of text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stopped {
            return StopOutcome {
                stopped: true,
                ..StopOutcome::default()
            };
        }
        self.held.push_str(text);
        // The earliest match wins; among matches at the same place, the first listed.
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, stop)| self.held.find(stop.as_str()).map(|at| (at, i)))
            .min();
        if let Some((at, i)) = found {
            self.stopped = true;
            self.held.truncate(at);
            return StopOutcome {
                emit: std::mem::take(&mut self.held),
                stopped: true,
                matched: Some(i),
            };
        }
        let keep = self.partial_suffix_len();
        let emit = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopOutcome {
            emit,
            stopped: false,
            matched: None,
        }
    }

    /// Releases held text at the end of generation (nothing if a stop string matched).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Whether a stop string has matched.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Length of the longest suffix of `held` that is a proper prefix of some stop string.
    fn partial_suffix_len(&self) -> usize {
        let held = self.held.as_str();
        // Longest candidates first; a suffix must start on a character boundary.
        (1..=held.len())
            .rev()
            .filter(|&n| held.is_char_boundary(held.len() - n))
            .find(|&n| {
                let suffix = &held[held.len() - n..];
                self.stops
                    .iter()
                    .any(|s| s.len() > n && s.starts_with(suffix))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `parts` and returns (everything emitted incl. finish, stopped, matched).
    fn run(stops: &[&str], parts: &[&str]) -> (String, bool, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        let mut matched = None;
        for p in parts {
            let o = m.push(p);
            out.push_str(&o.emit);
            matched = matched.or(o.matched);
        }
        out.push_str(&m.finish());
        (out, m.stopped(), matched)
    }

    /// Every way of cutting `text` into two or three pieces.
    fn splits(text: &str) -> Vec<Vec<&str>> {
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        let mut all = Vec::new();
        for &a in &bounds {
            for &b in bounds.iter().filter(|&&b| b >= a) {
                all.push(vec![&text[..a], &text[a..b], &text[b..]]);
            }
        }
        all
    }

    #[test]
    fn stop_split_anywhere_is_found_and_never_emitted() {
        let text = "Hello wor<|END|>ld and more";
        for parts in splits(text) {
            let (out, stopped, matched) = run(&["<|END|>"], &parts);
            assert_eq!(out, "Hello wor", "{parts:?}");
            assert!(stopped, "{parts:?}");
            assert_eq!(matched, Some(0));
        }
    }

    #[test]
    fn text_without_stop_passes_through_whole() {
        // "<|EN" is a prefix of the stop string: held back, then released at the end.
        let text = "a <|E b <|EN";
        for parts in splits(text) {
            let (out, stopped, _) = run(&["<|END|>"], &parts);
            assert_eq!(out, text, "{parts:?}");
            assert!(!stopped);
        }
    }

    #[test]
    fn earliest_of_several_stops_wins_with_multibyte_text() {
        let text = "日本語ストップ😀Observation: x\n\nUser:";
        for parts in splits(text) {
            let (out, stopped, matched) = run(&["\n\nUser:", "Observation:", "ップ😀O"], &parts);
            assert!(stopped);
            assert_eq!(out, "日本語スト", "{parts:?}");
            assert_eq!(matched, Some(2));
        }
    }

    #[test]
    fn held_text_is_only_a_possible_prefix() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("abcS").emit, "abc");
        assert_eq!(m.push("T").emit, "");
        assert_eq!(m.push("x").emit, "STx");
        assert_eq!(m.finish(), "");
        let o = m.push("STOP tail");
        assert!(o.stopped && o.emit.is_empty());
        assert!(m.push("more").emit.is_empty());
    }

    #[test]
    fn empty_stop_strings_are_ignored() {
        let (out, stopped, _) = run(&[""], &["abc"]);
        assert_eq!(out, "abc");
        assert!(!stopped);
    }
}
