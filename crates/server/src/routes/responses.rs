//! `POST /v1/responses`: the Responses API request and its SSE lifecycle
//! (`response.created` … `response.completed`, every event numbered).

use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use crate::constraints;
use crate::error::{ApiError, tool_not_offered};
use crate::extract::ApiJson;
use crate::ids::new_id;
use crate::images::Images;
use crate::output::Item;
use crate::params::SamplingFields;
use crate::prompt::ChatTurn;
use crate::request::{Common, Finished, Turn, Writer, openai_tools};
use crate::sse::SseSender;
use crate::state::SharedState;
use crate::summary::TurnSummary;
use crate::thinking;
use crate::tools::{FunctionTool, ToolShape};
use crate::types::responses::*;
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
    let model = req.model.clone();
    let mut checked = Common {
        model: req.model,
        sampling: SamplingFields {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            min_p: req.min_p,
            ..SamplingFields::default()
        },
        max_temperature: 2.0,
        seed: req.seed,
        max_tokens: ("max_output_tokens", req.max_output_tokens),
        stop: ("stop", None),
        n: None,
        mtp_depth: req.mtp_depth,
        stream: req.stream,
    }
    .check(&state)?;
    if req.previous_response_id.is_some() {
        return Err(ApiError::invalid(
            "previous_response_id",
            "previous_response_id is not supported: responses are not stored; send the whole \
             conversation in input",
        ));
    }
    let g = &mut checked.generation;
    let controls = thinking::Controls {
        effort: req
            .reasoning
            .as_ref()
            .and_then(|r| r.effort.clone())
            .map(|e| ("reasoning.effort", e)),
        model,
        ..thinking::Controls::default()
    };
    let thinking = thinking::resolve(&state, &controls, &mut g.warnings)?;
    let mut messages = Vec::new();
    if let Some(i) = &req.instructions {
        messages.push(json!({"role": "system", "content": i}));
    }
    let mut images = Images::new(state.config.images, state.serving.accepts_images);
    input_messages(req.input, &mut messages, &mut images)?;
    let choice = constraints::ToolChoice::openai(req.tool_choice.as_ref())?;
    let tools = tools(req.tools, req.tool_choice.as_ref(), &mut g.warnings)?;
    let requested = constraints::one_of(vec![
        constraints::text_format(req.text.as_ref())?,
        constraints::forced_call(&state, &choice, &tools)?,
    ])?;
    let text = match req.text {
        Some(Value::Object(t)) if t.get("format").is_some_and(|f| !f.is_null()) => Value::Object(t),
        _ => json!({"format": {"type": "text"}}),
    };
    let conversation = ChatTurn {
        messages,
        tools,
        thinking,
        images: images.list,
    };
    let output = checked.render(&state, "input", conversation)?;
    checked.generation.constraint = constraints::compile(&state, requested, output)?;
    let has_tools = output.tools;
    checked
        .generation
        .expand_images(state.vision.as_ref())
        .await?;
    let turn = Turn::start(&state, checked, output, "resp_").await?;
    let shell = ResponseObject {
        id: turn.head.id.clone(),
        object: "response",
        created_at: turn.head.created,
        status: "in_progress",
        incomplete_details: None,
        error: None,
        model: turn.head.model.clone(),
        output: Vec::new(),
        usage: None,
        parallel_tool_calls: false,
        tool_choice: if has_tools { "auto" } else { "none" },
        tools: Vec::new(),
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        text,
        warnings: turn.head.warnings.clone(),
    };
    let seed = turn.head.seed;
    let whole = shell.clone();
    turn.respond(
        &state,
        move |tx, _| ItemWriter::new(tx, shell, seed),
        move |_, done| complete(whole, done, seed),
    )
    .await
}

fn complete(shell: ResponseObject, done: Finished, seed: u64) -> ResponseObject {
    let Finished { output: c, summary } = done;
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
    finish(shell, output, &summary, seed)
}

fn tools(
    tools: Option<Vec<ResponseTool>>,
    choice: Option<&Value>,
    warnings: &mut Vec<String>,
) -> Result<Vec<FunctionTool>, ApiError> {
    // Codex also offers built-in tools (web_search, local_shell, custom
    // freeform tools) the model cannot run here; only function tools are
    // offered to the model, and the others are reported.
    for (i, t) in tools.iter().flatten().enumerate() {
        if t.kind != "function" {
            let name = t.name.as_deref().unwrap_or_default();
            warnings.push(tool_not_offered(&format!("tools[{i}]"), &t.kind, name));
        }
    }
    openai_tools(tools, choice, |i, t| {
        if t.kind != "function" {
            return Ok(None);
        }
        let name = t.name.ok_or_else(|| {
            ApiError::invalid(
                format!("tools[{i}].name"),
                format!("tools[{i}].name is required"),
            )
        })?;
        Ok(Some(FunctionTool::new(
            ToolShape::Responses,
            name,
            t.description,
            t.parameters,
        )))
    })
}

