//! The JSON tool-call conventions: Hermes `<tool_call>{"name": …, "arguments": {…}}</tool_call>`
//! blocks anywhere in the output, text around them kept (Qwen), and the llama 3 bare JSON object
//! `{"name": …, "parameters": {…}}` as the whole reply (optionally after `<|python_tag|>`;
//! several calls may be separated by `;`; a reply that does not start with `{` is plain text).
//!
//! Once a call's name is known it is reported, then the arguments' JSON text streams as it is
//! generated: the concatenated argument deltas are exactly the JSON text the model wrote. A call
//! whose header is not in the expected `name`-then-arguments order is buffered whole and parsed
//! at its end; one that is not JSON at all is returned as text.

use serde_json::Value;

use super::ToolEvent;
use crate::reasoning::partial_suffix;

/// The two JSON conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JsonFormat {
    Hermes,
    Llama3Json,
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Hermes: ordinary text, a `<tool_call>` may come.
    /// Llama: before the first non-blank character.
    Outside,
    /// Inside a call, before its arguments start.
    Header,
    /// Streaming the arguments value.
    Args,
    /// After the arguments: the rest of the call's framing.
    Tail,
    /// A call in an unexpected shape, buffered until it ends.
    Whole,
    /// Llama: the reply is plain text from here on.
    Text,
}

/// Incremental parser of one reply's JSON tool calls.
#[derive(Debug, Clone)]
pub(super) struct JsonCalls {
    format: JsonFormat,
    phase: Phase,
    held: String,
    /// Calls started so far (the next call's index).
    calls: usize,
    json: JsonScan,
}

impl JsonCalls {
    pub fn new(format: JsonFormat) -> Self {
        Self {
            format,
            phase: Phase::Outside,
            held: String::new(),
            calls: 0,
            json: JsonScan::default(),
        }
    }

    /// Calls seen so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.held.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// End of output: whatever is held becomes text, an open call ends.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Outside | Phase::Text => text(&mut out, held),
            Phase::Header => text(&mut out, self.framing_prefix() + &held),
            Phase::Whole => self.whole_call(&mut out, &held, ""),
            Phase::Args | Phase::Tail => out.push(ToolEvent::End {
                index: self.calls - 1,
            }),
        }
        out
    }

    /// The framing already consumed before a header, restored when the
    /// header turns out not to be a call after all.
    fn framing_prefix(&self) -> String {
        match self.format {
            JsonFormat::Hermes => HERMES_OPEN.to_string(),
            JsonFormat::Llama3Json => String::new(),
        }
    }

    fn arg_keys(&self) -> &'static [&'static str] {
        match self.format {
            JsonFormat::Hermes => &["arguments"],
            JsonFormat::Llama3Json => &["parameters", "arguments"],
        }
    }

    /// One state transition; false when more text is needed.
    fn step(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        match (self.phase, self.format) {
            (Phase::Outside, JsonFormat::Hermes) => {
                if let Some(at) = self.held.find(HERMES_OPEN) {
                    let before: String = self.held.drain(..at + HERMES_OPEN.len()).collect();
                    text(out, before[..at].to_string());
                    self.phase = Phase::Header;
                    return true;
                }
                let keep = partial_suffix(&self.held, HERMES_OPEN);
                let ready: String = self.held.drain(..self.held.len() - keep).collect();
                text(out, ready);
                false
            }
            (Phase::Outside, JsonFormat::Llama3Json) => {
                let trimmed = self.held.trim_start();
                let trimmed = trimmed.strip_prefix(PYTHON_TAG).unwrap_or(trimmed);
                let trimmed = trimmed.trim_start_matches([' ', '\t', '\n', '\r', ';']);
                if trimmed.starts_with('{') {
                    let skip = self.held.len() - trimmed.len();
                    self.held.drain(..skip);
                    self.phase = Phase::Header;
                    return true;
                }
                if trimmed.is_empty() || PYTHON_TAG.starts_with(trimmed.trim_start()) {
                    return false;
                }
                self.phase = Phase::Text;
                true
            }
            (Phase::Text, _) => {
                text(out, std::mem::take(&mut self.held));
                false
            }
            (Phase::Header, _) => match parse_header(&self.held, self.arg_keys()) {
                Header::Incomplete => false,
                Header::Malformed => {
                    self.phase = Phase::Whole;
                    true
                }
                Header::Done { name, consumed } => {
                    self.held.drain(..consumed);
                    out.push(ToolEvent::Start {
                        index: self.calls,
                        name,
                    });
                    self.calls += 1;
                    self.json = JsonScan::default();
                    self.phase = Phase::Args;
                    true
                }
            },
            (Phase::Args, _) => {
                let (used, done) = self.json.scan(&self.held);
                let delta: String = self.held.drain(..used).collect();
                if !delta.is_empty() {
                    out.push(ToolEvent::Arguments {
                        index: self.calls - 1,
                        delta,
                    });
                }
                if done {
                    self.phase = Phase::Tail;
                }
                done
            }
            (Phase::Tail, JsonFormat::Hermes) => {
                let Some(at) = self.held.find(HERMES_CLOSE) else {
                    return false;
                };
                self.held.drain(..at + HERMES_CLOSE.len());
                out.push(ToolEvent::End {
                    index: self.calls - 1,
                });
                self.phase = Phase::Outside;
                true
            }
            (Phase::Tail, JsonFormat::Llama3Json) => {
                let trimmed = self.held.trim_start();
                let Some(rest) = trimmed.strip_prefix('}') else {
                    return false;
                };
                let skip = self.held.len() - rest.len();
                self.held.drain(..skip);
                out.push(ToolEvent::End {
                    index: self.calls - 1,
                });
                self.phase = Phase::Outside;
                true
            }
            (Phase::Whole, JsonFormat::Hermes) => {
                let Some(at) = self.held.find(HERMES_CLOSE) else {
                    return false;
                };
                let call: String = self.held.drain(..at + HERMES_CLOSE.len()).collect();
                self.whole_call(out, &call[..at], HERMES_CLOSE);
                self.phase = Phase::Outside;
                true
            }
            (Phase::Whole, JsonFormat::Llama3Json) => {
                let mut scan = JsonScan::default();
                let (used, done) = scan.scan(&self.held);
                if !done {
                    return false;
                }
                let call: String = self.held.drain(..used).collect();
                self.whole_call(out, &call, "");
                self.phase = Phase::Outside;
                true
            }
        }
    }

    /// A complete call in any key order, or text if it is not one (then
    /// with its framing restored: `closing` is the close tag consumed).
    fn whole_call(&mut self, out: &mut Vec<ToolEvent>, raw: &str, closing: &str) {
        let parsed: Option<(String, String)> = serde_json::from_str::<Value>(raw.trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = self.arg_keys().iter().find_map(|k| v.get(*k))?;
                Some((name, args.to_string()))
            });
        match parsed {
            Some((name, delta)) => {
                let index = self.calls;
                self.calls += 1;
                out.push(ToolEvent::Start { index, name });
                out.push(ToolEvent::Arguments { index, delta });
                out.push(ToolEvent::End { index });
            }
            None => text(out, self.framing_prefix() + raw + closing),
        }
    }
}

