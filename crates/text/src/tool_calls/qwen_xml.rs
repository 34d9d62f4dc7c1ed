//! Qwen3.5's tool calls (also Qwen3-Coder's): one XML-ish block per call,
//! anywhere in the output, text around them kept:
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! <parameter=days>
//! 3
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Read as vLLM's `qwen3_coder` tool parser reads it (vllm/entrypoints/
//! openai/tool_parsers/qwen3coder_tool_parser.py): a parameter's value is
//! the text after `<parameter=NAME>` up to `</parameter>`, the next
//! `<parameter=` or `</function>`, one leading and one trailing newline
//! removed; it is typed by the tool's JSON schema (`convert_value`): `null`
//! is null whatever the type, a string type (or a parameter the schema does
//! not list) keeps the text, integers and numbers parse (a number with no
//! fraction becomes an integer), booleans are `true` when the text is
//! `true` in any case, anything else parses as JSON, and whatever does not
//! parse stays a string. The call's name is reported when `<function=NAME>`
//! closes; its arguments stream as a JSON object, one `"key": value` member
//! per completed parameter, closed at `</function>`.

use std::sync::Arc;

use serde_json::{Number, Value};

use super::{ToolEvent, ToolSchemas, text_until_marker};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const FUNCTION: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Outside,
    /// After `<tool_call>`, before `<function=NAME>` has closed.
    Header,
    /// Inside `<function=…>`: parameters until `</function>`.
    Params,
    /// After `</function>`, expecting `</tool_call>`.
    Closing,
}

#[derive(Debug, Clone)]
pub(super) struct QwenXmlCalls {
    phase: Phase,
    held: String,
    calls: usize,
    /// Members written so far in the open call.
    members: usize,
    /// The open call's parameters schema (`properties`), when known.
    properties: Option<Value>,
    schemas: Option<Arc<ToolSchemas>>,
}

impl QwenXmlCalls {
    pub fn new(schemas: Option<Arc<ToolSchemas>>) -> Self {
        Self {
            phase: Phase::Outside,
            held: String::new(),
            calls: 0,
            members: 0,
            properties: None,
            schemas,
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
                Phase::Header => self.header(&mut out),
                Phase::Params => self.params(&mut out, false),
                Phase::Closing => self.closing(),
            };
            if !progressed {
                return out;
            }
        }
    }

    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        match self.phase {
            Phase::Outside => {}
            // A call cut off before its function was named is text after all.
            Phase::Header => {
                self.held.insert_str(0, OPEN);
                self.phase = Phase::Outside;
            }
            // Cut off in its parameters: a parameter whose name is complete
            // ends where the text ends (the reference's `$` alternative).
            Phase::Params => {
                while self.phase == Phase::Params && self.params(&mut out, true) {}
                if self.phase == Phase::Params {
                    self.close(&mut out);
                    self.held.clear();
                } else if !self.closing() {
                    self.held.clear();
                }
            }
            Phase::Closing => {
                if !self.closing() {
                    self.held.clear();
                }
            }
        }
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            out.push(ToolEvent::Text(held));
        }
        self.phase = Phase::Outside;
        out
    }

    fn outside(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let opened = text_until_marker(&mut self.held, OPEN, out);
        if opened {
            self.phase = Phase::Header;
        }
        opened
    }

    fn header(&mut self, out: &mut Vec<ToolEvent>) -> bool {
        let trimmed = self.held.trim_start();
        let skip = self.held.len() - trimmed.len();
        if trimmed.len() < FUNCTION.len() {
            if FUNCTION.starts_with(trimmed) {
                return false;
            }
        } else if let Some(rest) = trimmed.strip_prefix(FUNCTION) {
            let Some(end) = rest.find('>') else {
                return false;
            };
            let name = rest[..end].trim().to_string();
            self.held.drain(..skip + FUNCTION.len() + end + 1);
            self.properties = self
                .schemas
                .as_ref()
                .and_then(|s| s.get(&name))
                .and_then(|p| p.get("properties"))
                .cloned();
            out.push(ToolEvent::Start {
                index: self.calls,
                name,
            });
            out.push(ToolEvent::Arguments {
                index: self.calls,
                delta: "{".into(),
            });
            self.members = 0;
            self.phase = Phase::Params;
            return true;
        }
        // Not a function block: the tag was text; what follows it is read
        // again as text.
        out.push(ToolEvent::Text(OPEN.to_string()));
        self.phase = Phase::Outside;
        true
    }

    /// One step inside the function: a parameter, `</function>`, or
    /// whitespace/stray text skipped. `at_end`: no more text will come.
    fn params(&mut self, out: &mut Vec<ToolEvent>, at_end: bool) -> bool {
        let Some(lt) = self.held.find('<') else {
            // Stray text between parameters (the template writes only
            // newlines there) is not part of any value.
            self.held.clear();
            return false;
        };
        if lt > 0 {
            self.held.drain(..lt);
        }
        if self.held.starts_with(FUNCTION_CLOSE) {
            self.held.drain(..FUNCTION_CLOSE.len());
            self.close(out);
            self.phase = Phase::Closing;
            return true;
        }
        if let Some(rest) = self.held.strip_prefix(PARAM) {
            let Some(name_end) = rest.find('>') else {
                return false;
            };
            let body = &rest[name_end + 1..];
            let ends = [
                body.find(PARAM_CLOSE).map(|i| (i, PARAM_CLOSE.len())),
                body.find(PARAM).map(|i| (i, 0)),
                body.find(FUNCTION_CLOSE).map(|i| (i, 0)),
            ];
            let end = match ends.into_iter().flatten().min_by_key(|(i, _)| *i) {
                Some(end) => end,
                None if at_end => (body.len(), 0),
                None => return false,
            };
            let name = rest[..name_end].to_string();
            let mut value = &body[..end.0];
            value = value.strip_prefix('\n').unwrap_or(value);
            value = value.strip_suffix('\n').unwrap_or(value);
            let typed = convert_value(value, &name, self.properties.as_ref());
            let member = format!(
                "{}{}: {}",
                if self.members > 0 { ", " } else { "" },
                Value::String(name.clone()),
                typed
            );
            out.push(ToolEvent::Arguments {
                index: self.calls,
                delta: member,
            });
            self.members += 1;
            let used = PARAM.len() + name_end + 1 + end.0 + end.1;
            self.held.drain(..used);
            return true;
        }
        let could_be_tag = [FUNCTION_CLOSE, PARAM]
            .iter()
            .any(|tag| tag.starts_with(self.held.as_str()));
        if could_be_tag && !at_end {
            return false;
        }
        // A `<` that starts no tag: skip it.
        self.held.drain(..1);
        true
    }

    fn closing(&mut self) -> bool {
        let trimmed = self.held.trim_start();
        let skip = self.held.len() - trimmed.len();
        if trimmed.starts_with(CLOSE) {
            self.held.drain(..skip + CLOSE.len());
            self.phase = Phase::Outside;
            return true;
        }
        if CLOSE.starts_with(trimmed) {
            return false;
        }
        // The block was never closed: what follows is text again.
        self.phase = Phase::Outside;
        true
    }

    fn close(&mut self, out: &mut Vec<ToolEvent>) {
        out.push(ToolEvent::Arguments {
            index: self.calls,
            delta: "}".into(),
        });
        out.push(ToolEvent::End { index: self.calls });
        self.calls += 1;
        self.properties = None;
    }
}