/// Input items as template messages. Consecutive function calls join one
/// assistant message; their outputs become `tool` messages.
pub(crate) fn input_messages(
    input: ResponseInput,
    out: &mut Vec<Value>,
    images: &mut Images,
) -> Result<(), ApiError> {
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
                let text = content_text(&format!("input[{i}].content"), item.content, images)?;
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
            "function_call_output" => {
                let content = content_text(&format!("input[{i}].output"), item.output, images)?;
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": item.call_id.unwrap_or_default(),
                    "content": content,
                }))
            }
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

/// A message's `content` or a call output's `output`: a string, or content
/// items whose text is joined; with `input_image` items (a model that reads
/// images) the items as template parts, the images into `images`. Other
/// non-text items are refused by name (never silently dropped).
fn content_text(
    field: &str,
    content: Option<Value>,
    images: &mut Images,
) -> Result<Value, ApiError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(Value::String(String::new())),
        Some(Value::String(s)) => return Ok(Value::String(s)),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be a string or an array of content items"),
            ));
        }
    };
    let mut text = String::new();
    let mut items = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let part = format!("{field}[{j}]");
        match (p["type"].as_str(), p["text"].as_str()) {
            (Some("input_text" | "output_text" | "text" | "summary_text"), Some(t)) => {
                text.push_str(t);
                items.push(json!({"type": "text", "text": t}));
            }
            // An assistant's refusal is what it said.
            (Some("refusal"), _) => {
                let t = p["refusal"].as_str().unwrap_or_default();
                text.push_str(t);
                items.push(json!({"type": "text", "text": t}));
            }
            (Some("input_image"), _) => {
                images.push_image_url(&part, p.get("image_url"))?;
                items.push(json!({"type": "image"}));
            }
            (Some("image_url" | "image"), _) => {
                return Err(ApiError::image_unsupported(part));
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    part.clone(),
                    format!(
                        "{part}: content of type {} is not supported (text only: input_text, \
                         output_text)",
                        kind.map_or("(none)".to_string(), |k| format!("{k:?}"))
                    ),
                ));
            }
        }
    }
    if items.iter().any(|p| p["type"] == "image") {
        Ok(Value::Array(items))
    } else {
        Ok(Value::String(text))
    }
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
    r.usage = Some(ResponseUsage::of(s, seed));
    r
}

/// Numbers every event, as the Responses stream requires.
struct Events {
    tx: SseSender,
    seq: u64,
}

impl Events {
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

/// The Responses stream: `response.created`, output items added, filled
/// and done as the output changes kind, then `response.completed` (or
/// `incomplete` / `failed`).
struct ItemWriter {
    ev: Events,
    current: Current,
    output: Vec<Value>,
    shell: ResponseObject,
    seed: u64,
}

impl ItemWriter {
    fn new(tx: SseSender, shell: ResponseObject, seed: u64) -> Self {
        Self {
            ev: Events { tx, seq: 0 },
            current: Current::None,
            output: Vec::new(),
            shell,
            seed,
        }
    }

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

impl Writer for ItemWriter {
    async fn open(&mut self) -> bool {
        let shell = json!({"response": self.shell});
        self.ev.send("response.created", shell.clone()).await
            && self.ev.send("response.in_progress", shell).await
    }

    async fn item(&mut self, item: Item) -> bool {
        match item {
            Item::Text(t) => self.text(t).await,
            Item::Reasoning(r) => self.reasoning(r).await,
            Item::ToolStart { id, name, .. } => self.call(id, name).await,
            Item::ToolArgs { delta, .. } => self.arguments(delta).await,
            Item::ToolEnd { .. } => self.close().await,
            Item::Started | Item::Token(_) | Item::PromptLogprobs(_) => true,
            Item::Finished(summary) => {
                if !self.close().await {
                    return false;
                }
                let output = std::mem::take(&mut self.output);
                let done = finish(self.shell.clone(), output, &summary, self.seed);
                let kind = if done.status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                self.ev.send(kind, json!({"response": done})).await
            }
            Item::Failed(message) => {
                let mut failed = self.shell.clone();
                failed.status = "failed";
                failed.error = Some(json!({"code": "server_error", "message": message}));
                let _ = self
                    .ev
                    .send("response.failed", json!({"response": failed}))
                    .await;
                false
            }
        }
    }

