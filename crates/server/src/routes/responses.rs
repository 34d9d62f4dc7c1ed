//! `POST /v1/responses`: the Responses API request and its SSE lifecycle
//! (`response.created` … `response.completed`, every event numbered).

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
use crate::types::responses::*;
use crate::worker::TurnSummary;
use ds4_engine::decode::FinishReason;

#[utoipa::path(
    post,
    path = "/v1/responses",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "A response, or an SSE stream of numbered `response.*` events", body = ResponseObject),
        (status = 400, description = "Invalid request"),
    )
)]
pub async fn responses(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<ResponsesRequest>,
) -> Result<Response, ApiError> {
    state.metrics.request("responses");
    state.check_model(req.model.as_deref())?;
    let mtp_depth = params::mtp_depth(state.mtp, req.mtp_depth)?;
    if req.previous_response_id.is_some() {
        return Err(ApiError::invalid(
            "previous_response_id",
            "previous_response_id is not supported: responses are not stored; send the whole \
             conversation in input",
        ));
    }
    let sampling = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        ..SamplingFields::default()
    }
    .validate()?;
    let max_tokens = params::max_tokens("max_output_tokens", req.max_output_tokens)?;
    let mut warnings = Vec::new();
    let effort = params::effort(
        "reasoning.effort",
        req.reasoning.as_ref().and_then(|r| r.effort.as_deref()),
    )?;
    let enable_thinking =
        params::reasoning(&state.profile, "reasoning.effort", effort, &mut warnings);
    let tools = tools(req.tools, req.tool_choice.as_ref())?;
    let has_tools = !tools.is_empty();
    let mut messages = Vec::new();
    if let Some(i) = &req.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    input_messages(req.input, &mut messages)?;
    let rendered = prompt::render(
        &state,
        ChatTurn {
            messages,
            tools,
            enable_thinking,
        },
    )?;
    let admitted = admit(
        &state,
        Generation {
            prompt: rendered.tokens,
            prompt_field: "input",
            sampling,
            seed: req.seed,
            max_tokens,
            stops: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
            mtp_depth,
            warnings,
        },
    )?;
    let turn = TurnStream::new(
        admitted.events,
        OutputParser::new(&state.profile, has_tools, rendered.reasoning_open),
    );
    let shell = ResponseObject {
        id: new_id("resp_"),
        object: "response",
        created_at: unix_now(),
        status: "in_progress",
        incomplete_details: None,
        error: None,
        model: state.config.model_id.clone(),
        output: Vec::new(),
        usage: None,
        parallel_tool_calls: false,
        tool_choice: if has_tools { "auto" } else { "none" },
        tools: Vec::new(),
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        warnings: admitted.warnings,
    };
    let seed = admitted.seed;
    if req.stream.unwrap_or(false) {
        return Ok(sse::respond(state.config.keep_alive, move |tx| {
            stream(tx, turn, shell, seed)
        }));
    }
    let c = Collected::run(turn).await.map_err(ApiError::internal)?;
    let summary = c
        .summary
        .clone()
        .ok_or_else(|| ApiError::internal("the turn ended without a summary"))?;
    let mut output = Vec::new();
    if !c.reasoning.is_empty() {
        output.push(reasoning_item(&new_id("rs_"), &c.reasoning));
    }
    if !c.text.is_empty() || c.tool_calls.is_empty() {
        output.push(message_item(&new_id("msg_"), &c.text, "completed"));
    }
    for call in &c.tool_calls {
        output.push(call_item(
            &new_id("fc_"),
            &call.id,
            &call.name,
            &call.arguments,
            "completed",
        ));
    }
    Ok(Json(finish(shell, output, &summary, seed)).into_response())
}

