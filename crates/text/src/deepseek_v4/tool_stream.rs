//! DeepSeek-V4's tool calls out of streamed text, as ds4 streams them to
//! OpenAI clients (`openai_sse_stream_update` and `openai_tool_stream_update`
//! in `antirez/ds4:ds4_server.c`), as [`ToolEvent`]s:
//!
//! * text before the block streams as text, except trailing whitespace and a
//!   tail that could still become `<｜DSML｜tool_calls>`, which are held: the
//!   whitespace before the block is DSML syntax, not answer text;
//! * once an `invoke` tag is complete the call starts (name known) and `{` is
//!   its first argument fragment; each parameter adds `"name":` (and `"` for
//!   strings), then its value as it is generated: string bodies with the DSML
//!   entities undone and JSON-escaped, JSON values as written. A tail that
//!   could be the closing tag or a partial entity (`&am`) is held; `</invoke>`
//!   adds `}` and ends the call;
//! * `</｜DSML｜tool_calls>` closes the block: [`ToolEvent::Block`] carries the
//!   exact sampled text (with the blank line before it, when there was one),
//!   and everything after the block is dropped, as ds4 drops it.
//!
//! The concatenated fragments of a call are ds4's streamed arguments. Text is
//! already whole characters here (the detokenizer holds incomplete UTF-8).
//!
//! What the streaming grammar does not cover, ds4's final parser
//! (`parse_generated_message_ex`) may still accept: a parameter without a
//! `string` attribute (a string) or one holding nested parameters (an
//! object). From such a parameter on, the call is read whole with that
//! grammar and its remaining members are emitted at once. Markup that neither
//! grammar accepts ends the open call and comes back as text; ds4 would
//! return the whole reply as text, but fragments already streamed cannot be
//! taken back.

use super::dsml::{FULL, Syntax, attr, find_start, partial_entity_len, unescape};
use super::json_args::{c_space, minify};
use crate::reasoning::partial_suffix;
use crate::tool_calls::ToolEvent;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ordinary text; a block may start.
    Text,
    /// Inside the block, between invokes.
    Calls,
    /// Inside an invoke, between parameters.
    Params,
    /// Inside a parameter's value.
    Value { string: bool },
    /// The rest of an invoke in a shape only the final grammar reads.
    Whole,
    /// Markup no grammar reads: kept and returned as text at the end.
    Broken,
    /// After the block.
    Done,
}

/// Incremental DSML tool-call parser of one reply.
#[derive(Debug, Clone)]
pub struct DsmlCalls {
    phase: Phase,
    syntax: &'static Syntax,
    held: String,
    /// The block's exact text so far.
    raw: String,
    /// Calls started so far.
    calls: usize,
    /// The first call of the current block.
    block_first: usize,
    /// No parameter written yet in the open call.
    first_param: bool,
}

impl Default for DsmlCalls {
    fn default() -> Self {
        Self::new()
    }
}

enum Step {
    Again,
    Wait,
}

impl DsmlCalls {
    pub fn new() -> Self {
        Self {
            phase: Phase::Text,
            syntax: &FULL,
            held: String::new(),
            raw: String::new(),
            calls: 0,
            block_first: 0,
            first_param: true,
        }
    }

