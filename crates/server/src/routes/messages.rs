//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic).

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use crate::constraints;
use crate::error::{ApiError, Flavor};
use crate::extract::ApiJson;
use crate::images::Images;
use crate::output::Item;
use crate::params::{self, SamplingFields};
use crate::prompt::{self, ChatTurn};
use crate::request::{Common, Finished, Head, Turn, Writer};
use crate::sse::SseSender;
use crate::state::SharedState;
use crate::summary::TurnSummary;
use crate::thinking;
use crate::tools::{FunctionTool, ToolShape};
use crate::types::anthropic::*;
use ds4_engine::decode::{CallerStop, FinishReason};
use ds4_text::PromptFormat;
use ds4_text::deepseek_v4::dsml::escape_tool_result;

#[utoipa::path(
    post,
    path = "/v1/messages",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "A message, or an SSE stream (`message_start` … `message_stop`) when `stream` is true", body = MessageResponse),
        (status = 400, description = "Invalid request (Anthropic error shape)"),
    )
)]
pub async fn messages(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Result<Response, ApiError> {
    state.metrics.request("messages");
    run(state, req)
        .await
        .map_err(|e| e.with_flavor(Flavor::Anthropic))
}

#[utoipa::path(
    post,
    path = "/v1/messages/count_tokens",
    request_body = MessagesRequest,
    responses((status = 200, body = TokenCount))
)]
pub async fn count_tokens(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<MessagesRequest>,
) -> Result<Json<TokenCount>, ApiError> {
    state.metrics.request("count_tokens");
    let count = async || -> Result<TokenCount, ApiError> {
        // The same fields are judged as `/v1/messages` judges them (the two
        // share one request schema); only `max_tokens` is optional here.
        common(&req, req.max_tokens).check(&state)?;
        let mut warnings = Vec::new();
        let (turn, _) = conversation(&state, &req, None, &mut warnings)?;
        let rendered = prompt::render(&state, turn)?;
        // Images count as the tokens they expand to.
        let input_tokens =
            crate::vision::count(state.vision.as_ref(), rendered.tokens, rendered.images).await?;
        Ok(TokenCount { input_tokens })
    };
    count()
        .await
        .map(Json)
        .map_err(|e| e.with_flavor(Flavor::Anthropic))
}

async fn run(state: SharedState, req: MessagesRequest) -> Result<Response, ApiError> {
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: field required",
        ));
    };
    let mut checked = common(&req, Some(max_tokens)).check(&state)?;
    let g = &mut checked.generation;
    let (turn, budget) = conversation(&state, &req, Some(max_tokens), &mut g.warnings)?;
    g.reasoning_budget = budget;
    let choice = constraints::ToolChoice::anthropic(req.tool_choice.as_ref())?;
    let requested = constraints::forced_call(&state, &choice, &turn.tools)?;
    let output = checked.render(&state, "messages", turn)?;
    checked.generation.constraint = constraints::compile(&state, requested, output)?;
    checked
        .generation
        .expand_images(state.vision.as_ref())
        .await?;
    let turn = Turn::start(&state, checked, output, "msg_").await?;
    turn.respond(&state, BlockWriter::new, complete).await
}

/// The fields every API shares, as this request names them.
fn common(req: &MessagesRequest, max_tokens: Option<u64>) -> Common {
    Common {
        model: req.model.clone(),
        sampling: SamplingFields {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            min_p: req.min_p,
            ..SamplingFields::default()
        },
        max_temperature: 1.0,
        seed: req.seed,
        max_tokens: ("max_tokens", max_tokens),
        stop: (
            "stop_sequences",
            req.stop_sequences.clone().map(params::StopField::Many),
        ),
        n: None,
        mtp_depth: req.mtp_depth,
        stream: req.stream,
    }
}

