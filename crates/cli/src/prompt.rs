//! Building the prompt tokens of a turn.

use anyhow::Context;
use ds4_text::{ChatTemplate, RenderOptions, Tokenizer};
use serde_json::{Value, json};

/// Render `messages` with the model's chat template (generation prompt
/// appended) and tokenize the result, control tokens included.
pub fn chat_prompt(tokenizer: &Tokenizer, messages: &[Value]) -> anyhow::Result<Vec<u32>> {
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
