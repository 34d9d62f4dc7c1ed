//! Where generation is inside a DSML tool call, so the decode loop can sample
//! the call's *structure* (tags, parameter headers, JSON punctuation) at
//! temperature 0 while the *payload* (string parameter bodies, JSON strings)
//! keeps the request's sampling. ds4 does this for chat requests with tools
//! (`dsml_decode_state_uses_payload_sampling` in `generate_job`,
//! `antirez/ds4:ds4_server.c`): a misspelt tag breaks the call, a varied
//! argument does not.
//!
//! [`DsmlTracker`] computes, for the generated text so far, exactly the state
//! of ds4's reference recognizer `dsml_decode_state_for_text`, incrementally:
//! text arrives in pieces and only an unconsumed tail is kept. ds4's own
//! incremental tracker (`dsml_decode_tracker_update`) advances past a lone `<`
//! at the end of a string body, so when a token ends with `<` and the next
//! starts with `/｜DSML｜`, it never sees that parameter's end and samples the
//! rest of the call as payload; the reference recognizer (and this tracker)
//! does not depend on how the text was cut into tokens.
//!
//! The state after a prefix depends only on that prefix, which is what keeps
//! MTP speculative decoding exact: the decision for position `i` is a
//! function of the tokens before `i`, drafted or emitted alike.

use super::dsml::{SYNTAXES, Syntax, attr};
use super::json_args::c_space;
use crate::reasoning::partial_suffix;

/// ds4's `dsml_decode_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DsmlState {
    /// Not in a tool-calls block (before the first one, or after it ended).
    Outside,
    /// Tags, attributes, whitespace between them.
    Structural,
    /// The body of a `string="true"` parameter.
    StringBody,
    /// A JSON value outside its strings.
    JsonStructural,
    /// Inside a JSON string of a JSON value.
    JsonString,
}

impl DsmlState {
    /// ds4's digit for the state (fixtures).
    pub fn code(self) -> char {
        match self {
            DsmlState::Outside => '0',
            DsmlState::Structural => '1',
            DsmlState::StringBody => '2',
            DsmlState::JsonStructural => '3',
            DsmlState::JsonString => '4',
        }
    }

    /// Whether the next token is sampled at temperature 0: inside a call and
    /// not payload (`!dsml_decode_state_uses_payload_sampling`).
    pub fn greedy(self) -> bool {
        matches!(self, DsmlState::Structural | DsmlState::JsonStructural)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Search,
    Structural,
    StringBody,
    Json {
        in_string: bool,
        escaped: bool,
    },
    /// Unexpected text between tags: no later text can make a tag at that
    /// point, so the state stays structural (ds4 stays there too).
    Stuck,
    /// After the first block's end: the rest is outside.
    Done,
}

/// Incremental DSML decode state of one reply.
#[derive(Debug, Clone)]
pub struct DsmlTracker {
    mode: Mode,
    syntax: &'static Syntax,
    /// Text not consumed yet (a partial tag, a tag without its `>`).
    held: String,
    state: DsmlState,
}

impl Default for DsmlTracker {
    fn default() -> Self {
        Self {
            mode: Mode::Search,
            syntax: &SYNTAXES[0],
            held: String::new(),
            state: DsmlState::Outside,
        }
    }
}

impl DsmlTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The state after all the text pushed so far.
    pub fn state(&self) -> DsmlState {
        self.state
    }

    /// Append generated text.
    pub fn push(&mut self, text: &str) {
        if matches!(self.mode, Mode::Stuck | Mode::Done) {
            return;
        }
        self.held.push_str(text);
        self.state = self.advance();
    }

    fn consume(&mut self, n: usize) {
        self.held.drain(..n);
    }