fn complete(head: Head, done: Finished) -> MessageResponse {
    let Finished { output: c, summary } = done;
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(OutputBlock::Thinking {
            thinking: c.reasoning,
            signature: String::new(),
        });
    }
    if !c.text.is_empty() || c.tool_calls.is_empty() {
        content.push(OutputBlock::Text { text: c.text });
    }
    for call in &c.tool_calls {
        content.push(OutputBlock::ToolUse {
            id: call.id.clone(),
            name: call.name.clone(),
            input: tool_input(&call.arguments),
        });
    }
    MessageResponse {
        id: head.id,
        kind: "message",
        role: "assistant",
        model: head.model,
        content,
        stop_reason: Some(stop_reason(&summary, !c.tool_calls.is_empty())),
        stop_sequence: summary.stop_sequence.clone(),
        usage: AnthropicUsage::of(&summary, Some(head.seed)),
        warnings: head.warnings,
    }
}

fn tool_choice_none(req: &MessagesRequest) -> bool {
    req.tool_choice
        .as_ref()
        .is_some_and(|c| c["type"] == "none")
}

/// The conversation in the chat-template shape. Also checks `thinking`
/// and returns the reasoning budget to enforce (`max_tokens` is `None` for
/// count_tokens, which has no output).
pub(crate) fn conversation(
    state: &SharedState,
    req: &MessagesRequest,
    max_tokens: Option<u64>,
    warnings: &mut Vec<String>,
) -> Result<(ChatTurn, Option<usize>), ApiError> {
    // DeepSeek-V4 reads Anthropic content as ds4 does: tool results stay
    // inside their user message, system blocks are joined by lines.
    let ds4 = state.profile.prompt == PromptFormat::DeepSeekV4;
    let mut messages = Vec::new();
    match &req.system {
        None => {}
        Some(SystemPrompt::Text(t)) if ds4 => {
            messages.push(json!({"role": "system", "content": ds4_system(&[t.as_str()])}))
        }
        Some(SystemPrompt::Text(t)) => messages.push(json!({"role": "system", "content": t})),
        Some(SystemPrompt::Blocks(blocks)) => {
            // Claude Code's first block is client-private metadata
            // (`x-anthropic-billing-header: …`, which changes between
            // versions): not part of the prompt, as in ds4's reading.
            let parts: Vec<&str> = blocks
                .iter()
                .filter_map(|b| b.text.as_deref())
                .filter(|t| !t.starts_with("x-anthropic-"))
                .collect();
            let text = if ds4 {
                ds4_system(&parts)
            } else {
                parts.concat()
            };
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let mut images = Images::new(state.config.images, state.serving.accepts_images);
    for (i, m) in req.messages.iter().enumerate() {
        convert(i, m, ds4, &mut messages, &mut images)?;
    }
    let tools = tools(req, warnings)?;
    // `adaptive` (Claude Code) lets the model decide: here it is reasoning
    // on without a budget; `enabled` needs its budget, as Anthropic's does.
    let (on, needs_budget) = match req.thinking.as_ref().map(|t| t.kind.as_str()) {
        None => (None, false),
        Some("enabled") => (Some(true), true),
        Some("adaptive") => (Some(true), false),
        Some("disabled") => (Some(false), false),
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!(
                    "thinking.type = {other:?}: expected \"enabled\", \"adaptive\" or \"disabled\""
                ),
            ));
        }
    };
    let asked_budget = req.thinking.as_ref().and_then(|t| t.budget_tokens);
    if let Some(max) = max_tokens
        && needs_budget
        && asked_budget.is_none()
    {
        params::thinking_budget(None, true, max)?;
    }
    let controls = thinking::Controls {
        switch: on.map(|on| ("thinking", on)),
        extension_effort: req
            .output_config
            .as_ref()
            .and_then(|c| c.effort.clone())
            .map(|e| ("output_config.effort", e)),
        model: req.model.clone(),
        ..thinking::Controls::default()
    };
    let thinking = thinking::resolve(state, &controls, warnings)?;
    let enable_thinking = thinking.requested();
    // A budget is checked only where it applies: a family that does not
    // reason here (no reasoning markers, or reasoning off) reports it as not
    // applied instead of refusing the request (Claude Code sends budgets
    // below Anthropic's minimum when its output limit is small).
    let budget = match (max_tokens, asked_budget) {
        (Some(max), Some(b)) if enable_thinking == Some(true) && on == Some(true) => {
            params::thinking_budget(Some(b), true, max)?
        }
        (Some(_), Some(b)) if on == Some(true) => {
            let why = if state.profile.reasoning.is_none() {
                format!(
                    "the {} family has no reasoning markers",
                    state.profile.family
                )
            } else {
                "this request does not reason".to_string()
            };
            warnings.push(format!(
                "thinking.budget_tokens = {b} was not applied: {why}"
            ));
            None
        }
        _ => None,
    };
    let turn = ChatTurn {
        messages,
        tools,
        thinking,
        images: images.list,
    };
    Ok((turn, budget))
}

