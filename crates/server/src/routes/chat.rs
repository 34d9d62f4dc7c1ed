//! `POST /v1/chat/completions`.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::admission::{Generation, admit};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::ids::{new_id, unix_now};
use crate::output::{Collected, Item, OutputParser, TurnStream};
use crate::params::{self, SamplingFields};
use crate::prompt::{self, ChatTurn, FunctionTool};
use crate::sse::{self, SseSender};
use crate::state::SharedState;
use crate::types::chat::*;
use crate::types::common::{LogprobEntry, Usage, finish_reason};

/// What a validated request asks for beyond the generation itself.
struct Plan {
    generation: Generation,
    stream: bool,
    include_usage: bool,
    tools: bool,
    reasoning_open: bool,
}

#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "A completion, or an SSE stream of `ChatCompletionChunk`s when `stream` is true", body = ChatCompletion),
        (status = 400, description = "Invalid request (the message names the field)"),
        (status = 404, description = "Unknown model"),
        (status = 503, description = "Queue full; see Retry-After"),
    )
)]
pub async fn chat_completions(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    state.metrics.request("chat_completions");
    let plan = plan(&state, req)?;
    let admitted = admit(&state, plan.generation)?;
    let parser = OutputParser::new(&state.profile, plan.tools, plan.reasoning_open);
    let turn = TurnStream::new(admitted.events, parser);
    let head = Head {
        id: new_id("chatcmpl-"),
        created: unix_now(),
        model: state.config.model_id.clone(),
        seed: admitted.seed,
        warnings: admitted.warnings,
    };
    if plan.stream {
        let tokenizer = state.tokenizer.clone();
        let include_usage = plan.include_usage;
        return Ok(sse::respond(state.config.keep_alive, move |tx| {
            stream(tx, turn, head, include_usage, tokenizer)
        }));
    }
    let c = Collected::run(turn).await.map_err(ApiError::internal)?;
    Ok(Json(complete(&state, head, c)?).into_response())
}

fn plan(state: &SharedState, req: ChatCompletionRequest) -> Result<Plan, ApiError> {
    state.check_model(req.model.as_deref())?;
    params::n(req.n)?;
    let mtp_depth = params::mtp_depth(state.mtp, req.mtp_depth)?;
    let max_tokens = match req.max_completion_tokens {
        Some(m) => params::max_tokens("max_completion_tokens", Some(m))?,
        None => params::max_tokens("max_tokens", req.max_tokens)?,
    };
    let sampling = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
    }
    .validate()?;
    let top = params::top_logprobs("top_logprobs", req.top_logprobs)?;
    let logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, _) => Some(top),
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        (false, None) => None,
    };
    let mut warnings = Vec::new();
    let effort = params::effort("reasoning_effort", req.reasoning_effort.as_deref())?;
    let enable_thinking =
        params::reasoning(&state.profile, "reasoning_effort", effort, &mut warnings);
    let tools = tools(req.tools, req.tool_choice.as_ref())?;
    let messages = messages(req.messages)?;
    let has_tools = !tools.is_empty();
    let rendered = prompt::render(
        state,
        ChatTurn {
            messages,
            tools,
            enable_thinking,
        },
    )?;
    Ok(Plan {
        generation: Generation {
            prompt: rendered.tokens,
            prompt_field: "messages",
            sampling,
            seed: req.seed,
            max_tokens,
            stops: params::stops("stop", req.stop)?,
            logprobs,
            prompt_logprobs: None,
            mtp_depth,
            warnings,
        },
        stream: req.stream.unwrap_or(false),
        include_usage: req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        tools: has_tools,
        reasoning_open: rendered.reasoning_open,
    })
}