/// A parameter's text as the JSON value the reference parser makes of it
/// (its `_convert_param_value`), written as JSON text.
pub(super) fn convert_value(raw: &str, name: &str, properties: Option<&Value>) -> Value {
    if raw.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let text = || Value::String(raw.to_string());
    let Some(schema) = properties.and_then(|p| p.get(name)) else {
        return text();
    };
    // The reference lower-cases `str(type)`: a list of types is never one
    // of the named kinds and goes to the JSON branch.
    let kind = match schema.get("type") {
        None => "string".to_string(),
        Some(Value::String(s)) => s.trim().to_lowercase(),
        Some(_) => "other".to_string(),
    };
    let k = kind.as_str();
    if matches!(k, "string" | "str" | "text" | "varchar" | "char" | "enum") {
        return text();
    }
    if ["int", "uint", "long", "short", "unsigned"]
        .iter()
        .any(|p| k.starts_with(p))
    {
        return parse_int(raw).map_or_else(text, Value::Number);
    }
    if k.starts_with("num") || k.starts_with("float") {
        return match raw.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15 => {
                Value::Number(Number::from(f as i64))
            }
            Ok(f) => Number::from_f64(f).map_or_else(text, Value::Number),
            Err(_) => text(),
        };
    }
    if matches!(k, "boolean" | "bool" | "binary") {
        return Value::Bool(raw.to_lowercase() == "true");
    }
    serde_json::from_str(raw).unwrap_or_else(|_| text())
}

/// Python's `int(text)`: surrounding whitespace, a sign, digits, `_`
/// between digits.
fn parse_int(raw: &str) -> Option<Number> {
    let t = raw.trim();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let n: i128 = clean.parse().ok()?;
    let n = if neg { -n } else { n };
    i64::try_from(n)
        .ok()
        .map(Number::from)
        .or_else(|| u64::try_from(n).ok().map(Number::from))
}