fn tools(req: &MessagesRequest, warnings: &mut Vec<String>) -> Result<Vec<FunctionTool>, ApiError> {
    // `any` / `tool` force a call (the route's constraint); the tools are
    // offered either way.
    constraints::ToolChoice::anthropic(req.tool_choice.as_ref())?;
    if tool_choice_none(req) {
        return Ok(Vec::new());
    }
    let tools = req.tools.iter().flatten().enumerate();
    Ok(tools
        .filter(|(i, t)| client_tool(*i, t, warnings))
        .map(|(_, t)| {
            FunctionTool::new(
                ToolShape::Anthropic,
                t.name.clone(),
                t.description.clone(),
                t.input_schema.clone(),
            )
        })
        .collect())
}

/// Whether a declared tool is one the model can call (a client tool:
/// no `type`, or `custom`). Anthropic's server tools (`web_search_…`,
/// `code_execution_…`) run on Anthropic's side, which this server is not:
/// they are left out and reported, never silently dropped.
fn client_tool(i: usize, t: &AnthropicTool, warnings: &mut Vec<String>) -> bool {
    match t.kind.as_deref() {
        None | Some("custom") => true,
        Some(kind) => {
            warnings.push(crate::error::tool_not_offered(
                &format!("tools[{i}]"),
                kind,
                &t.name,
            ));
            false
        }
    }
}

/// ds4's Anthropic system text (`append_anthropic_system_part`): parts
/// joined by a newline unless the text so far ends with one; parts starting
/// with `x-anthropic-` (client-private) skipped.
fn ds4_system(parts: &[&str]) -> String {
    let mut out = String::new();
    for p in parts
        .iter()
        .filter(|p| !p.is_empty() && !p.starts_with("x-anthropic-"))
    {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(p);
    }
    out
}

/// A `tool_result` block's content as text: a string, or its parts' text
/// joined (with `bare_strings`, string parts too, as ds4's `json_content`).
fn tool_result_text(content: &Option<Value>, bare_strings: bool) -> String {
    match content {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p["text"].as_str().or(p.as_str().filter(|_| bare_strings)))
            .collect::<Vec<_>>()
            .join(""),
        Some(other) => other.to_string(),
    }
}

/// A `tool_result` whose content carries an image (not supported: it would
/// be lost from the text).
fn has_image(content: &Option<Value>) -> bool {
    content
        .as_ref()
        .and_then(Value::as_array)
        .is_some_and(|parts| {
            parts
                .iter()
                .any(|p| matches!(p["type"].as_str(), Some("image" | "document")))
        })
}