    /// Calls started so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        if self.phase == Phase::Done {
            return out;
        }
        self.held.push_str(text);
        while let Step::Again = self.step(&mut out) {}
        out
    }

    /// End of output: held text is released, an open call ends.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match self.phase {
            Phase::Text => text(&mut out, held),
            Phase::Broken => text(&mut out, std::mem::take(&mut self.raw) + &held),
            Phase::Params | Phase::Value { .. } | Phase::Whole => self.end_call(&mut out),
            Phase::Calls | Phase::Done => {}
        }
        self.phase = Phase::Done;
        out
    }

    /// Move `n` held bytes into the block's raw text.
    fn take(&mut self, n: usize) -> String {
        let s: String = self.held.drain(..n).collect();
        self.raw.push_str(&s);
        s
    }

    fn skip_ws(&mut self) {
        let n = self.held.bytes().take_while(|&b| c_space(b)).count();
        self.take(n);
    }

    fn args(&self, out: &mut Vec<ToolEvent>, delta: String) {
        if !delta.is_empty() {
            out.push(ToolEvent::Arguments {
                index: self.calls,
                delta,
            });
        }
    }

    fn end_call(&mut self, out: &mut Vec<ToolEvent>) {
        out.push(ToolEvent::End { index: self.calls });
        self.calls += 1;
    }

    fn step(&mut self, out: &mut Vec<ToolEvent>) -> Step {
        match self.phase {
            Phase::Text => self.text(out),
            Phase::Calls => self.between_calls(out),
            Phase::Params => self.between_params(out),
            Phase::Value { string } => self.value(out, string),
            Phase::Whole => self.whole(out),
            Phase::Broken | Phase::Done => Step::Wait,
        }
    }

    fn text(&mut self, out: &mut Vec<ToolEvent>) -> Step {
        if let Some((at, syntax)) = find_start(&self.held) {
            let before: String = self.held.drain(..at).collect();
            text(out, trim_end(&before).to_string());
            // ds4 keeps the blank line before the block with the block
            // (`raw_dsml`), so replaying it restores the sampled bytes.
            self.raw = if before.ends_with("\n\n") {
                "\n\n".to_string()
            } else {
                String::new()
            };
            self.syntax = syntax;
            self.block_first = self.calls;
            self.take(syntax.tool_calls_start.len());
            self.phase = Phase::Calls;
            return Step::Again;
        }
        let partial = crate::deepseek_v4::dsml::SYNTAXES
            .iter()
            .map(|s| partial_suffix(&self.held, s.tool_calls_start))
            .max()
            .unwrap_or(0);
        let ready = trim_end(&self.held[..self.held.len() - partial]).len();
        let ready: String = self.held.drain(..ready).collect();
        text(out, ready);
        Step::Wait
    }

    fn between_calls(&mut self, out: &mut Vec<ToolEvent>) -> Step {
        self.skip_ws();
        let syn = self.syntax;
        if self.held.is_empty() {
            return Step::Wait;
        }
        if self.held.starts_with(syn.tool_calls_end) {
            self.take(syn.tool_calls_end.len());
            out.push(ToolEvent::Block {
                calls: self.block_first..self.calls,
                raw: std::mem::take(&mut self.raw),
            });
            self.held.clear();
            self.phase = Phase::Done;
            return Step::Wait;
        }
        if self.held.starts_with(syn.invoke_start) {
            let Some(gt) = self.held.find('>') else {
                return Step::Wait;
            };
            let Some(name) = attr(&self.held[..=gt], "name") else {
                self.phase = Phase::Broken;
                return Step::Wait;
            };
            self.take(gt + 1);
            out.push(ToolEvent::Start {
                index: self.calls,
                name,
            });
            self.args(out, "{".into());
            self.first_param = true;
            self.phase = Phase::Params;
            return Step::Again;
        }
        if prefix_of_any(&self.held, &[syn.tool_calls_end, syn.invoke_start]) {
            return Step::Wait;
        }
        self.phase = Phase::Broken;
        Step::Wait
    }

    fn between_params(&mut self, out: &mut Vec<ToolEvent>) -> Step {
        self.skip_ws();
        let syn = self.syntax;
        if self.held.is_empty() {
            return Step::Wait;
        }
        if self.held.starts_with(syn.invoke_end) {
            self.take(syn.invoke_end.len());
            self.args(out, "}".into());
            self.end_call(out);
            self.phase = Phase::Calls;
            return Step::Again;
        }
        if self.held.starts_with(syn.param_start) {
            let Some(gt) = self.held.find('>') else {
                return Step::Wait;
            };
            let tag = &self.held[..=gt];
            let (Some(name), Some(string)) = (attr(tag, "name"), attr(tag, "string")) else {
                // Only the final grammar reads this parameter.
                self.phase = Phase::Whole;
                return Step::Again;
            };
            let string = string == "true";
            self.take(gt + 1);
            let mut head = if self.first_param { "" } else { "," }.to_string();
            head.push_str(&json_quote(&name));
            head.push(':');
            if string {
                head.push('"');
            }
            self.first_param = false;
            self.args(out, head);
            self.phase = Phase::Value { string };
            return Step::Again;
        }
        if prefix_of_any(&self.held, &[syn.invoke_end, syn.param_start]) {
            return Step::Wait;
        }
        self.phase = Phase::Whole;
        Step::Again
    }

    fn value(&mut self, out: &mut Vec<ToolEvent>, string: bool) -> Step {
        let end = self.syntax.param_end;
        let convert = |s: &str| {
            if string {
                json_fragment(&unescape(s))
            } else {
                s.to_string()
            }
        };
        if let Some(at) = self.held.find(end) {
            let body = self.take(at);
            self.take(end.len());
            let mut delta = convert(&body);
            if string {
                delta.push('"');
            }
            self.args(out, delta);
            self.phase = Phase::Params;
            return Step::Again;
        }
        let mut ready = self.held.len() - partial_suffix(&self.held, end);
        if string {
            ready -= partial_entity_len(&self.held[..ready]);
        }
        let body = self.take(ready);
        self.args(out, convert(&body));
        Step::Wait
    }

    fn whole(&mut self, out: &mut Vec<ToolEvent>) -> Step {
        match read_params(&self.held, self.syntax) {
            Read::Incomplete => Step::Wait,
            Read::Malformed => {
                // The open call ends with what it has; the markup is text.
                self.args(out, "}".into());
                self.end_call(out);
                self.phase = Phase::Broken;
                Step::Wait
            }
            Read::Done { members, consumed } => {
                let mut delta = String::new();
                for m in members {
                    if !self.first_param {
                        delta.push(',');
                    }
                    self.first_param = false;
                    delta.push_str(&m);
                }
                delta.push('}');
                self.take(consumed);
                self.args(out, delta);
                self.end_call(out);
                self.phase = Phase::Calls;
                Step::Again
            }
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

/// `trim_tool_separator_ws`: without trailing C whitespace.
fn trim_end(s: &str) -> &str {
    s.trim_end_matches(|c: char| c.is_ascii() && c_space(c as u8))
}

/// Whether `s` could still grow into one of `lits`.
fn prefix_of_any(s: &str, lits: &[&str]) -> bool {
    lits.iter().any(|l| l.starts_with(s))
}

/// ds4's `json_escape_fragment_n`: `"` and `\` escaped, `\n` `\r` `\t`
/// spelled, other control bytes as `\u00XX`, the rest as it is.
fn json_fragment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn json_quote(s: &str) -> String {
    format!("\"{}\"", json_fragment(s))
}

enum Read {
    Incomplete,
    Malformed,
    /// `"name":value` members, and the bytes through `</invoke>`.
    Done {
        members: Vec<String>,
        consumed: usize,
    },
}

/// The rest of an invoke with ds4's final grammar (the parameter loop of
/// `parse_generated_message_ex`): a parameter without `string` is a string,
/// unless its body starts with parameters, which then form an object
/// (`dsml_parse_nested_params_object`).
fn read_params(s: &str, syn: &Syntax) -> Read {
    let mut at = 0;
    let mut members = Vec::new();
    loop {
        at += ws_len(&s[at..]);
        let rest = &s[at..];
        if rest.starts_with(syn.invoke_end) {
            return Read::Done {
                members,
                consumed: at + syn.invoke_end.len(),
            };
        }
        if !rest.starts_with(syn.param_start) {
            return if prefix_of_any(rest, &[syn.invoke_end, syn.param_start]) {
                Read::Incomplete
            } else {
                Read::Malformed
            };
        }
        let Some(gt) = rest.find('>') else {
            return Read::Incomplete;
        };
        let tag = &rest[..=gt];
        let Some(name) = attr(tag, "name") else {
            return Read::Malformed;
        };
        let kind = attr(tag, "string");
        at += gt + 1;
        let body = &s[at..];
        let nested_start = ws_len(body);
        if kind.is_none() && body[nested_start..].starts_with(syn.param_start) {
            match read_leaves(&body[nested_start..], syn) {
                Leaves::Incomplete => return Read::Incomplete,
                Leaves::Malformed => return Read::Malformed,
                Leaves::Done {
                    members: inner,
                    consumed,
                } => {
                    at += nested_start + consumed;
                    at += ws_len(&s[at..]);
                    let after = &s[at..];
                    if after.starts_with(syn.param_end) {
                        at += syn.param_end.len();
                    } else if syn.param_end.starts_with(after) {
                        return Read::Incomplete;
                    }
                    members.push(format!("{}:{{{}}}", json_quote(&name), inner.join(",")));
                    continue;
                }
            }
        }
        let Some(len) = body.find(syn.param_end) else {
            return Read::Incomplete;
        };
        members.push(member(
            &name,
            &body[..len],
            kind.as_deref().unwrap_or("true"),
        ));
        at += len + syn.param_end.len();
    }
}

enum Leaves {
    Incomplete,
    Malformed,
    Done {
        members: Vec<String>,
        consumed: usize,
    },
}

/// Consecutive leaf parameters (`dsml_parse_leaf_param_json`).
fn read_leaves(s: &str, syn: &Syntax) -> Leaves {
    let mut at = 0;
    let mut members = Vec::new();
    loop {
        let ws = ws_len(&s[at..]);
        let rest = &s[at + ws..];
        if !rest.starts_with(syn.param_start) {
            if rest.is_empty() || syn.param_start.starts_with(rest) {
                return Leaves::Incomplete;
            }
            return if members.is_empty() {
                Leaves::Malformed
            } else {
                Leaves::Done {
                    members,
                    consumed: at,
                }
            };
        }
        let Some(gt) = rest.find('>') else {
            return Leaves::Incomplete;
        };
        let tag = &rest[..=gt];
        let Some(name) = attr(tag, "name") else {
            return Leaves::Malformed;
        };
        let kind = attr(tag, "string");
        let body = &rest[gt + 1..];
        let Some(len) = body.find(syn.param_end) else {
            return Leaves::Incomplete;
        };
        members.push(member(
            &name,
            &body[..len],
            kind.as_deref().unwrap_or("true"),
        ));
        at += ws + gt + 1 + len + syn.param_end.len();
    }
}

/// `tool_call_json_args_add` in compact form.
fn member(name: &str, raw: &str, kind: &str) -> String {
    let value = if kind == "true" {
        json_quote(&unescape(raw))
    } else {
        match minify(raw) {
            v if v.is_empty() => "null".to_string(),
            v => v,
        }
    };
    format!("{}:{value}", json_quote(name))
}

fn ws_len(s: &str) -> usize {
    s.bytes().take_while(|&b| c_space(b)).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool_calls::testing::assemble;

    /// Text, and (name, arguments) per call.
    type Assembled = (String, Vec<(String, String)>);

    fn run(pieces: &[&str]) -> (Vec<ToolEvent>, Assembled) {
        let mut p = DsmlCalls::new();
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        let got = assemble(&events);
        (events, got)
    }

    const BLOCK: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n\
        <｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; echo \"é\"</｜DSML｜parameter>\n\
        <｜DSML｜parameter name=\"n\" string=\"false\">{\"a\": [1, 2]}</｜DSML｜parameter>\n\
        </｜DSML｜invoke>\n</｜DSML｜tool_calls>";

    #[test]
    fn calls_at_every_split_and_the_block_is_kept_exactly() {
        let text = format!("I'll run it.{BLOCK}\nignored");
        let want = (
            "I'll run it.".to_string(),
            vec![(
                "bash".to_string(),
                "{\"command\":\"ls && echo \\\"é\\\"\",\"n\":{\"a\": [1, 2]}}".to_string(),
            )],
        );
        let cuts: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a).step_by(7) {
                let (events, got) = run(&[&text[..a], &text[a..b], &text[b..]]);
                assert_eq!(got, want, "cuts {a} {b}");
                let blocks: Vec<&ToolEvent> = events
                    .iter()
                    .filter(|e| matches!(e, ToolEvent::Block { .. }))
                    .collect();
                assert_eq!(
                    blocks,
                    [&ToolEvent::Block {
                        calls: 0..1,
                        raw: BLOCK.to_string()
                    }],
                    "cuts {a} {b}"
                );
            }
        }
    }

    #[test]
    fn arguments_stream_and_entities_are_never_split() {
        let mut p = DsmlCalls::new();
        let mut ev = p.push("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"q\" string=\"true\">a &am");
        assert_eq!(
            ev,
            [
                ToolEvent::Start {
                    index: 0,
                    name: "f".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: "{".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: "\"q\":\"".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: "a ".into()
                },
            ]
        );
        ev = p.push("p; b</｜DSML｜para");
        assert_eq!(
            ev,
            [ToolEvent::Arguments {
                index: 0,
                delta: "& b".into()
            }]
        );
    }

    #[test]
    fn loose_parameters_are_read_whole() {
        let text = "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"h\">\n\
            <｜DSML｜parameter name=\"a\" string=\"true\">x</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"p\">plain &lt;</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"obj\">\n<｜DSML｜parameter name=\"k\" string=\"true\">v</｜DSML｜parameter>\n\
            <｜DSML｜parameter name=\"n\" string=\"false\">5</｜DSML｜parameter>\n</｜DSML｜parameter>\n\
            </｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let (_, got) = run(&[text]);
        assert_eq!(
            got.1,
            [(
                "h".to_string(),
                "{\"a\":\"x\",\"p\":\"plain <\",\"obj\":{\"k\":\"v\",\"n\":5}}".to_string()
            )]
        );
    }

    #[test]
    fn broken_markup_is_text_and_truncation_ends_the_call() {
        let (_, got) =
            run(&["ok <｜DSML｜tool_calls>\n<｜DSML｜invoke nom=\"x\">\n</｜DSML｜invoke>"]);
        let want = "ok<｜DSML｜tool_calls>\n<｜DSML｜invoke nom=\"x\">\n</｜DSML｜invoke>";
        assert_eq!(got, (want.to_string(), vec![]));
        let (events, got) = run(&[
            "<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"q\" string=\"true\">ab",
        ]);
        assert_eq!(got.1, [("f".to_string(), "{\"q\":\"ab".to_string())]);
        assert!(!events.iter().any(|e| matches!(e, ToolEvent::Block { .. })));
        // Text with no block keeps its trailing whitespace at the end.
        assert_eq!(
            run(&["a < b\n\n", "c  "]).1,
            ("a < b\n\nc  ".to_string(), vec![])
        );
    }
}