/// Function tools, unless `tool_choice` turns them off. Forcing a call
/// (`required` or a named function) needs constrained decoding, which this
/// server does not have: refused rather than pretended.
pub fn tools(
    tools: Option<Vec<ChatTool>>,
    choice: Option<&Value>,
) -> Result<Vec<FunctionTool>, ApiError> {
    match choice {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" => {}
        Some(Value::String(s)) if s == "none" => return Ok(Vec::new()),
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice {other} is not supported: only \"auto\" and \"none\" (forcing a \
                     call needs constrained decoding)"
                ),
            ));
        }
    }
    let mut out = Vec::new();
    for (i, t) in tools.unwrap_or_default().into_iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!(
                    "tools[{i}].type = {:?}: only \"function\" tools are supported",
                    t.kind
                ),
            ));
        }
        out.push(FunctionTool {
            name: t.function.name,
            description: t.function.description,
            parameters: t
                .function
                .parameters
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    Ok(out)
}

/// The messages in the chat-template shape.
fn messages(messages: Vec<ChatMessage>) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match m.content {
                None => Value::Null,
                Some(MessageContent::Text(t)) => Value::String(t),
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, p) in parts.into_iter().enumerate() {
                        match (p.kind.as_str(), p.text) {
                            ("text" | "input_text" | "output_text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    format!("messages[{i}].content[{j}]"),
                                    format!(
                                        "messages[{i}].content[{j}]: content of type {kind:?} is \
                                         not supported (text only)"
                                    ),
                                ));
                            }
                        }
                    }
                    Value::String(text)
                }
            };
            let mut v = json!({ "role": m.role.template_name(), "content": content });
            if let Some(name) = m.name {
                v["name"] = Value::String(name);
            }
            if let Some(id) = m.tool_call_id {
                v["tool_call_id"] = Value::String(id);
            }
            if let Some(calls) = m.tool_calls {
                v["tool_calls"] = serde_json::to_value(calls).unwrap_or(Value::Null);
            }
            if let Some(r) = m.reasoning_content {
                v["reasoning_content"] = Value::String(r);
            }
            Ok(v)
        })
        .collect()
}

struct Head {
    id: String,
    created: u64,
    model: String,
    seed: u64,
    warnings: Vec<String>,
}

fn complete(state: &SharedState, head: Head, c: Collected) -> Result<ChatCompletion, ApiError> {
    let summary = c
        .summary
        .ok_or_else(|| ApiError::internal("the turn ended without a summary"))?;
    let tool_calls: Vec<ToolCall> = c
        .tool_calls
        .into_iter()
        .map(|t| ToolCall {
            id: t.id,
            kind: "function".into(),
            function: FunctionCall {
                name: t.name,
                arguments: t.arguments,
            },
        })
        .collect();
    let logprobs = c
        .tokens
        .iter()
        .any(|t| t.logprobs.is_some())
        .then(|| ChoiceLogprobs {
            content: c
                .tokens
                .iter()
                .filter(|t| !state.tokenizer.stop_token_ids().contains(&t.id))
                .filter_map(|t| t.logprobs.as_ref())
                .map(|lp| LogprobEntry::of(&state.tokenizer, lp))
                .collect(),
        });
    let reason = finish_reason(&summary, !tool_calls.is_empty());
    Ok(ChatCompletion {
        id: head.id,
        object: "chat.completion",
        created: head.created,
        model: head.model,
        choices: vec![ChatChoice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: (!c.text.is_empty() || tool_calls.is_empty()).then_some(c.text),
                reasoning_content: (!c.reasoning.is_empty()).then_some(c.reasoning),
                tool_calls,
            },
            logprobs,
            finish_reason: reason,
        }],
        usage: Usage::of(&summary, head.seed),
        warnings: head.warnings,
    })
}