/// One Anthropic message as template messages: tool uses become the
/// assistant's `tool_calls`; tool results become `tool` messages, or with
/// `inline_results` (DeepSeek-V4, as ds4's `parse_anthropic_content_block`)
/// `<tool_result>…</tool_result>` text in the user message, in block order.
fn convert(
    i: usize,
    m: &InputMessage,
    inline_results: bool,
    out: &mut Vec<Value>,
    images: &mut Images,
) -> Result<(), ApiError> {
    let role = match m.role {
        AnthropicRole::User => "user",
        AnthropicRole::Assistant => "assistant",
        // Rendered in place, as a chat request's system message is: the
        // template (or ds4's prompt) decides where it may stand.
        AnthropicRole::System => "system",
    };
    let blocks = match &m.content {
        InputContent::Text(t) => {
            out.push(json!({"role": role, "content": t}));
            return Ok(());
        }
        InputContent::Blocks(b) => b,
    };
    let mut text = String::new();
    // Text and image parts in order, for a message with images.
    let mut items = Vec::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let field = format!("messages[{i}].content[{j}]");
        match b.kind.as_str() {
            "text" => {
                let t = b.text.as_deref().unwrap_or_default();
                text.push_str(t);
                items.push(json!({"type": "text", "text": t}));
            }
            "image" => {
                images.push_anthropic(&field, b.source.as_ref())?;
                items.push(json!({"type": "image"}));
            }
            "thinking" => reasoning.push_str(b.thinking.as_deref().unwrap_or_default()),
            "redacted_thinking" => {}
            "tool_use" => calls.push(json!({
                "id": b.id.clone().unwrap_or_default(),
                "type": "function",
                "function": {
                    "name": b.name.clone().unwrap_or_default(),
                    "arguments": b.input.clone().unwrap_or_else(|| json!({})),
                },
            })),
            "document" => return Err(ApiError::image_unsupported(field)),
            "tool_result" if has_image(&b.content) => {
                return Err(ApiError::image_unsupported(format!("{field}.content")));
            }
            "tool_result" if inline_results => {
                text.push_str("<tool_result>");
                text.push_str(&escape_tool_result(&tool_result_text(&b.content, true)));
                text.push_str("</tool_result>");
            }
            "tool_result" => {
                let content = tool_result_text(&b.content, false);
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.tool_use_id.clone().unwrap_or_default(),
                    "content": content,
                }));
            }
            other => {
                return Err(ApiError::invalid(
                    field.clone(),
                    format!("{field}: content blocks of type {other:?} are not supported"),
                ));
            }
        }
    }
    let has_image = items.iter().any(|p| p["type"] == "image");
    if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() || has_image {
        let content = match has_image {
            true => Value::Array(items),
            false => Value::String(text),
        };
        let mut msg = json!({"role": role, "content": content});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        if !reasoning.is_empty() {
            msg["reasoning_content"] = Value::String(reasoning);
        }
        out.push(msg);
    }
    Ok(())
}

/// Tool input as the model wrote it: a JSON object, or (when the model
/// wrote something that is not JSON) the raw text, so nothing is lost.
fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
}

fn stop_reason(s: &TurnSummary, tool_use: bool) -> &'static str {
    match s.finish_reason {
        // A call cut by the token limit may be incomplete: say so.
        FinishReason::MaxTokens | FinishReason::ContextFull => "max_tokens",
        _ if tool_use => "tool_use",
        FinishReason::Caller(CallerStop::StopString) => "stop_sequence",
        FinishReason::StopToken | FinishReason::Caller(CallerStop::Cancelled) => "end_turn",
        // The request's grammar admits no token here (an extension value).
        FinishReason::NoAllowedToken => "no_allowed_token",
    }
}

/// Which content block is open in the stream.
#[derive(PartialEq)]
enum Open {
    None,
    Thinking,
    Text,
    Tool,
}

/// Anthropic's stream: `message_start`, content blocks opened, filled and
/// closed as the output changes kind, then `message_delta` and
/// `message_stop`.
struct BlockWriter {
    tx: SseSender,
    head: Head,
    open: Open,
    index: usize,
    tool_use: bool,
}

