//! Chat prompts: API messages (already converted to the chat-template shape
//! `{"role", "content", "tool_calls", ...}`) rendered the family's way —
//! with the model's template, or in code for `deepseek_v4`
//! ([`crate::deepseek_prompt`]) — tools included, and tokenized.

use ds4_text::{PromptFormat, RenderOptions, ToolCallFormat};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;
use crate::thinking::Thinking;
use crate::tools::FunctionTool;

/// A conversation to render.
#[derive(Debug, Default)]
pub struct ChatTurn {
    pub messages: Vec<Value>,
    pub tools: Vec<FunctionTool>,
    /// What the request asked about reasoning, as the family reads it
    /// ([`crate::thinking::resolve`]).
    pub thinking: Thinking,
    /// The conversation's images in order (each message keeps an
    /// `{"type": "image"}` part where one stood; the template writes its
    /// tokens there). Empty unless the model reads images.
    pub images: Vec<crate::images::ImageInput>,
}

pub struct RenderedPrompt {
    pub tokens: Vec<u32>,
    /// The template opened the reasoning block itself (the reply starts
    /// inside it).
    pub reasoning_open: bool,
    /// The images the prompt's image placeholders stand for, in order.
    pub images: Vec<crate::images::ImageInput>,
}

pub fn render(state: &AppState, turn: ChatTurn) -> Result<RenderedPrompt, ApiError> {
    match (state.profile.prompt, turn.thinking) {
        (PromptFormat::DeepSeekV4, Thinking::DeepSeekV4(mode)) => {
            let memory = state
                .serving
                .exact_tool_replay
                .then_some(&state.tool_memory);
            let text = crate::deepseek_prompt::render(&turn.messages, &turn.tools, mode, memory);
            Ok(RenderedPrompt {
                tokens: state.count_tokens(&text)?,
                reasoning_open: mode.enabled(),
                images: turn.images,
            })
        }
        (PromptFormat::DeepSeekV4, Thinking::Template(_)) => Err(ApiError::internal(
            "the deepseek_v4 prompt needs its thinking mode (a route did not resolve it)",
        )),
        (PromptFormat::Template, _) => render_template(state, turn),
    }
}

/// A template family's prompt.
fn render_template(state: &AppState, mut turn: ChatTurn) -> Result<RenderedPrompt, ApiError> {
    let template = state.template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            "messages",
            "this model has no chat template; use /v1/completions with a raw prompt",
        )
    })?;
    let format = state.profile.tool_calls;
    if !turn.tools.is_empty() && format.is_none() {
        return Err(ApiError::invalid(
            "tools",
            format!(
                "tools are not supported for the {} family (no known tool-call format)",
                state.descriptor.name
            ),
        ));
    }
    for m in &mut turn.messages {
        normalise(m, state.template_has_tools, format);
    }
    let mut opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    if !turn.tools.is_empty() {
        if state.template_has_tools {
            opts.tools = Some(turn.tools.iter().map(FunctionTool::to_template).collect());
        } else if let Some(format) = format {
            describe_tools(&mut turn.messages, &turn.tools, format);
        }
    }
    if let Some(on) = turn.thinking.requested() {
        opts.extra.insert("enable_thinking".into(), Value::Bool(on));
    }
    let text = template.render(&turn.messages, &opts).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the chat template refused the conversation: {e}"),
        )
    })?;
    let reasoning_open = state
        .profile
        .reasoning
        .is_some_and(|m| text.trim_end().ends_with(m.open));
    // The template writes BOS and control tokens as text; parse them.
    let tokens = state.count_tokens(&text)?;
    Ok(RenderedPrompt {
        tokens,
        reasoning_open,
        images: turn.images,
    })
}