fn tools(
    tools: Option<Vec<ResponseTool>>,
    choice: Option<&Value>,
) -> Result<Vec<FunctionTool>, ApiError> {
    match choice {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" => {}
        Some(Value::String(s)) if s == "none" => return Ok(Vec::new()),
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice {other} is not supported: only \"auto\" and \"none\""),
            ));
        }
    }
    let mut out = Vec::new();
    for (i, t) in tools.unwrap_or_default().into_iter().enumerate() {
        // Codex also offers built-in tools (web_search, ...) the model cannot
        // run here; only function tools are offered to the model.
        if t.kind != "function" {
            continue;
        }
        let name = t.name.ok_or_else(|| {
            ApiError::invalid(
                format!("tools[{i}].name"),
                format!("tools[{i}].name is required"),
            )
        })?;
        out.push(FunctionTool {
            name,
            description: t.description,
            parameters: t
                .parameters
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    Ok(out)
}

/// Input items as template messages. Consecutive function calls join one
/// assistant message; their outputs become `tool` messages.
fn input_messages(input: ResponseInput, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let items = match input {
        ResponseInput::Text(t) => {
            out.push(json!({"role": "user", "content": t}));
            return Ok(());
        }
        ResponseInput::Items(items) => items,
    };
    if items.is_empty() {
        return Err(ApiError::invalid("input", "input must not be empty"));
    }
    for (i, item) in items.into_iter().enumerate() {
        let kind = item.kind.as_deref().unwrap_or("message");
        match kind {
            "message" => {
                let role = match item.role.as_deref() {
                    Some("developer" | "system") => "system",
                    Some("user") => "user",
                    Some("assistant") => "assistant",
                    other => {
                        return Err(ApiError::invalid(
                            format!("input[{i}].role"),
                            format!(
                                "input[{i}].role = {other:?}: expected user, assistant, system or developer"
                            ),
                        ));
                    }
                };
                let text = match item.content {
                    Some(Value::String(s)) => s,
                    Some(Value::Array(parts)) => {
                        parts.iter().filter_map(|p| p["text"].as_str()).collect()
                    }
                    _ => String::new(),
                };
                out.push(json!({"role": role, "content": text}));
            }
            "function_call" => {
                let call = json!({
                    "id": item.call_id.unwrap_or_default(),
                    "type": "function",
                    "function": {"name": item.name.unwrap_or_default(), "arguments": item.arguments.unwrap_or_default()},
                });
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        if let Some(calls) = last["tool_calls"].as_array_mut() {
                            calls.push(call);
                        } else {
                            last["tool_calls"] = json!([call]);
                        }
                    }
                    _ => {
                        out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                    }
                }
            }
            "function_call_output" => out.push(json!({
                "role": "tool",
                "tool_call_id": item.call_id.unwrap_or_default(),
                "content": item.output.unwrap_or_default(),
            })),
            // Earlier reasoning is not replayed into the prompt.
            "reasoning" => {}
            other => {
                return Err(ApiError::invalid(
                    format!("input[{i}].type"),
                    format!("input[{i}].type = {other:?} is not supported"),
                ));
            }
        }
    }
    Ok(())
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message", "id": id, "status": status, "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({
        "type": "reasoning", "id": id, "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call", "id": id, "call_id": call_id, "name": name,
        "arguments": arguments, "status": status,
    })
}

fn finish(mut r: ResponseObject, output: Vec<Value>, s: &TurnSummary, seed: u64) -> ResponseObject {
    let truncated = matches!(
        s.finish_reason,
        FinishReason::MaxTokens | FinishReason::ContextFull
    );
    r.status = if truncated { "incomplete" } else { "completed" };
    r.incomplete_details = truncated.then(|| json!({"reason": "max_output_tokens"}));
    r.output = output;
    r.usage = Some(ResponseUsage {
        input_tokens: s.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: s.cached_tokens,
        },
        output_tokens: s.completion_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: 0,
        },
        total_tokens: s.prompt_tokens + s.completion_tokens,
        seed,
    });
    r
}

/// Numbers every event, as the Responses stream requires.
struct Events<'a> {
    tx: &'a SseSender,
    seq: u64,
}

impl Events<'_> {
    async fn send(&mut self, kind: &str, mut body: Value) -> bool {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.tx.json(Some(kind), &body).await
    }
}

/// The output item being streamed.
enum Current {
    None,
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

struct Writer<'a> {
    ev: Events<'a>,
    current: Current,
    output: Vec<Value>,
}

