//! Building the prompt tokens of a turn.

use anyhow::Context;
use ds4_text::deepseek_v4::{self, Role, ThinkMode};
use ds4_text::{ChatTemplate, PromptFormat, RenderOptions, TextProfile, Tokenizer};
use serde_json::{Value, json};

/// Render `messages` the way the family `family` (a descriptor name) wants
/// them (its chat template, or DeepSeek-V4's prompt in code) with the
/// generation prompt appended, and tokenize the result, control tokens
/// included.
pub fn chat_prompt(
    tokenizer: &Tokenizer,
    family: &str,
    messages: &[Value],
) -> anyhow::Result<Vec<u32>> {
    match TextProfile::for_family(family).prompt {
        PromptFormat::Template => template_prompt(tokenizer, messages),
        PromptFormat::DeepSeekV4 => deepseek_prompt(tokenizer, messages),
    }
}

/// ds4's rendering with thinking on (its default): `<｜Assistant｜><think>`
/// opens the reply.
fn deepseek_prompt(tokenizer: &Tokenizer, messages: &[Value]) -> anyhow::Result<Vec<u32>> {
    let messages: Vec<deepseek_v4::Message> = messages
        .iter()
        .map(|m| {
            let role = match m["role"].as_str() {
                Some("system") | Some("developer") => Role::System,
                Some("assistant") => Role::Assistant,
                Some("tool") => Role::Tool,
                _ => Role::User,
            };
            deepseek_v4::Message::new(role, m["content"].as_str().unwrap_or_default())
        })
        .collect();
    let text = deepseek_v4::render(&messages, &[], ThinkMode::High);
    Ok(tokenizer.encode(&text, true)?)
}

fn template_prompt(tokenizer: &Tokenizer, messages: &[Value]) -> anyhow::Result<Vec<u32>> {
    let source = tokenizer
        .chat_template()
        .context("this model has no chat template; use --raw to send the prompt as plain text")?;
    let template = ChatTemplate::new(
        source,
        tokenizer.bos_token().map_or("", |t| t.text.as_str()),
        tokenizer.eos_token().map_or("", |t| t.text.as_str()),
    )?;
    let text = template.render(
        messages,
        &RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        },
    )?;
    // The template writes BOS itself where the model wants it; like
    // transformers' apply_chat_template, no special tokens are added here.
    Ok(tokenizer.encode(&text, true)?)
}

/// Tokenize a raw prompt as transformers' `encode(text)` does (control-token
/// text parsed, BOS added when the tokenizer asks for it).
pub fn raw_prompt(tokenizer: &Tokenizer, text: &str) -> anyhow::Result<Vec<u32>> {
    Ok(tokenizer.encode_prompt(text)?)
}

pub fn message(role: &str, content: &str) -> Value {
    json!({ "role": role, "content": content })
}