/// Make a message safe for templates written for transformers: content is
/// always a string, tool-call arguments are objects. A template that cannot
/// render tool calls sees them written in the family's format instead, so
/// the model still sees what it called.
fn normalise(m: &mut Value, template_has_tools: bool, format: Option<ToolCallFormat>) {
    let Some(obj) = m.as_object_mut() else { return };
    if obj.get("content").is_none_or(Value::is_null) {
        obj.insert("content".into(), Value::String(String::new()));
    }
    let Some(calls) = obj.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return;
    };
    for call in calls.iter_mut() {
        if let Some(f) = call.get_mut("function")
            && let Some(args) = f.get("arguments").and_then(Value::as_str)
            && let Ok(parsed) = serde_json::from_str::<Value>(args)
        {
            f["arguments"] = parsed;
        }
    }
    if template_has_tools {
        return;
    }
    let written: Vec<String> = calls
        .iter()
        .map(|c| write_call(&c["function"]["name"], &c["function"]["arguments"], format))
        .collect();
    obj.remove("tool_calls");
    if let Some(Value::String(content)) = obj.get_mut("content") {
        for w in written {
            if !content.is_empty() {
                content.push('\n');
            }
            content.push_str(&w);
        }
    }
}

fn write_call(name: &Value, args: &Value, format: Option<ToolCallFormat>) -> String {
    match format {
        // DSML families render in code and never reach a template.
        Some(ToolCallFormat::Hermes | ToolCallFormat::Dsml) | None => {
            format!(
                "<tool_call>\n{}\n</tool_call>",
                json!({"name": name, "arguments": args})
            )
        }
        Some(ToolCallFormat::Llama3Json) => json!({"name": name, "parameters": args}).to_string(),
        // GLM's template: a string value raw, anything else as JSON.
        Some(ToolCallFormat::Glm) => {
            let mut out = format!("<tool_call>{}\n", name.as_str().unwrap_or_default());
            if let Some(obj) = args.as_object() {
                for (k, v) in obj {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    out.push_str(&format!(
                        "<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"
                    ));
                }
            }
            out.push_str("</tool_call>");
            out
        }
        // Qwen3.5's template: a string value raw, anything else as JSON.
        Some(ToolCallFormat::QwenXml) => {
            let mut out = format!(
                "<tool_call>\n<function={}>\n",
                name.as_str().unwrap_or_default()
            );
            if let Some(obj) = args.as_object() {
                for (k, v) in obj {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    out.push_str(&format!("<parameter={k}>\n{v}\n</parameter>\n"));
                }
            }
            out.push_str("</function>\n</tool_call>");
            out
        }
    }
}

/// For templates without tool support: describe the tools and the format in
/// the system message (the wording of the llama 3.1 and Hermes templates).
fn describe_tools(messages: &mut Vec<Value>, tools: &[FunctionTool], format: ToolCallFormat) {
    let list: Vec<String> = tools.iter().map(|t| t.to_template().to_string()).collect();
    let text = match format {
        ToolCallFormat::Llama3Json => format!(
            "You have access to the following functions. To call a function, respond with only \
             a JSON object of the form {{\"name\": function name, \"parameters\": dictionary of \
             argument name and its value}}. Do not use variables.\n\n{}",
            list.join("\n\n")
        ),
        ToolCallFormat::Hermes | ToolCallFormat::Dsml => format!(
            "You may call one or more functions to assist with the user query.\n\nYou are \
             provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n\
             </tools>\n\nFor each function call, return a json object with function name and \
             arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": \
             <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
            list.join("\n")
        ),
        // The wording of GLM-4.5's chat template.
        ToolCallFormat::Glm => format!(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
             You are provided with function signatures within <tools></tools> XML tags:\n\
             <tools>\n{}\n</tools>\n\nFor each function call, output the function name and \
             arguments within the following XML format:\n<tool_call>{{function-name}}\n\
             <arg_key>{{arg-key-1}}</arg_key>\n<arg_value>{{arg-value-1}}</arg_value>\n\
             <arg_key>{{arg-key-2}}</arg_key>\n<arg_value>{{arg-value-2}}</arg_value>\n...\n\
             </tool_call>",
            list.join("\n")
        ),
        // The wording of Qwen3.5's chat template.
        ToolCallFormat::QwenXml => format!(
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n{}\n</tools>\n\n\
             If you choose to call a function ONLY reply in the following format with NO \
             suffix:\n\n<tool_call>\n<function=example_function_name>\n\
             <parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>",
            list.join("\n")
        ),
    };
    match messages.first_mut() {
        Some(first) if first["role"] == "system" => {
            let content = first["content"].as_str().unwrap_or_default();
            first["content"] = Value::String(format!("{content}\n\n{text}"));
        }
        _ => messages.insert(0, json!({"role": "system", "content": text})),
    }
}
