//! The DeepSeek-V4 chat prompt, rendered in code exactly as ds4 renders it
//! (`render_chat_prompt_text` in `antirez/ds4:ds4_server.c`); the model ships
//! no Jinja template.
//!
//! ```text
//! <｜begin▁of▁sentence｜>[Think Max prefix][tools block][\n\n][system texts, "\n\n"-joined]
//! <｜User｜>user text
//! <｜User｜><tool_result>…</tool_result><tool_result>…</tool_result>   (consecutive results share one <｜User｜>)
//! <｜Assistant｜><think>reasoning</think>text[DSML calls]<｜end▁of▁sentence｜>
//! <｜Assistant｜><think>                                              (or </think> without thinking)
//! ```
//!
//! * The tools block goes *before* the client's system text, so the part of
//!   the prompt that changes between agent requests starts as late as
//!   possible.
//! * An assistant turn opens with `<｜Assistant｜>` only after a user or tool
//!   message; consecutive assistant messages continue the same turn.
//! * Old reasoning is dropped: with thinking on, an assistant turn keeps its
//!   `<think>reasoning</think>` only when the conversation has tool context
//!   (tools offered, a tool message, or an assistant tool call anywhere) or
//!   the turn comes after the last user/tool message; otherwise it gets a
//!   bare `</think>`. Without thinking every assistant turn gets `</think>`.
//! * A call with a remembered sampled block is replayed byte for byte; other
//!   calls are written as canonical DSML ([`super::dsml::canonical_calls`]).

use super::dsml::{canonical_calls, escape_tool_result, tools_prompt};
use super::thinking::{THINK_MAX_PREFIX, ThinkMode};

pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";
pub const USER: &str = "<｜User｜>";
pub const ASSISTANT: &str = "<｜Assistant｜>";
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// Who wrote a message, in ds4's four classes (`developer` is a system
/// message; `function` a tool message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Tool,
    Assistant,
}

/// A tool call of an assistant message, as the client sent it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    /// The arguments' JSON text (anything else is written as one string
    /// parameter, as ds4 does).
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// The assistant's earlier reasoning (empty when none was sent back).
    pub reasoning: String,
    pub calls: Vec<Call>,
    /// The exact DSML block the model sampled for `calls`, when the server
    /// remembers it (exact replay); rendered instead of canonical DSML.
    pub sampled_dsml: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning: String::new(),
            calls: Vec::new(),
            sampled_dsml: None,
        }
    }
}

/// `chat_history_uses_tool_context`.
fn tool_context(messages: &[Message], tool_schemas: &[String]) -> bool {
    !tool_schemas.is_empty()
        || messages
            .iter()
            .any(|m| m.role == Role::Tool || (m.role == Role::Assistant && !m.calls.is_empty()))
}

/// The prompt text for `messages` with the tools `tool_schemas` (one JSON
/// schema each, as the tools block lists them) in `mode`. Tokenize it with
/// added-token text parsed (`<｜User｜>` and the other markers are tokens).
pub fn render(messages: &[Message], tool_schemas: &[String], mode: ThinkMode) -> String {
    let think = mode.enabled();
    let keep_all_reasoning = tool_context(messages, tool_schemas);
    let last_user = messages
        .iter()
        .rposition(|m| matches!(m.role, Role::User | Role::Tool));

    let mut system = tools_prompt(tool_schemas);
    for m in messages.iter().filter(|m| m.role == Role::System) {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&m.content);
    }

    let mut out = String::from(BOS);
    if mode == ThinkMode::Max {
        out.push_str(THINK_MAX_PREFIX);
    }
    out.push_str(&system);

    let mut pending_assistant = false;
    let mut pending_tool_result = false;
    for (i, m) in messages.iter().enumerate() {
        match m.role {
            Role::System => {}
            Role::User => {
                out.push_str(USER);
                out.push_str(&m.content);
                pending_assistant = true;
                pending_tool_result = false;
            }
            Role::Tool => {
                if !pending_tool_result {
                    out.push_str(USER);
                }
                out.push_str("<tool_result>");
                out.push_str(&escape_tool_result(&m.content));
                out.push_str("</tool_result>");
                pending_assistant = true;
                pending_tool_result = true;
            }
            Role::Assistant => {
                if pending_assistant {
                    out.push_str(ASSISTANT);
                    if think && (keep_all_reasoning || last_user.is_none_or(|u| i > u)) {
                        out.push_str(THINK_OPEN);
                        out.push_str(&m.reasoning);
                    }
                    out.push_str(THINK_CLOSE);
                }
                out.push_str(&m.content);
                match &m.sampled_dsml {
                    Some(block) if !m.calls.is_empty() && !block.is_empty() => out.push_str(block),
                    _ => out.push_str(&canonical_calls(
                        m.calls
                            .iter()
                            .map(|c| (c.name.as_str(), c.arguments.as_str())),
                    )),
                }
                out.push_str(EOS);
                pending_assistant = false;
                pending_tool_result = false;
            }
        }
    }
    if pending_assistant {
        out.push_str(ASSISTANT);
        out.push_str(if think { THINK_OPEN } else { THINK_CLOSE });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assistant(content: &str, reasoning: &str) -> Message {
        Message {
            reasoning: reasoning.into(),
            ..Message::new(Role::Assistant, content)
        }
    }

    #[test]
    fn generation_prompt_opens_or_closes_thinking() {
        let m = [Message::new(Role::User, "Hi")];
        assert_eq!(
            render(&m, &[], ThinkMode::High),
            "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>"
        );
        assert_eq!(
            render(&m, &[], ThinkMode::None),
            "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"
        );
        assert!(
            render(&m, &[], ThinkMode::Max)
                .starts_with(&format!("{BOS}{THINK_MAX_PREFIX}<｜User｜>"))
        );
    }

    #[test]
    fn old_reasoning_is_dropped_without_tool_context() {
        let m = [
            Message::new(Role::User, "a"),
            assistant("A", "ra"),
            Message::new(Role::User, "b"),
            assistant("B", "rb"),
        ];
        assert_eq!(
            render(&m, &[], ThinkMode::High),
            "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>A<｜end▁of▁sentence｜>\
             <｜User｜>b<｜Assistant｜><think>rb</think>B<｜end▁of▁sentence｜>"
        );
        // A tools block is tool context: every turn keeps its reasoning.
        let with_tools = render(&m, &["{}".into()], ThinkMode::High);
        assert!(with_tools.contains("<think>ra</think>A"), "{with_tools}");
    }

    #[test]
    fn remembered_block_replaces_canonical_calls() {
        let mut m = assistant("x", "");
        m.calls.push(Call {
            name: "f".into(),
            arguments: "{}".into(),
        });
        m.sampled_dsml = Some("SAMPLED".into());
        let out = render(&[Message::new(Role::User, "u"), m], &[], ThinkMode::None);
        assert!(
            out.ends_with("</think>xSAMPLED<｜end▁of▁sentence｜>"),
            "{out}"
        );
    }
}
