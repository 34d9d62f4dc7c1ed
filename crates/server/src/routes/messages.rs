//! `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic).

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::admission::{Generation, admit};
use crate::error::{ApiError, Flavor};
use crate::extract::ApiJson;
use crate::ids::new_id;
use crate::output::{Collected, Item, OutputParser, TurnStream};
use crate::params::{self, SamplingFields};
use crate::prompt::{self, ChatTurn, FunctionTool, RenderedPrompt};
use crate::sse::{self, SseSender};
use crate::state::SharedState;
use crate::types::anthropic::*;
use crate::worker::TurnSummary;
use ds4_engine::decode::{CallerStop, FinishReason};

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
    let count = || -> Result<TokenCount, ApiError> {
        state.check_model(req.model.as_deref())?;
        let mut warnings = Vec::new();
        let rendered = render(&state, &req, &mut warnings)?;
        Ok(TokenCount {
            input_tokens: rendered.tokens.len(),
        })
    };
    count()
        .map(Json)
        .map_err(|e| e.with_flavor(Flavor::Anthropic))
}

async fn run(state: SharedState, req: MessagesRequest) -> Result<Response, ApiError> {
    state.check_model(req.model.as_deref())?;
    let mtp_depth = params::mtp_depth(state.mtp, req.mtp_depth)?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: field required",
        ));
    };
    let max_tokens = params::max_tokens("max_tokens", Some(max_tokens))?;
    let sampling = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        ..SamplingFields::default()
    }
    .validate()?;
    let mut warnings = Vec::new();
    let rendered = render(&state, &req, &mut warnings)?;
    let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_empty()) && !tool_choice_none(&req);
    let stops = params::stops(
        "stop_sequences",
        req.stop_sequences.map(params::StopField::Many),
    )?;
    let admitted = admit(
        &state,
        Generation {
            prompt: rendered.tokens,
            prompt_field: "messages",
            sampling,
            seed: req.seed,
            max_tokens,
            stops,
            logprobs: None,
            prompt_logprobs: None,
            mtp_depth,
            warnings,
        },
    )?;
    let parser = OutputParser::new(&state.profile, has_tools, rendered.reasoning_open);
    let turn = TurnStream::new(admitted.events, parser);
    let head = Head {
        id: new_id("msg_"),
        model: state.config.model_id.clone(),
        seed: admitted.seed,
        prompt_tokens: admitted.prompt_tokens,
        warnings: admitted.warnings,
    };
    if req.stream.unwrap_or(false) {
        return Ok(sse::respond(state.config.keep_alive, move |tx| {
            stream(tx, turn, head)
        }));
    }
    let c = Collected::run(turn).await.map_err(ApiError::internal)?;
    let summary = c
        .summary
        .clone()
        .ok_or_else(|| ApiError::internal("the turn ended without a summary"))?;
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
    Ok(Json(MessageResponse {
        id: head.id,
        kind: "message",
        role: "assistant",
        model: head.model,
        content,
        stop_reason: Some(stop_reason(&summary, !c.tool_calls.is_empty())),
        stop_sequence: summary.stop_sequence.clone(),
        usage: usage(&summary, Some(head.seed)),
        warnings: head.warnings,
    })
    .into_response())
}

fn tool_choice_none(req: &MessagesRequest) -> bool {
    req.tool_choice
        .as_ref()
        .is_some_and(|c| c["type"] == "none")
}

/// The conversation in the chat-template shape, rendered and tokenized.
fn render(
    state: &SharedState,
    req: &MessagesRequest,
    warnings: &mut Vec<String>,
) -> Result<RenderedPrompt, ApiError> {
    let mut messages = Vec::new();
    match &req.system {
        None => {}
        Some(SystemPrompt::Text(t)) => messages.push(json!({"role": "system", "content": t})),
        Some(SystemPrompt::Blocks(blocks)) => {
            let text: String = blocks.iter().filter_map(|b| b.text.clone()).collect();
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    if req.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    for (i, m) in req.messages.iter().enumerate() {
        convert(i, m, &mut messages)?;
    }
    let tools = tools(req)?;
    let on = match req.thinking.as_ref().map(|t| t.kind.as_str()) {
        None => None,
        Some("enabled") => Some(true),
        Some("disabled") => Some(false),
        Some(other) => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!("thinking.type = {other:?}: expected \"enabled\" or \"disabled\""),
            ));
        }
    };
    let enable_thinking = params::reasoning(&state.profile, "thinking", on, warnings);
    if enable_thinking == Some(true)
        && let Some(budget) = req.thinking.as_ref().and_then(|t| t.budget_tokens)
    {
        warnings.push(format!(
            "thinking.budget_tokens = {budget} is not enforced: reasoning ends when the model \
             ends it (max_tokens still applies)"
        ));
    }
    prompt::render(
        state,
        ChatTurn {
            messages,
            tools,
            enable_thinking,
        },
    )
}

