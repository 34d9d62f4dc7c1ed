//! GLM's tool calls (GLM-4.5 and later, GLM-5): XML-ish blocks with one
//! key/value pair per argument, anywhere in the output, text around them
//! kept:
//!
//! ```text
//! <tool_call>get_weather
//! <arg_key>city</arg_key>
//! <arg_value>Paris</arg_value>
//! <arg_key>days</arg_key>
//! <arg_value>3</arg_value>
//! </tool_call>
//! ```
//!
//! The chat template writes a string value raw and any other value as JSON;
//! without the tool's schema at hand a value that parses as JSON and is not
//! a bare string (a number, `true`, an object, …) is taken as that JSON,
//! anything else as a string (the fallback vLLM's GLM parser uses when it
//! has no schema). The call's name is reported as soon as it ends (at the
//! newline or the first `<arg_key>`); its arguments stream as a JSON object,
//! one `"key": value` member per completed pair, closed at `</tool_call>`.

use serde_json::Value;

use super::{ToolEvent, text_until_marker};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const KEY_OPEN: &str = "<arg_key>";
const KEY_CLOSE: &str = "</arg_key>";
const VALUE_OPEN: &str = "<arg_value>";
const VALUE_CLOSE: &str = "</arg_value>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Outside,
    /// After `<tool_call>`, reading the name.
    Name,
    /// Between pairs, or inside one (the held text is parsed per pair).
    Args,
}

#[derive(Debug, Clone)]
pub(super) struct GlmCalls {
    phase: Phase,
    held: String,
    calls: usize,
    /// Members written so far in the open call.
    members: usize,
}

impl GlmCalls {
    pub fn new() -> Self {
        Self {
            phase: Phase::Outside,
            held: String::new(),
            calls: 0,
            members: 0,
        }
    }

    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match self.phase {
                Phase::Outside => self.outside(&mut out),
                Phase::Name => self.name(&mut out),
                Phase::Args => self.args(&mut out),
            };
            if !progressed {
                return out;
            }
        }
    }

    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Outside => {
                if !held.is_empty() {
                    out.push(ToolEvent::Text(held));
                }
            }
            // A call cut off before its name ended is text after all.
            Phase::Name => out.push(ToolEvent::Text(format!("{OPEN}{held}"))),
            // A call cut off in its arguments ends with what was complete.
            Phase::Args => self.close(&mut out),
        }
        self.phase = Phase::Outside;
        out
    }

    fn outside(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let opened = text_until_marker(&mut self.held, OPEN, out);
        if opened {
            self.phase = Phase::Name;
        }
        opened
    }

    fn name(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let end = [
            self.held.find('\n'),
            self.held.find(KEY_OPEN),
            self.held.find(CLOSE),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(end) = end else {
            return false;
        };
        let name = self.held[..end].trim().to_string();
        self.held.drain(..end);
        out.push(ToolEvent::Start {
            index: self.calls,
            name,
        });
        out.push(ToolEvent::Arguments {
            index: self.calls,
            delta: "{".into(),
        });
        self.members = 0;
        self.phase = Phase::Args;
        true
    }

    fn args(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let trimmed = self.held.trim_start();
        let skip = self.held.len() - trimmed.len();
        if trimmed.starts_with(CLOSE) {
            self.held.drain(..skip + CLOSE.len());
            self.close(out);
            self.phase = Phase::Outside;
            return true;
        }
        if !trimmed.starts_with(KEY_OPEN) {
            // Not yet decidable (a partial tag), or stray text inside the
            // call, which the template never writes: wait for the close.
            return false;
        }
        let Some(pair) = parse_pair(trimmed) else {
            return false;
        };
        let (key, value, used) = pair;
        let member = format!(
            "{}{}: {}",
            if self.members > 0 { ", " } else { "" },
            Value::String(key),
            value
        );
        out.push(ToolEvent::Arguments {
            index: self.calls,
            delta: member,
        });
        self.members += 1;
        self.held.drain(..skip + used);
        true
    }

    fn close(&mut self, out: &mut Vec<ToolEvent>) {
        out.push(ToolEvent::Arguments {
            index: self.calls,
            delta: "}".into(),
        });
        out.push(ToolEvent::End { index: self.calls });
        self.calls += 1;
    }
}