fn text(out: &mut Vec<ToolEvent>, s: String) {
    if s.is_empty() {
        return;
    }
    if let Some(ToolEvent::Text(prev)) = out.last_mut() {
        prev.push_str(&s);
    } else {
        out.push(ToolEvent::Text(s));
    }
}

enum Header {
    Incomplete,
    Malformed,
    Done { name: String, consumed: usize },
}

/// Parse `{ "name" : "<name>" , "<arg key>" :` plus any blank after it.
fn parse_header(s: &str, arg_keys: &[&str]) -> Header {
    let mut c = Cursor { s, at: 0 };
    let steps = (|| {
        c.blank();
        c.expect("{")?;
        c.blank();
        if c.string()? != "name" {
            return Err(Header::Malformed);
        }
        c.blank();
        c.expect(":")?;
        c.blank();
        let name = c.string()?;
        c.blank();
        c.expect(",")?;
        c.blank();
        let key = c.string()?;
        if !arg_keys.contains(&key.as_str()) {
            return Err(Header::Malformed);
        }
        c.blank();
        c.expect(":")?;
        c.blank();
        if c.at == s.len() {
            return Err(Header::Incomplete);
        }
        Ok(name)
    })();
    match steps {
        Ok(name) => Header::Done {
            name,
            consumed: c.at,
        },
        Err(h) => h,
    }
}

struct Cursor<'s> {
    s: &'s str,
    at: usize,
}

impl Cursor<'_> {
    fn blank(&mut self) {
        let rest = &self.s[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn expect(&mut self, token: &str) -> Result<(), Header> {
        let rest = &self.s[self.at..];
        if rest.starts_with(token) {
            self.at += token.len();
            Ok(())
        } else if rest.is_empty() {
            Err(Header::Incomplete)
        } else {
            Err(Header::Malformed)
        }
    }

    /// A JSON string literal, unescaped.
    fn string(&mut self) -> Result<String, Header> {
        self.expect("\"")?;
        let start = self.at - 1;
        let mut escaped = false;
        for (i, ch) in self.s[self.at..].char_indices() {
            match (escaped, ch) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    let end = self.at + i + 1;
                    self.at = end;
                    return serde_json::from_str(&self.s[start..end])
                        .map_err(|_| Header::Malformed);
                }
                _ => {}
            }
        }
        Err(Header::Incomplete)
    }
}

/// Finds where one JSON value ends in text that arrives in pieces.
#[derive(Debug, Clone, Default)]
struct JsonScan {
    depth: usize,
    started: bool,
    in_string: bool,
    escaped: bool,
}