fn tools(req: &MessagesRequest) -> Result<Vec<FunctionTool>, ApiError> {
    if let Some(choice) = &req.tool_choice {
        match choice["type"].as_str() {
            Some("auto") | Some("none") => {}
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice {choice} is not supported: only auto and none (forcing a \
                         call needs constrained decoding)"
                    ),
                ));
            }
        }
    }
    if tool_choice_none(req) {
        return Ok(Vec::new());
    }
    Ok(req
        .tools
        .iter()
        .flatten()
        .map(|t| FunctionTool {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t
                .input_schema
                .clone()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        })
        .collect())
}

/// One Anthropic message as template messages: tool results become `tool`
/// messages, tool uses become the assistant's `tool_calls`.
fn convert(i: usize, m: &InputMessage, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = match m.role {
        AnthropicRole::User => "user",
        AnthropicRole::Assistant => "assistant",
    };
    let blocks = match &m.content {
        InputContent::Text(t) => {
            out.push(json!({"role": role, "content": t}));
            return Ok(());
        }
        InputContent::Blocks(b) => b,
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let field = format!("messages[{i}].content[{j}]");
        match b.kind.as_str() {
            "text" => text.push_str(b.text.as_deref().unwrap_or_default()),
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
            "tool_result" => {
                let content = match &b.content {
                    None => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join(""),
                    Some(other) => other.to_string(),
                };
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
    if !text.is_empty() || !calls.is_empty() || !reasoning.is_empty() {
        let mut msg = json!({"role": role, "content": text});
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
        _ if tool_use => "tool_use",
        FinishReason::Caller(CallerStop::StopString) => "stop_sequence",
        FinishReason::MaxTokens | FinishReason::ContextFull => "max_tokens",
        FinishReason::StopToken | FinishReason::Caller(CallerStop::Cancelled) => "end_turn",
    }
}

fn usage(s: &TurnSummary, seed: Option<u64>) -> AnthropicUsage {
    AnthropicUsage {
        input_tokens: s.prompt_tokens,
        output_tokens: s.completion_tokens,
        cache_read_input_tokens: s.cached_tokens,
        cache_creation_input_tokens: 0,
        seed,
    }
}

struct Head {
    id: String,
    model: String,
    seed: u64,
    prompt_tokens: usize,
    warnings: Vec<String>,
}

/// Which content block is open in the stream.
#[derive(PartialEq)]
enum Open {
    None,
    Thinking,
    Text,
    Tool,
}

struct Blocks<'a> {
    tx: &'a SseSender,
    open: Open,
    index: usize,
}

impl Blocks<'_> {
    /// Make sure a block of `kind` is open (closing another); false: client gone.
    async fn ensure(&mut self, kind: Open, start: Value) -> bool {
        if self.open == kind && kind != Open::Tool {
            return true;
        }
        if !self.close().await {
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

    async fn close(&mut self) -> bool {
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

async fn stream(tx: SseSender, mut turn: TurnStream, head: Head) {
    let start = json!({
        "type": "message_start",
        "message": {
            "id": head.id, "type": "message", "role": "assistant", "model": head.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": head.prompt_tokens, "output_tokens": 0},
            "warnings": head.warnings,
        }
    });
    if !tx.json(Some("message_start"), &start).await
        || !tx.json(Some("ping"), &json!({"type": "ping"})).await
    {
        return;
    }
    let mut blocks = Blocks {
        tx: &tx,
        open: Open::None,
        index: 0,
    };
    let mut tool_use = false;
    while let Some(items) = turn.next().await {
        for item in items {
            let ok = match item {
                Item::Reasoning(r) => {
                    blocks
                        .ensure(Open::Thinking, json!({"type": "thinking", "thinking": ""}))
                        .await
                        && blocks
                            .delta(json!({"type": "thinking_delta", "thinking": r}))
                            .await
                }
                Item::Text(t) => {
                    blocks
                        .ensure(Open::Text, json!({"type": "text", "text": ""}))
                        .await
                        && blocks.delta(json!({"type": "text_delta", "text": t})).await
                }
                Item::ToolStart { id, name, .. } => {
                    tool_use = true;
                    blocks
                        .ensure(
                            Open::Tool,
                            json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                        )
                        .await
                }
                Item::ToolArgs { delta, .. } => {
                    blocks
                        .delta(json!({"type": "input_json_delta", "partial_json": delta}))
                        .await
                }
                Item::ToolEnd { .. } => blocks.close().await,
                Item::Started | Item::Token(_) | Item::PromptLogprobs(_) => true,
                Item::Finished(summary) => {
                    let reason = stop_reason(&summary, tool_use);
                    blocks.close().await
                        && tx
                            .json(
                                Some("message_delta"),
                                &json!({
                                    "type": "message_delta",
                                    "delta": {"stop_reason": reason, "stop_sequence": summary.stop_sequence},
                                    "usage": usage(&summary, Some(head.seed)),
                                }),
                            )
                            .await
                        && tx
                            .json(Some("message_stop"), &json!({"type": "message_stop"}))
                            .await
                }
                Item::Failed(message) => {
                    let _ = tx
                        .error(&ApiError::internal(message).with_flavor(Flavor::Anthropic))
                        .await;
                    false
                }
            };
            if !ok {
                return;
            }
        }
    }
}