    async fn close(self) {}
}

#[cfg(test)]
mod tests {
    //! Reasoning, message and function_call items in each family's format,
    //! from scripted model output through the real item writer.

    use super::*;
    use crate::request::scripted;

    fn shell() -> ResponseObject {
        ResponseObject {
            id: "resp_1".into(),
            object: "response",
            created_at: 0,
            status: "in_progress",
            incomplete_details: None,
            error: None,
            model: "m".into(),
            output: Vec::new(),
            usage: None,
            parallel_tool_calls: false,
            tool_choice: "auto",
            tools: Vec::new(),
            instructions: None,
            max_output_tokens: None,
            text: json!({"format": {"type": "text"}}),
            warnings: Vec::new(),
        }
    }

    async fn events(family: &str, output: &str) -> Vec<Value> {
        let events = scripted::sse(scripted::stream(family, true, false, output), |tx| {
            ItemWriter::new(tx, shell(), 7)
        })
        .await;
        for (i, (name, data)) in events.iter().enumerate() {
            assert_eq!(data["sequence_number"], i as u64);
            assert_eq!(name.as_deref(), data["type"].as_str());
        }
        events.into_iter().map(|e| e.1).collect()
    }

    fn joined(events: &[Value], kind: &str) -> String {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["delta"].as_str().unwrap().to_string())
            .collect()
    }

    #[tokio::test]
    async fn xml_reasoning_message_and_function_call_items() {
        let out = "<think>Weather needed.</think>\n\nLet me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
        let ev = events("qwen4_exp", out).await;
        assert_eq!(
            joined(&ev, "response.reasoning_text.delta"),
            "Weather needed."
        );
        assert_eq!(joined(&ev, "response.output_text.delta"), "Let me check.");
        assert_eq!(
            joined(&ev, "response.function_call_arguments.delta"),
            "{\"city\": \"Oslo\"}"
        );
        let done = ev.last().unwrap();
        assert_eq!(done["type"], "response.completed");
        let output = done["response"]["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|o| o["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(output[2]["name"], "get_weather");
        assert_eq!(output[2]["arguments"], "{\"city\": \"Oslo\"}");
        assert!(output[2]["call_id"].as_str().unwrap().starts_with("call_"));
        let added = ev
            .iter()
            .filter(|e| e["type"] == "response.output_item.added")
            .count();
        let item_done = ev
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .count();
        assert_eq!((added, item_done), (3, 3));
    }

    #[tokio::test]
    async fn llama_json_function_call_item() {
        let out = "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}";
        let ev = events("llama", out).await;
        assert_eq!(
            joined(&ev, "response.function_call_arguments.delta"),
            "{\"a\": 1, \"b\": 2}"
        );
        let output = ev.last().unwrap()["response"]["output"].clone();
        assert_eq!(output.as_array().unwrap().len(), 1);
        assert_eq!(output[0]["type"], "function_call");
        assert_eq!(output[0]["name"], "add");
    }

    /// DeepSeek-V4: DSML calls become function_call items whose arguments
    /// stream as `function_call_arguments.delta` events.
    #[tokio::test]
    async fn dsml_function_call_items() {
        let out = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; echo \"é\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/tmp/a</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let ev = events("deepseek_v4", out).await;
        assert_eq!(joined(&ev, "response.output_text.delta"), "Sure.");
        let done = ev.last().unwrap();
        let output = done["response"]["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|o| o["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["message", "function_call", "function_call"]);
        assert_eq!(output[1]["name"], "bash");
        assert_eq!(
            output[1]["arguments"],
            "{\"command\":\"ls && echo \\\"é\\\"\",\"timeout\":10}"
        );
        assert_eq!(output[2]["arguments"], "{\"path\":\"/tmp/a\"}");
        let deltas = ev
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .count();
        assert!(deltas > 10, "{deltas}");
    }

    /// GLM-5: its calls become function_call items.
    #[tokio::test]
    async fn glm_function_call_items() {
        let out = "<think>Two calls.</think>Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>/tmp/a</arg_value>\n</tool_call>";
        let ev = events("glm5_next", out).await;
        assert_eq!(joined(&ev, "response.output_text.delta"), "Checking.");
        let done = ev.last().unwrap();
        let output = done["response"]["output"].as_array().unwrap();
        let kinds: Vec<&str> = output.iter().map(|o| o["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["reasoning", "message", "function_call", "function_call"]
        );
        assert_eq!(output[2]["name"], "get_weather");
        assert_eq!(output[2]["arguments"], "{\"city\": \"Oslo\", \"days\": 3}");
        assert_eq!(output[3]["arguments"], "{\"path\": \"/tmp/a\"}");
    }
}
