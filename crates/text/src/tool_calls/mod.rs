//! Parsing a family's tool calls out of streamed text.
//!
//! Five conventions:
//!
//! * [`ToolCallFormat::Hermes`] (Qwen) and [`ToolCallFormat::Llama3Json`]
//!   (llama 3): JSON calls (`json.rs`).
//! * [`ToolCallFormat::Dsml`] (DeepSeek-V4): DSML blocks, parsed as ds4 does
//!   (`crate::deepseek_v4::tool_stream`).
//! * [`ToolCallFormat::Glm`] (GLM-5): `<tool_call>name<arg_key>…</arg_key>
//!   <arg_value>…</arg_value></tool_call>` (`glm.rs`).
//! * [`ToolCallFormat::QwenXml`] (Qwen3.5, `qwen4_exp`): `<tool_call>
//!   <function=NAME><parameter=P>…</parameter></function></tool_call>`,
//!   values typed by the tool's schema (`qwen_xml.rs`).
//!
//! Every parser is incremental: text pieces in, [`ToolEvent`]s out. Once a
//! call's name is known it is reported ([`ToolEvent::Start`]), then its
//! arguments stream as JSON text ([`ToolEvent::Arguments`]) as they are
//! generated, so a client sees arguments grow token by token.

mod glm;
mod json;
mod qwen_xml;
#[cfg(test)]
mod qwen_xml_tests;

use std::collections::HashMap;
use std::sync::Arc;

use crate::deepseek_v4::tool_stream::DsmlCalls;
use glm::GlmCalls;
use json::{JsonCalls, JsonFormat};
use qwen_xml::QwenXmlCalls;

/// The tools a request offered, by name: each one's parameters JSON schema
/// (a format whose values are untyped text reads the types from it).
pub type ToolSchemas = HashMap<String, serde_json::Value>;

/// How a family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    Hermes,
    Llama3Json,
    /// DeepSeek-V4's `<｜DSML｜tool_calls>` blocks.
    Dsml,
    /// GLM's `<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value>`.
    Glm,
    /// Qwen3.5's `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n
    /// </function>\n</tool_call>`.
    QwenXml,
}

/// What the parser recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    Text(String),
    /// A call `index` (0-based, in order) to the function `name` began.
    Start {
        index: usize,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    Arguments {
        index: usize,
        delta: String,
    },
    /// Call `index` is complete.
    End {
        index: usize,
    },
    /// A DSML block closed: the exact text the model wrote for the calls
    /// `calls` (from the blank line before its opening tag, when there is
    /// one, to its closing tag), which a later prompt replays byte for byte.
    Block {
        calls: std::ops::Range<usize>,
        raw: String,
    },
}

#[derive(Debug, Clone)]
enum Inner {
    Json(JsonCalls),
    Dsml(DsmlCalls),
    Glm(GlmCalls),
    QwenXml(QwenXmlCalls),
}

/// Incremental tool-call parser for one reply.
#[derive(Debug, Clone)]
pub struct ToolCallParser(Inner);

impl ToolCallParser {
    pub fn new(format: ToolCallFormat) -> Self {
        Self::with_schemas(format, None)
    }

    /// A parser that knows the offered tools' parameter schemas (`QwenXml`
    /// types its values by them; the other formats write JSON and ignore them).
    pub fn with_schemas(format: ToolCallFormat, schemas: Option<Arc<ToolSchemas>>) -> Self {
        Self(match format {
            ToolCallFormat::Hermes => Inner::Json(JsonCalls::new(JsonFormat::Hermes)),
            ToolCallFormat::Llama3Json => Inner::Json(JsonCalls::new(JsonFormat::Llama3Json)),
            ToolCallFormat::Dsml => Inner::Dsml(DsmlCalls::new()),
            ToolCallFormat::Glm => Inner::Glm(GlmCalls::new()),
            ToolCallFormat::QwenXml => Inner::QwenXml(QwenXmlCalls::new(schemas)),
        })
    }

    /// Calls seen so far.
    pub fn calls(&self) -> usize {
        match &self.0 {
            Inner::Json(p) => p.calls(),
            Inner::Dsml(p) => p.calls(),
            Inner::Glm(p) => p.calls(),
            Inner::QwenXml(p) => p.calls(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        match &mut self.0 {
            Inner::Json(p) => p.push(text),
            Inner::Dsml(p) => p.push(text),
            Inner::Glm(p) => p.push(text),
            Inner::QwenXml(p) => p.push(text),
        }
    }

    /// End of output: whatever is held becomes text, an open call ends.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        match &mut self.0 {
            Inner::Json(p) => p.finish(),
            Inner::Dsml(p) => p.finish(),
            Inner::Glm(p) => p.finish(),
            Inner::QwenXml(p) => p.finish(),
        }
    }
}

/// Text before a call's opening `marker`, for the XML-style formats (GLM,
/// Qwen): moves the text in `held` up to `marker` into `out` and drops the
/// marker, returning true once it has been seen; until then emits what
/// cannot be the start of `marker` and keeps back the rest (a marker split
/// across tokens).
pub(crate) fn text_until_marker(held: &mut String, marker: &str, out: &mut Vec<ToolEvent>) -> bool {
    if let Some(at) = held.find(marker) {
        if at > 0 {
            out.push(ToolEvent::Text(held[..at].to_string()));
        }
        held.drain(..at + marker.len());
        return true;
    }
    let emit = held.len() - crate::reasoning::partial_suffix(held, marker);
    if emit > 0 {
        out.push(ToolEvent::Text(held[..emit].to_string()));
        held.drain(..emit);
    }
    false
}

#[cfg(test)]
pub(crate) mod testing {
    use super::ToolEvent;

    /// What a client would assemble: text, and (name, arguments) per call.
    /// Checks the event order (calls start in order, one at a time, and end).
    pub fn assemble(events: &[ToolEvent]) -> (String, Vec<(String, String)>) {
        let mut text = String::new();
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut open = None;
        for e in events {
            match e {
                ToolEvent::Text(t) => text.push_str(t),
                ToolEvent::Start { index, name } => {
                    assert_eq!(*index, calls.len());
                    assert_eq!(open, None, "a call started inside another");
                    calls.push((name.clone(), String::new()));
                    open = Some(*index);
                }
                ToolEvent::Arguments { index, delta } => {
                    assert_eq!(open, Some(*index));
                    calls[*index].1.push_str(delta);
                }
                ToolEvent::End { index } => {
                    assert_eq!(open.take(), Some(*index));
                }
                ToolEvent::Block { calls: range, .. } => {
                    assert_eq!(open, None, "a block ended inside a call");
                    assert!(range.end <= calls.len());
                }
            }
        }
        assert_eq!(open, None, "a call never ended");
        (text, calls)
    }
}