    fn advance(&mut self) -> DsmlState {
        loop {
            match self.mode {
                Mode::Done => return DsmlState::Outside,
                Mode::Stuck => return DsmlState::Structural,
                Mode::Search => {
                    let found = SYNTAXES
                        .iter()
                        .filter_map(|s| self.held.find(s.tool_calls_start).map(|at| (at, s)))
                        .min_by_key(|(at, _)| *at);
                    let Some((at, syntax)) = found else {
                        let keep = SYNTAXES
                            .iter()
                            .map(|s| partial_suffix(&self.held, s.tool_calls_start))
                            .max()
                            .unwrap_or(0);
                        self.consume(self.held.len() - keep);
                        return DsmlState::Outside;
                    };
                    self.syntax = syntax;
                    self.consume(at + syntax.tool_calls_start.len());
                    self.mode = Mode::Structural;
                }
                Mode::StringBody => {
                    let end = self.syntax.param_end;
                    if let Some(at) = self.held.find(end) {
                        self.consume(at + end.len());
                        self.mode = Mode::Structural;
                        continue;
                    }
                    let keep = partial_suffix(&self.held, end);
                    self.consume(self.held.len() - keep);
                    // A tail that is already `</…` is the closing tag being written.
                    return if keep >= 2 {
                        DsmlState::Structural
                    } else {
                        DsmlState::StringBody
                    };
                }
                Mode::Json {
                    mut in_string,
                    mut escaped,
                } => {
                    let end = self.syntax.param_end;
                    let mut at = 0;
                    let mut closed = false;
                    let mut partial = false;
                    while at < self.held.len() {
                        let rest = &self.held[at..];
                        if !in_string {
                            if rest.starts_with(end) {
                                at += end.len();
                                closed = true;
                                break;
                            }
                            if end.starts_with(rest) {
                                partial = true;
                                break;
                            }
                        }
                        let Some(c) = rest.chars().next() else { break };
                        at += c.len_utf8();
                        if in_string {
                            if escaped {
                                escaped = false;
                            } else if c == '\\' {
                                escaped = true;
                            } else if c == '"' {
                                in_string = false;
                            }
                        } else if c == '"' {
                            in_string = true;
                        }
                    }
                    self.consume(at);
                    if closed {
                        self.mode = Mode::Structural;
                        continue;
                    }
                    self.mode = Mode::Json { in_string, escaped };
                    return match (partial && self.held.len() >= 2, in_string) {
                        (true, _) => DsmlState::Structural,
                        (false, true) => DsmlState::JsonString,
                        (false, false) => DsmlState::JsonStructural,
                    };
                }
                Mode::Structural => {
                    let ws = self.held.bytes().take_while(|&b| c_space(b)).count();
                    self.consume(ws);
                    if self.held.is_empty() {
                        return DsmlState::Structural;
                    }
                    let syn = self.syntax;
                    if self.held.starts_with(syn.tool_calls_end) {
                        self.held.clear();
                        self.mode = Mode::Done;
                        return DsmlState::Outside;
                    }
                    if self.held.starts_with(syn.invoke_end) {
                        self.consume(syn.invoke_end.len());
                        continue;
                    }
                    let open = [syn.invoke_start, syn.param_start]
                        .into_iter()
                        .find(|lit| self.held.starts_with(lit));
                    if let Some(lit) = open {
                        let Some(gt) = self.held.find('>') else {
                            return DsmlState::Structural;
                        };
                        if lit == syn.param_start {
                            let string =
                                attr(&self.held[..=gt], "string").as_deref() == Some("true");
                            self.mode = if string {
                                Mode::StringBody
                            } else {
                                Mode::Json {
                                    in_string: false,
                                    escaped: false,
                                }
                            };
                        }
                        self.consume(gt + 1);
                        continue;
                    }
                    let could_become_tag = [
                        syn.tool_calls_end,
                        syn.invoke_end,
                        syn.invoke_start,
                        syn.param_start,
                    ]
                    .iter()
                    .any(|lit| lit.starts_with(self.held.as_str()));
                    if !could_become_tag {
                        self.held.clear();
                        self.mode = Mode::Stuck;
                    }
                    return DsmlState::Structural;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(text: &str, piece: usize) -> String {
        let mut t = DsmlTracker::new();
        let chars: Vec<char> = text.chars().collect();
        let mut out = String::new();
        for chunk in chars.chunks(piece) {
            let s: String = chunk.iter().collect();
            t.push(&s);
            out.push(t.state().code());
        }
        out
    }

    #[test]
    fn structure_and_payload() {
        let head = "ok<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"p\" string=\"true\">";
        let mut t = DsmlTracker::new();
        t.push(head);
        assert_eq!(t.state(), DsmlState::StringBody);
        t.push("a <b> &amp; <");
        assert_eq!(t.state(), DsmlState::StringBody, "a lone < is payload");
        t.push("/");
        assert_eq!(
            t.state(),
            DsmlState::Structural,
            "</ starts the closing tag"
        );
        t.push("｜DSML｜parameter>\n<｜DSML｜parameter name=\"n\" string=\"false\">[{\"k\": \"v");
        assert_eq!(t.state(), DsmlState::JsonString);
        t.push("</｜DSML｜parameter>\"}]");
        assert_eq!(
            t.state(),
            DsmlState::JsonStructural,
            "a closing tag inside a JSON string is payload"
        );
        t.push("</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
        assert_eq!(t.state(), DsmlState::Outside);
        t.push("<｜DSML｜tool_calls>\n");
        assert_eq!(
            t.state(),
            DsmlState::Outside,
            "only the first block is tracked"
        );
    }

    #[test]
    fn unexpected_text_between_tags_stays_structural() {
        let mut t = DsmlTracker::new();
        t.push("<tool_calls>\n<invoke name=\"f\">\nhello");
        assert_eq!(t.state(), DsmlState::Structural);
        t.push("</invoke>\n</tool_calls>");
        assert_eq!(t.state(), DsmlState::Structural);
    }

    #[test]
    fn the_cut_into_pieces_does_not_matter() {
        let text = "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"e\">\n<｜DSML｜parameter name=\"s\" \
                    string=\"true\">a<</｜DSML｜parameter>\n<｜DSML｜parameter name=\"j\" string=\"false\">\
                    {\"a\":\"\\\"</\"}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>tail";
        let one = states(text, 1);
        let n = text.chars().count();
        for piece in [2, 3, 5, 7] {
            let got = states(text, piece);
            let want: String = (1..=n)
                .filter(|i| i % piece == 0 || *i == n)
                .map(|i| one.as_bytes()[i - 1] as char)
                .collect();
            assert_eq!(got, want, "pieces of {piece}");
        }
    }
}