/// `<arg_key>k</arg_key> <arg_value>v</arg_value>` at the start of `s`:
/// (key, the value as JSON text, bytes used), once complete.
fn parse_pair(s: &str) -> Option<(String, String, usize)> {
    let rest = &s[KEY_OPEN.len()..];
    let key_end = rest.find(KEY_CLOSE)?;
    let key = rest[..key_end].trim().to_string();
    let after_key = &rest[key_end + KEY_CLOSE.len()..];
    let lead = after_key.len() - after_key.trim_start().len();
    let v = after_key.trim_start().strip_prefix(VALUE_OPEN)?;
    let value_end = v.find(VALUE_CLOSE)?;
    let raw = &v[..value_end];
    let used = KEY_OPEN.len()
        + key_end
        + KEY_CLOSE.len()
        + lead
        + VALUE_OPEN.len()
        + value_end
        + VALUE_CLOSE.len();
    Some((key, value_json(raw), used))
}

/// A value as JSON text: JSON that is not a bare string as written, else
/// the raw text as a JSON string.
fn value_json(raw: &str) -> String {
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v) if !v.is_string() => v.to_string(),
        _ => Value::String(raw.to_string()).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assemble;
    use super::super::{ToolCallFormat, ToolCallParser};

    const TWO_CALLS: &str = "Let me check.<tool_call>get_weather\n<arg_key>city</arg_key>\n\
        <arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n\
        </tool_call><tool_call>note\n<arg_key>text</arg_key>\n<arg_value>a < b, \"quoted\"</arg_value>\n\
        <arg_key>tags</arg_key>\n<arg_value>[\"x\", 1]</arg_value>\n</tool_call> done";

    fn run_split(text: &str, at: &[usize]) -> (String, Vec<(String, String)>) {
        let mut p = ToolCallParser::new(ToolCallFormat::Glm);
        let mut events = Vec::new();
        let mut last = 0;
        for &i in at.iter().chain(std::iter::once(&text.len())) {
            if text.is_char_boundary(i) && i >= last {
                events.extend(p.push(&text[last..i]));
                last = i;
            }
        }
        events.extend(p.finish());
        assemble(&events)
    }

    /// The same calls whatever the piece boundaries: every split point, and
    /// character by character.
    #[test]
    fn calls_and_text_at_every_split() {
        let want_text = "Let me check. done";
        let want = vec![
            (
                "get_weather".to_string(),
                r#"{"city": "Paris", "days": 3}"#.to_string(),
            ),
            (
                "note".to_string(),
                r#"{"text": "a < b, \"quoted\"", "tags": ["x",1]}"#.to_string(),
            ),
        ];
        let (text, calls) = run_split(TWO_CALLS, &[]);
        assert_eq!((text.as_str(), &calls), (want_text, &want));
        for i in 0..TWO_CALLS.len() {
            assert_eq!(
                run_split(TWO_CALLS, &[i]),
                (want_text.to_string(), want.clone()),
                "split at {i}"
            );
        }
        let every: Vec<usize> = (0..TWO_CALLS.len()).collect();
        assert_eq!(run_split(TWO_CALLS, &every), (want_text.to_string(), want));
        for (_, args) in run_split(TWO_CALLS, &[]).1 {
            serde_json::from_str::<serde_json::Value>(&args).expect("arguments are JSON");
        }
    }

    #[test]
    fn a_call_without_arguments_and_a_cut_off_one() {
        let (text, calls) = run_split("<tool_call>now\n</tool_call>", &[]);
        assert_eq!(
            (text.as_str(), calls),
            ("", vec![("now".to_string(), "{}".to_string())])
        );
        // Cut off inside the name: nothing was a call.
        let (text, calls) = run_split("hi <tool_call>get_wea", &[]);
        assert_eq!((text.as_str(), calls.len()), ("hi <tool_call>get_wea", 0));
        // Cut off after a complete pair: the call ends with it.
        let (_, calls) = run_split(
            "<tool_call>f\n<arg_key>a</arg_key><arg_value>1</arg_value><arg_ke",
            &[],
        );
        assert_eq!(calls, vec![("f".to_string(), r#"{"a": 1}"#.to_string())]);
    }
}