impl Writer<'_> {
    fn index(&self) -> usize {
        self.output.len()
    }

    /// Finish the open item (its `.done` events) and keep it.
    async fn close(&mut self) -> bool {
        let i = self.index();
        let item = match std::mem::replace(&mut self.current, Current::None) {
            Current::None => return true,
            Current::Reasoning { id, text } => {
                if !self
                    .ev
                    .send(
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
                    )
                    .await
                {
                    return false;
                }
                reasoning_item(&id, &text)
            }
            Current::Message { id, text } => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                if !self
                    .ev
                    .send("response.output_text.done", json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}))
                    .await
                    || !self
                        .ev
                        .send("response.content_part.done", json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}))
                        .await
                {
                    return false;
                }
                message_item(&id, &text, "completed")
            }
            Current::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                if !self
                    .ev
                    .send("response.function_call_arguments.done", json!({"item_id": id, "output_index": i, "name": name, "arguments": arguments}))
                    .await
                {
                    return false;
                }
                call_item(&id, &call_id, &name, &arguments, "completed")
            }
        };
        let ok = self
            .ev
            .send(
                "response.output_item.done",
                json!({"output_index": i, "item": item}),
            )
            .await;
        self.output.push(item);
        ok
    }

    async fn text(&mut self, delta: String) -> bool {
        if !matches!(self.current, Current::Message { .. }) {
            if !self.close().await {
                return false;
            }
            let id = new_id("msg_");
            let i = self.index();
            if !self
                .ev
                .send("response.output_item.added", json!({"output_index": i, "item": message_item(&id, "", "in_progress")}))
                .await
                || !self
                    .ev
                    .send("response.content_part.added", json!({"item_id": id, "output_index": i, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}))
                    .await
            {
                return false;
            }
            self.current = Current::Message {
                id,
                text: String::new(),
            };
        }
        let i = self.index();
        let Current::Message { id, text } = &mut self.current else {
            return false;
        };
        text.push_str(&delta);
        let body = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": delta, "logprobs": []});
        self.ev.send("response.output_text.delta", body).await
    }

    async fn reasoning(&mut self, delta: String) -> bool {
        if !matches!(self.current, Current::Reasoning { .. }) {
            if !self.close().await {
                return false;
            }
            let id = new_id("rs_");
            let item = json!({"type": "reasoning", "id": id, "summary": [], "content": []});
            if !self
                .ev
                .send(
                    "response.output_item.added",
                    json!({"output_index": self.index(), "item": item}),
                )
                .await
            {
                return false;
            }
            self.current = Current::Reasoning {
                id,
                text: String::new(),
            };
        }
        let i = self.index();
        let Current::Reasoning { id, text } = &mut self.current else {
            return false;
        };
        text.push_str(&delta);
        let body = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": delta});
        self.ev.send("response.reasoning_text.delta", body).await
    }

    async fn call(&mut self, call_id: String, name: String) -> bool {
        if !self.close().await {
            return false;
        }
        let id = new_id("fc_");
        let item = call_item(&id, &call_id, &name, "", "in_progress");
        self.current = Current::Call {
            id,
            call_id,
            name,
            arguments: String::new(),
        };
        self.ev
            .send(
                "response.output_item.added",
                json!({"output_index": self.index(), "item": item}),
            )
            .await
    }

    async fn arguments(&mut self, delta: String) -> bool {
        let i = self.index();
        let Current::Call { id, arguments, .. } = &mut self.current else {
            return true;
        };
        arguments.push_str(&delta);
        let body = json!({"item_id": id, "output_index": i, "delta": delta});
        self.ev
            .send("response.function_call_arguments.delta", body)
            .await
    }
}

async fn stream(tx: SseSender, mut turn: TurnStream, shell: ResponseObject, seed: u64) {
    let mut w = Writer {
        ev: Events { tx: &tx, seq: 0 },
        current: Current::None,
        output: Vec::new(),
    };
    if !w
        .ev
        .send("response.created", json!({"response": shell}))
        .await
        || !w
            .ev
            .send("response.in_progress", json!({"response": shell}))
            .await
    {
        return;
    }
    while let Some(items) = turn.next().await {
        for item in items {
            let ok = match item {
                Item::Text(t) => w.text(t).await,
                Item::Reasoning(r) => w.reasoning(r).await,
                Item::ToolStart { id, name, .. } => w.call(id, name).await,
                Item::ToolArgs { delta, .. } => w.arguments(delta).await,
                Item::ToolEnd { .. } => w.close().await,
                Item::Started | Item::Token(_) | Item::PromptLogprobs(_) => true,
                Item::Finished(summary) => {
                    if !w.close().await {
                        return;
                    }
                    let done = finish(shell.clone(), std::mem::take(&mut w.output), &summary, seed);
                    let kind = if done.status == "completed" {
                        "response.completed"
                    } else {
                        "response.incomplete"
                    };
                    w.ev.send(kind, json!({"response": done})).await
                }
                Item::Failed(message) => {
                    let mut failed = shell.clone();
                    failed.status = "failed";
                    failed.error = Some(json!({"code": "server_error", "message": message}));
                    let _ =
                        w.ev.send("response.failed", json!({"response": failed}))
                            .await;
                    return;
                }
            };
            if !ok {
                return;
            }
        }
    }
}