impl BlockWriter {
    fn new(tx: SseSender, head: Head) -> Self {
        Self {
            tx,
            head,
            open: Open::None,
            index: 0,
            tool_use: false,
        }
    }

    /// Make sure a block of `kind` is open (closing another); false: client gone.
    async fn ensure(&mut self, kind: Open, start: Value) -> bool {
        if self.open == kind && kind != Open::Tool {
            return true;
        }
        if !self.close_block().await {
            return false;
        }
        self.open = kind;
        self.tx
            .json(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": self.index, "content_block": start}),
            )
            .await
    }

    async fn delta(&self, delta: Value) -> bool {
        self.tx
            .json(
                Some("content_block_delta"),
                &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
            )
            .await
    }

    async fn close_block(&mut self) -> bool {
        if self.open == Open::None {
            return true;
        }
        if self.open == Open::Thinking
            && !self
                .delta(json!({"type": "signature_delta", "signature": ""}))
                .await
        {
            return false;
        }
        self.open = Open::None;
        let index = self.index;
        self.index += 1;
        self.tx
            .json(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": index}),
            )
            .await
    }
}

impl Writer for BlockWriter {
    async fn open(&mut self) -> bool {
        let h = &self.head;
        let start = json!({
            "type": "message_start",
            "message": {
                "id": h.id, "type": "message", "role": "assistant", "model": h.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": h.prompt_tokens, "output_tokens": 0},
                "warnings": h.warnings,
            }
        });
        self.tx.json(Some("message_start"), &start).await
            && self.tx.json(Some("ping"), &json!({"type": "ping"})).await
    }

    async fn item(&mut self, item: Item) -> bool {
        match item {
            Item::Reasoning(r) => {
                self.ensure(Open::Thinking, json!({"type": "thinking", "thinking": ""}))
                    .await
                    && self
                        .delta(json!({"type": "thinking_delta", "thinking": r}))
                        .await
            }
            Item::Text(t) => {
                self.ensure(Open::Text, json!({"type": "text", "text": ""}))
                    .await
                    && self.delta(json!({"type": "text_delta", "text": t})).await
            }
            Item::ToolStart { id, name, .. } => {
                self.tool_use = true;
                self.ensure(
                    Open::Tool,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                )
                .await
            }
            Item::ToolArgs { delta, .. } => {
                self.delta(json!({"type": "input_json_delta", "partial_json": delta}))
                    .await
            }
            Item::ToolEnd { .. } => self.close_block().await,
            Item::Started | Item::Token(_) | Item::PromptLogprobs(_) => true,
            Item::Finished(summary) => {
                let reason = stop_reason(&summary, self.tool_use);
                let delta = json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": summary.stop_sequence},
                    "usage": AnthropicUsage::of(&summary, Some(self.head.seed)),
                });
                self.close_block().await
                    && self.tx.json(Some("message_delta"), &delta).await
                    && self
                        .tx
                        .json(Some("message_stop"), &json!({"type": "message_stop"}))
                        .await
            }
            Item::Failed(message) => {
                let _ = self
                    .tx
                    .error(&ApiError::internal(message).with_flavor(Flavor::Anthropic))
                    .await;
                false
            }
        }
    }

    async fn close(self) {}
}

#[cfg(test)]
mod tests {
    //! Thinking and tool_use blocks in each family's format, from scripted
    //! model output through the real block writer.

    use super::*;
    use crate::request::scripted;