async fn stream(
    tx: SseSender,
    mut turn: TurnStream,
    head: Head,
    include_usage: bool,
    tokenizer: std::sync::Arc<ds4_text::Tokenizer>,
) {
    let chunk = |delta: Delta, logprobs: Option<ChoiceLogprobs>, finish: Option<&'static str>| {
        ChatCompletionChunk {
            id: head.id.clone(),
            object: "chat.completion.chunk",
            created: head.created,
            model: head.model.clone(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason: finish,
            }],
            usage: include_usage.then_some(None),
            warnings: Vec::new(),
        }
    };
    let mut first = chunk(
        Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        },
        None,
        None,
    );
    first.warnings = head.warnings.clone();
    if !tx.json(None, &first).await {
        return;
    }
    let mut called_tools = false;
    while let Some(items) = turn.next().await {
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut lps = Vec::new();
        let mut out = Vec::new();
        for item in items {
            match item {
                Item::Text(t) => text.push_str(&t),
                Item::Reasoning(r) => reasoning.push_str(&r),
                Item::Token(t) => {
                    if let Some(lp) = &t.logprobs
                        && !tokenizer.stop_token_ids().contains(&t.id)
                    {
                        lps.push(LogprobEntry::of(&tokenizer, lp));
                    }
                }
                Item::ToolStart { index, id, name } => {
                    called_tools = true;
                    // Text before the call goes out before it.
                    flush(&mut out, &chunk, &mut text, &mut reasoning, &mut lps);
                    out.push(chunk(
                        tool_delta(index, Some(id), Some(name), String::new()),
                        None,
                        None,
                    ));
                }
                Item::ToolArgs { index, delta } => {
                    flush(&mut out, &chunk, &mut text, &mut reasoning, &mut lps);
                    out.push(chunk(tool_delta(index, None, None, delta), None, None));
                }
                Item::ToolEnd { .. } | Item::Started | Item::PromptLogprobs(_) => {}
                Item::Finished(summary) => {
                    flush(&mut out, &chunk, &mut text, &mut reasoning, &mut lps);
                    let reason = finish_reason(&summary, called_tools);
                    out.push(chunk(Delta::default(), None, Some(reason)));
                    if include_usage {
                        let mut last = chunk(Delta::default(), None, None);
                        last.choices.clear();
                        last.usage = Some(Some(Usage::of(&summary, head.seed)));
                        out.push(last);
                    }
                }
                Item::Failed(message) => {
                    flush(&mut out, &chunk, &mut text, &mut reasoning, &mut lps);
                    for c in out.drain(..) {
                        if !tx.json(None, &c).await {
                            return;
                        }
                    }
                    let _ = tx.error(&ApiError::internal(message)).await;
                    return;
                }
            }
        }
        flush(&mut out, &chunk, &mut text, &mut reasoning, &mut lps);
        for c in out {
            if !tx.json(None, &c).await {
                return;
            }
        }
    }
    let _ = tx.done().await;
}

fn tool_delta(index: usize, id: Option<String>, name: Option<String>, arguments: String) -> Delta {
    Delta {
        tool_calls: Some(vec![ToolCallDelta {
            index,
            kind: id.as_ref().map(|_| "function"),
            id,
            function: FunctionDelta { name, arguments },
        }]),
        ..Delta::default()
    }
}

/// Turn pending text/reasoning/logprobs into one chunk.
fn flush(
    out: &mut Vec<ChatCompletionChunk>,
    chunk: &impl Fn(Delta, Option<ChoiceLogprobs>, Option<&'static str>) -> ChatCompletionChunk,
    text: &mut String,
    reasoning: &mut String,
    lps: &mut Vec<LogprobEntry>,
) {
    if text.is_empty() && reasoning.is_empty() && lps.is_empty() {
        return;
    }
    let delta = Delta {
        content: (!text.is_empty()).then(|| std::mem::take(text)),
        reasoning_content: (!reasoning.is_empty()).then(|| std::mem::take(reasoning)),
        ..Delta::default()
    };
    let logprobs = (!lps.is_empty()).then(|| ChoiceLogprobs {
        content: std::mem::take(lps),
    });
    out.push(chunk(delta, logprobs, None));
}
