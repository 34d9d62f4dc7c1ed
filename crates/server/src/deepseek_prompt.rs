//! The `deepseek_v4` prompt: the API's messages (already in the chat-template
//! shape every route produces) as ds4's conversation, rendered in code
//! ([`ds4_text::deepseek_v4::render`]), tool calls replayed from the tool
//! memory when every id of an assistant message is remembered.

use ds4_text::deepseek_v4::{Call, Message, Role, ThinkMode, render as render_ds4};
use serde_json::Value;

use crate::tool_memory::ToolMemory;
use crate::tools::FunctionTool;

/// A message's role in ds4's classes (`developer` is system, `function` a
/// tool result); ds4 skips any other role.
fn role(name: &str) -> Option<Role> {
    match name {
        "system" | "developer" => Some(Role::System),
        "user" => Some(Role::User),
        "tool" | "function" => Some(Role::Tool),
        "assistant" => Some(Role::Assistant),
        _ => None,
    }
}

/// Message content as text: strings as they are, text parts joined
/// (`json_content`), anything else empty.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.as_str().or_else(|| p["text"].as_str()))
            .collect(),
        _ => String::new(),
    }
}

/// A call's arguments as JSON text: the client's text when it sent text
/// (OpenAI), else its value written compactly in its key order.
fn arguments(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn message(v: &Value, memory: Option<&ToolMemory>) -> Option<Message> {
    let role = role(v["role"].as_str()?)?;
    let mut m = Message::new(role, text(&v["content"]));
    if role != Role::Assistant {
        return Some(m);
    }
    m.reasoning = v["reasoning_content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let calls = v["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    m.calls = calls
        .iter()
        .map(|c| Call {
            name: c["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            arguments: arguments(&c["function"]["arguments"]),
        })
        .collect();
    if let Some(memory) = memory {
        let ids: Vec<&str> = calls
            .iter()
            .map(|c| c["id"].as_str().unwrap_or_default())
            .collect();
        m.sampled_dsml = memory.replay(&ids).map(|b| b.to_string());
    }
    Some(m)
}

/// The prompt text of `messages` with `tools` offered, in `mode`.
pub fn render(
    messages: &[Value],
    tools: &[FunctionTool],
    mode: ThinkMode,
    memory: Option<&ToolMemory>,
) -> String {
    let conversation: Vec<Message> = messages.iter().filter_map(|m| message(m, memory)).collect();
    let schemas: Vec<String> = tools.iter().map(FunctionTool::schema_line).collect();
    render_ds4(&conversation, &schemas, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn calls_are_canonical_unless_every_id_is_remembered() {
        let messages = [
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"y": "z"}}},
            ]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "r"}),
        ];
        let canonical = render(&messages, &[], ThinkMode::None, None);
        assert!(canonical.starts_with(
            "<｜begin▁of▁sentence｜><｜User｜>ab<｜Assistant｜></think>\n\n<｜DSML｜tool_calls>"
        ));
        assert!(
            canonical.contains("name=\"x\" string=\"false\">1<"),
            "{canonical}"
        );
        assert!(
            canonical.contains("name=\"y\" string=\"true\">z<"),
            "{canonical}"
        );
        let memory = ToolMemory::default();
        memory.remember(&["c1".into()], "SAMPLED");
        assert_eq!(
            render(&messages, &[], ThinkMode::None, Some(&memory)),
            canonical
        );
        memory.remember(&["c1".into(), "c2".into()], "SAMPLED");
        let replayed = render(&messages, &[], ThinkMode::None, Some(&memory));
        assert!(
            replayed.contains("</think>SAMPLED<｜end▁of▁sentence｜>"),
            "{replayed}"
        );
    }
}