    /// The event names and, per content block, its start and the
    /// concatenated deltas.
    async fn blocks(family: &str, output: &str) -> (Vec<String>, Vec<(Value, String)>, Value) {
        let events = scripted::sse(scripted::stream(family, true, false, output), |tx| {
            BlockWriter::new(tx, scripted::head())
        })
        .await;
        let names: Vec<String> = events.iter().map(|e| e.0.clone().unwrap()).collect();
        let mut blocks: Vec<(Value, String)> = Vec::new();
        let mut delta = Value::Null;
        for (name, data) in &events {
            match name.as_deref() {
                Some("content_block_start") => {
                    assert_eq!(data["index"], blocks.len());
                    blocks.push((data["content_block"].clone(), String::new()));
                }
                Some("content_block_delta") => {
                    let d = &data["delta"];
                    let piece = ["thinking", "text", "partial_json"]
                        .iter()
                        .find_map(|k| d[*k].as_str())
                        .unwrap_or("");
                    let i = data["index"].as_u64().unwrap() as usize;
                    blocks[i].1 += piece;
                }
                Some("message_delta") => delta = data.clone(),
                _ => {}
            }
        }
        (names, blocks, delta)
    }

    #[tokio::test]
    async fn xml_thinking_text_and_tool_use_blocks() {
        let out = "<think>Weather needed.</think>\n\nLet me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
        let (names, blocks, delta) = blocks("qwen4_exp", out).await;
        assert_eq!(names[..2], ["message_start", "ping"]);
        assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[0].0["type"], "thinking");
        assert_eq!(blocks[0].1, "Weather needed.");
        assert_eq!(blocks[1].0["type"], "text");
        assert_eq!(blocks[1].1, "Let me check.");
        assert_eq!(blocks[2].0["type"], "tool_use");
        assert_eq!(blocks[2].0["name"], "get_weather");
        assert!(blocks[2].0["id"].as_str().unwrap().starts_with("call_"));
        let input: Value = serde_json::from_str(&blocks[2].1).unwrap();
        assert_eq!(input, json!({"city": "Oslo"}));
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["usage"]["seed"], 7);
        // Every block that starts stops.
        let starts = names.iter().filter(|n| *n == "content_block_start").count();
        let stops = names.iter().filter(|n| *n == "content_block_stop").count();
        assert_eq!(starts, stops);
    }

    #[tokio::test]
    async fn llama_json_tool_use_block() {
        let out = "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}";
        let (_, blocks, delta) = blocks("llama", out).await;
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0].0["type"], "tool_use");
        assert_eq!(blocks[0].0["name"], "add");
        let input: Value = serde_json::from_str(&blocks[0].1).unwrap();
        assert_eq!(input, json!({"a": 1, "b": 2}));
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    }

    /// DeepSeek-V4: a DSML call becomes a tool_use block whose input
    /// streams as `input_json_delta` fragments.
    #[tokio::test]
    async fn dsml_tool_use_blocks() {
        let out = "<think>Two calls.</think>Listing.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; echo \"é\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/tmp/a</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let (_, blocks, delta) = blocks("deepseek_v4", out).await;
        let kinds: Vec<&str> = blocks
            .iter()
            .map(|b| b.0["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"]);
        assert_eq!(blocks[1].1, "Listing.");
        assert_eq!(blocks[2].0["name"], "bash");
        let input: Value = serde_json::from_str(&blocks[2].1).unwrap();
        assert_eq!(input, json!({"command": "ls && echo \"é\"", "timeout": 10}));
        let input: Value = serde_json::from_str(&blocks[3].1).unwrap();
        assert_eq!(input, json!({"path": "/tmp/a"}));
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    }

    /// GLM-5: its calls become tool_use blocks with streamed input.
    #[tokio::test]
    async fn glm_tool_use_blocks() {
        let out = "<think>Two calls.</think>Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>/tmp/a</arg_value>\n</tool_call>";
        let (_, blocks, delta) = blocks("glm5_next", out).await;
        let kinds: Vec<&str> = blocks
            .iter()
            .map(|b| b.0["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"]);
        assert_eq!(blocks[2].0["name"], "get_weather");
        let input: Value = serde_json::from_str(&blocks[2].1).unwrap();
        assert_eq!(input, json!({"city": "Oslo", "days": 3}));
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    }
}