impl JsonScan {
    /// Consume as much of `s` as belongs to the value: (bytes used, value
    /// complete). A bare scalar ends at the `,` or `}` after it (not used).
    fn scan(&mut self, s: &str) -> (usize, bool) {
        for (i, ch) in s.char_indices() {
            let end = i + ch.len_utf8();
            if self.in_string {
                match (self.escaped, ch) {
                    (true, _) => self.escaped = false,
                    (false, '\\') => self.escaped = true,
                    (false, '"') => {
                        self.in_string = false;
                        if self.depth == 0 {
                            return (end, true);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match ch {
                '"' => {
                    self.in_string = true;
                    self.started = true;
                }
                '{' | '[' => {
                    self.depth += 1;
                    self.started = true;
                }
                '}' | ']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return (end, true);
                    }
                }
                ',' | '}' | ']' if self.depth == 0 && self.started => return (i, true),
                c if c.is_whitespace() && !self.started => {}
                _ => self.started = true,
            }
        }
        (s.len(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tool_calls::testing::assemble;

    fn run(format: JsonFormat, pieces: &[&str]) -> (String, Vec<(String, String)>) {
        let mut p = JsonCalls::new(format);
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        assemble(&events)
    }

    /// Every split of `text` into three pieces gives the same result.
    fn check_all_splits(format: JsonFormat, text: &str, want: &(String, Vec<(String, String)>)) {
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a) {
                let got = run(format, &[&text[..a], &text[a..b], &text[b..]]);
                assert_eq!(&got, want, "cuts {a} {b} of {text:?}");
            }
        }
    }

    #[test]
    fn hermes_calls_with_text_around_at_every_split() {
        let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris, \\\"FR\\\"\", \"days\": [1, 2]}}\n</tool_call>";
        let want = (
            "Let me check.".to_string(),
            vec![(
                "get_weather".to_string(),
                "{\"city\": \"Paris, \\\"FR\\\"\", \"days\": [1, 2]}".to_string(),
            )],
        );
        check_all_splits(JsonFormat::Hermes, text, &want);
    }

    #[test]
    fn hermes_two_calls_and_reordered_keys() {
        let text = "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"b\"}</tool_call>";
        let (t, calls) = run(JsonFormat::Hermes, &[text]);
        assert_eq!(t, "\n");
        assert_eq!(
            calls,
            vec![("a".into(), "{}".into()), ("b".into(), "{\"x\":1}".into())]
        );
        check_all_splits(JsonFormat::Hermes, text, &(t, calls));
    }

    #[test]
    fn hermes_non_json_call_is_text_and_partial_tags_are_text() {
        assert_eq!(
            run(JsonFormat::Hermes, &["<tool_call>not json</tool_call>"]),
            ("<tool_call>not json</tool_call>".into(), vec![])
        );
        assert_eq!(
            run(JsonFormat::Hermes, &["a <tool_c", "all"]),
            ("a <tool_call".into(), vec![])
        );
        assert_eq!(
            run(JsonFormat::Hermes, &["a <tool"]),
            ("a <tool".into(), vec![])
        );
    }

    #[test]
    fn hermes_truncated_call_still_ends() {
        let (t, calls) = run(
            JsonFormat::Hermes,
            &["<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"ab"],
        );
        assert_eq!(t, "");
        assert_eq!(calls, vec![("f".into(), "{\"q\": \"ab".into())]);
    }

    #[test]
    fn arguments_stream_before_the_call_ends() {
        let mut p = JsonCalls::new(JsonFormat::Hermes);
        let events = p.push("<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"ab");
        assert_eq!(
            events,
            vec![
                ToolEvent::Start {
                    index: 0,
                    name: "f".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: "{\"q\": \"ab".into()
                },
            ]
        );
        assert_eq!(
            p.push("c\"}"),
            vec![ToolEvent::Arguments {
                index: 0,
                delta: "c\"}".into()
            }]
        );
    }

    #[test]
    fn llama3_json_calls_at_every_split() {
        let text =
            " <|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"rust {braces}\"}}";
        let want = (
            String::new(),
            vec![(
                "search".to_string(),
                "{\"query\": \"rust {braces}\"}".to_string(),
            )],
        );
        check_all_splits(JsonFormat::Llama3Json, text, &want);
        let two =
            "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": [1]}}";
        let want = (
            String::new(),
            vec![
                ("a".into(), "{}".into()),
                ("b".into(), "{\"k\": [1]}".into()),
            ],
        );
        check_all_splits(JsonFormat::Llama3Json, two, &want);
    }

    #[test]
    fn llama3_plain_text_and_non_call_objects() {
        check_all_splits(
            JsonFormat::Llama3Json,
            "Hello {there}",
            &("Hello {there}".into(), vec![]),
        );
        assert_eq!(
            run(JsonFormat::Llama3Json, &["{\"a\": 1} tail"]),
            ("{\"a\": 1} tail".into(), vec![])
        );
    }
}
