//! `POST /v1/chat/completions`.

use axum::extract::State;
use axum::response::Response;
use serde_json::{Value, json};

use crate::constraints;
use crate::error::{ApiError, tool_not_offered};
use crate::extract::ApiJson;
use crate::images::Images;
use crate::output::{Item, Output};
use crate::params::{self, SamplingFields};
use crate::prompt::ChatTurn;
use crate::request::{Checked, Common, Finished, Head, Turn, Writer, openai_tools};
use crate::sse::SseSender;
use crate::state::{AppState, SharedState};
use crate::thinking;
use crate::tools::{FunctionTool, ToolShape};
use crate::types::chat::*;
use crate::types::common::{LogprobEntry, Usage, finish_reason};

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
    let include_usage = req
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let (mut checked, output) = prepare(&state, req)?;
    checked
        .generation
        .expand_images(state.vision.as_ref())
        .await?;
    let turn = Turn::start(&state, checked, output, "chatcmpl-").await?;
    let tokenizer = state.tokenizer.clone();
    turn.respond(
        &state,
        |tx, head| ChunkWriter::new(tx, head, include_usage, tokenizer),
        |head, done| complete(&state, head, done),
    )
    .await
}

/// Everything before admission: the shared parameters checked, the
/// conversation rendered.
pub(crate) fn prepare(
    state: &AppState,
    req: ChatCompletionRequest,
) -> Result<(Checked, Output), ApiError> {
    // `max_completion_tokens` wins when both are sent, but an invalid
    // `max_tokens` beside it is still refused, not silently ignored.
    params::max_tokens("max_tokens", req.max_tokens)?;
    let max_tokens = match req.max_completion_tokens {
        Some(m) => ("max_completion_tokens", Some(m)),
        None => ("max_tokens", req.max_tokens),
    };
    let model = req.model.clone();
    let mut checked = Common {
        model: req.model,
        sampling: SamplingFields {
            temperature: req.temperature,
            top_p: req.top_p,
            top_k: req.top_k,
            min_p: req.min_p,
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
        },
        max_temperature: 2.0,
        seed: req.seed,
        max_tokens,
        stop: ("stop", req.stop),
        n: req.n,
        mtp_depth: req.mtp_depth,
        stream: req.stream,
    }
    .check(state)?;
    let top = params::top_logprobs("top_logprobs", req.top_logprobs)?;
    let g = &mut checked.generation;
    g.logprobs = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (true, _) => Some(top),
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        (false, None) => None,
    };
    let controls = thinking::Controls {
        effort: req.reasoning_effort.map(|e| ("reasoning_effort", e)),
        extension: match (req.think, req.thinking.as_ref()) {
            (Some(on), _) => Some(("think", on)),
            (None, Some(t)) => thinking_switch(t).map(|on| ("thinking", on)),
            (None, None) => None,
        },
        model,
        ..thinking::Controls::default()
    };
    let thinking = thinking::resolve(state, &controls, &mut g.warnings)?;
    let choice = constraints::ToolChoice::openai(req.tool_choice.as_ref())?;
    let tools = tools(req.tools, req.tool_choice.as_ref(), &mut g.warnings)?;
    let requested = constraints::one_of(vec![
        constraints::response_format(req.response_format.as_ref())?,
        constraints::grammar_field(req.grammar.as_ref())?,
        constraints::forced_call(state, &choice, &tools)?,
    ])?;
    let mut images = Images::new(state.config.images, state.serving.accepts_images);
    let messages = messages(req.messages, &mut images)?;
    let conversation = ChatTurn {
        messages,
        tools,
        thinking,
        images: images.list,
    };
    let output = checked.render(state, "messages", conversation)?;
    checked.generation.constraint = constraints::compile(state, requested, output)?;
    Ok((checked, output))
}

/// Function tools, unless `tool_choice` turns them off. Other tool types
/// (`custom`, built-ins) are left out and reported in `warnings`, as the
/// other APIs do.
pub fn tools(
    tools: Option<Vec<ChatTool>>,
    choice: Option<&Value>,
    warnings: &mut Vec<String>,
) -> Result<Vec<FunctionTool>, ApiError> {
    for (i, t) in tools.iter().flatten().enumerate() {
        if t.kind != "function" {
            let name = t.function.as_ref().map_or("", |f| f.name.as_str());
            warnings.push(tool_not_offered(&format!("tools[{i}]"), &t.kind, name));
        }
    }
    openai_tools(tools, choice, |i, t| {
        if t.kind != "function" {
            return Ok(None);
        }
        let Some(f) = t.function else {
            return Err(ApiError::invalid(
                format!("tools[{i}].function"),
                format!("tools[{i}].function is required for a function tool"),
            ));
        };
        Ok(Some(FunctionTool::new(
            ToolShape::OpenAiFunction,
            f.name,
            f.description,
            f.parameters,
        )))
    })
}

/// The extension `thinking` switch (ds4's `parse_thinking_control_value`):
/// `true`/`false`, or `{"type": "enabled" | "disabled"}`; anything else says
/// nothing.
fn thinking_switch(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(on) => Some(*on),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("enabled") => Some(true),
            Some("disabled") => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// The messages in the chat-template shape. A message with images keeps its
/// parts (`{"type": "text"}` / `{"type": "image"}`, where the template puts
/// the image's tokens); the images go to `images`.
fn messages(messages: Vec<ChatMessage>, images: &mut Images) -> Result<Vec<Value>, ApiError> {
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
                    let mut items = Vec::new();
                    for (j, p) in parts.into_iter().enumerate() {
                        match (p.kind.as_str(), p.text) {
                            ("text" | "input_text" | "output_text", Some(t)) => {
                                text.push_str(&t);
                                items.push(json!({"type": "text", "text": t}));
                            }
                            ("image_url", _) => {
                                let field = format!("messages[{i}].content[{j}]");
                                images.push_image_url(&field, p.image_url.as_ref())?;
                                items.push(json!({"type": "image"}));
                            }
                            // Not chat's spelling of an image: refused as before.
                            ("input_image" | "image", _) => {
                                return Err(ApiError::image_unsupported(format!(
                                    "messages[{i}].content[{j}]"
                                )));
                            }
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
                    if items.iter().any(|p| p["type"] == "image") {
                        Value::Array(items)
                    } else {
                        Value::String(text)
                    }
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

fn complete(state: &SharedState, head: Head, done: Finished) -> ChatCompletion {
    let Finished { output: c, summary } = done;
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
    ChatCompletion {
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
    }
}

/// Chat completion chunks: text, reasoning and logprobs of one worker
/// event go out as one chunk; tool calls as their own deltas.
pub struct ChunkWriter {
    tx: SseSender,
    head: Head,
    include_usage: bool,
    tokenizer: std::sync::Arc<ds4_text::Tokenizer>,
    called_tools: bool,
    text: String,
    reasoning: String,
    lps: Vec<LogprobEntry>,
    out: Vec<ChatCompletionChunk>,
}

impl ChunkWriter {
    pub fn new(
        tx: SseSender,
        head: Head,
        include_usage: bool,
        tokenizer: std::sync::Arc<ds4_text::Tokenizer>,
    ) -> Self {
        Self {
            tx,
            head,
            include_usage,
            tokenizer,
            called_tools: false,
            text: String::new(),
            reasoning: String::new(),
            lps: Vec::new(),
            out: Vec::new(),
        }
    }

    fn chunk(
        &self,
        delta: Delta,
        logprobs: Option<ChoiceLogprobs>,
        finish: Option<&'static str>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs,
                finish_reason: finish,
            }],
            usage: self.include_usage.then_some(None),
            warnings: Vec::new(),
        }
    }

    /// Pending text/reasoning/logprobs into one chunk.
    fn flush(&mut self) {
        if self.text.is_empty() && self.reasoning.is_empty() && self.lps.is_empty() {
            return;
        }
        let delta = Delta {
            content: (!self.text.is_empty()).then(|| std::mem::take(&mut self.text)),
            reasoning_content: (!self.reasoning.is_empty())
                .then(|| std::mem::take(&mut self.reasoning)),
            ..Delta::default()
        };
        let logprobs = (!self.lps.is_empty()).then(|| ChoiceLogprobs {
            content: std::mem::take(&mut self.lps),
        });
        let c = self.chunk(delta, logprobs, None);
        self.out.push(c);
    }

    /// Flush, then push `delta` as its own chunk (text before a call goes
    /// out before it).
    fn push(&mut self, delta: Delta, finish: Option<&'static str>) {
        self.flush();
        let c = self.chunk(delta, None, finish);
        self.out.push(c);
    }

    async fn send_all(&mut self) -> bool {
        self.flush();
        for c in std::mem::take(&mut self.out) {
            if !self.tx.json(None, &c).await {
                return false;
            }
        }
        true
    }
}

impl Writer for ChunkWriter {
    async fn open(&mut self) -> bool {
        let role = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
            ..Delta::default()
        };
        let mut first = self.chunk(role, None, None);
        first.warnings = self.head.warnings.clone();
        self.tx.json(None, &first).await
    }

    async fn item(&mut self, item: Item) -> bool {
        match item {
            Item::Text(t) => self.text.push_str(&t),
            Item::Reasoning(r) => self.reasoning.push_str(&r),
            Item::Token(t) => {
                if let Some(lp) = &t.logprobs
                    && !self.tokenizer.stop_token_ids().contains(&t.id)
                {
                    self.lps.push(LogprobEntry::of(&self.tokenizer, lp));
                }
            }
            Item::ToolStart { index, id, name } => {
                self.called_tools = true;
                self.push(tool_delta(index, Some(id), Some(name), String::new()), None);
            }
            Item::ToolArgs { index, delta } => {
                self.push(tool_delta(index, None, None, delta), None);
            }
            Item::ToolEnd { .. } | Item::Started | Item::PromptLogprobs(_) => {}
            Item::Finished(summary) => {
                let reason = finish_reason(&summary, self.called_tools);
                self.push(Delta::default(), Some(reason));
                if self.include_usage {
                    let mut last = self.chunk(Delta::default(), None, None);
                    last.choices.clear();
                    last.usage = Some(Some(Usage::of(&summary, self.head.seed)));
                    self.out.push(last);
                }
            }
            Item::Failed(message) => {
                if self.send_all().await {
                    let _ = self.tx.error(&ApiError::internal(message)).await;
                }
                return false;
            }
        }
        true
    }

    async fn batch_end(&mut self) -> bool {
        self.send_all().await
    }

    async fn close(self) {
        let _ = self.tx.done().await;
    }
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

#[cfg(test)]
mod tests {
    //! Tool-call parsing and streaming in each family's format, from
    //! scripted model output through the real chunk writer.

    use std::sync::Arc;

    use super::*;
    use crate::request::scripted;

    fn tokenizer() -> Arc<ds4_text::Tokenizer> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/qwen4_exp/tiny_a"
        );
        Arc::new(ds4_text::Tokenizer::from_hf_dir(dir).unwrap())
    }

    /// The chunks of a scripted turn, and the reassembled reasoning, text
    /// and tool calls (id, name, arguments) as a client would build them.
    async fn chunks(family: &str, output: &str) -> (Vec<Value>, String, String, Vec<[String; 3]>) {
        let tk = tokenizer();
        let events = scripted::sse(scripted::stream(family, true, false, output), |tx| {
            ChunkWriter::new(tx, scripted::head(), true, tk)
        })
        .await;
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| e.1.clone())
            .collect();
        let (mut reasoning, mut text, mut calls) = (String::new(), String::new(), Vec::new());
        for c in &chunks {
            let Some(delta) = c["choices"].get(0).map(|ch| &ch["delta"]) else {
                continue;
            };
            reasoning += delta["reasoning_content"].as_str().unwrap_or("");
            text += delta["content"].as_str().unwrap_or("");
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = call["index"].as_u64().unwrap() as usize;
                if let Some(id) = call["id"].as_str() {
                    assert_eq!(i, calls.len(), "calls start in order");
                    assert_eq!(call["type"], "function");
                    let name = call["function"]["name"].as_str().unwrap().to_string();
                    calls.push([id.to_string(), name, String::new()]);
                }
                calls[i][2] += call["function"]["arguments"].as_str().unwrap();
            }
        }
        (chunks, reasoning, text, calls)
    }

    #[tokio::test]
    async fn xml_calls_stream_as_tool_call_deltas() {
        let out = "<think>Weather needed.</think>\n\nLet me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
        let (chunks, reasoning, text, calls) = chunks("qwen4_exp", out).await;
        assert_eq!(reasoning, "Weather needed.");
        // The newline between the two calls is text, as the reference parser keeps it.
        assert_eq!(text.trim_end(), "Let me check.");
        assert_eq!(calls.len(), 2);
        assert!(calls[0][0].starts_with("call_") && calls[0][0] != calls[1][0]);
        assert_eq!(
            calls[0][1..],
            ["get_weather".to_string(), "{\"city\": \"Oslo\"}".into()]
        );
        assert_eq!(calls[1][1..], ["get_time".to_string(), "{}".into()]);
        // Arguments arrive as they are generated: several deltas, not one.
        let arg_deltas = chunks
            .iter()
            .filter(|c| c["choices"][0]["delta"]["tool_calls"][0]["id"].is_null())
            .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
            .count();
        assert!(arg_deltas > 2, "{arg_deltas}");
        let finish: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&json!("tool_calls")]);
        let last = chunks.last().unwrap();
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["seed"], 7);
    }

    #[tokio::test]
    async fn llama_json_call_streams_as_tool_call_deltas() {
        let out = "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}";
        let (_, reasoning, text, calls) = chunks("llama", out).await;
        assert_eq!((reasoning.as_str(), text.as_str()), ("", ""));
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0][1..],
            ["add".to_string(), "{\"a\": 1, \"b\": 2}".into()]
        );
        // Plain text stays text in the llama format.
        let (_, _, text, calls) = chunks("llama", "Two plus two is four.").await;
        assert_eq!(text, "Two plus two is four.");
        assert!(calls.is_empty());
    }

    /// DeepSeek-V4: DSML calls stream as tool-call deltas as ds4 streams
    /// them (header once the invoke tag is complete, then `{`, each
    /// parameter's `"name":` and its value as it grows, `}`), text before
    /// the block without the blank line that belongs to the block, DSML
    /// inside the reasoning not executable.
    #[tokio::test]
    async fn dsml_calls_stream_as_tool_call_deltas() {
        let out = "<think>Maybe <｜DSML｜tool_calls> no.</think>I'll look.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; echo \"é\"</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"read_file\">\n<｜DSML｜parameter name=\"path\" string=\"true\">/tmp/a</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
        let (chunks, reasoning, text, calls) = chunks("deepseek_v4", out).await;
        assert_eq!(reasoning, "Maybe <｜DSML｜tool_calls> no.");
        assert_eq!(text, "I'll look.");
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0][1..],
            [
                "bash".to_string(),
                "{\"command\":\"ls && echo \\\"é\\\"\",\"timeout\":10}".into()
            ]
        );
        assert_eq!(
            calls[1][1..],
            ["read_file".to_string(), "{\"path\":\"/tmp/a\"}".into()]
        );
        // The header comes before any argument fragment, and arguments grow
        // token by token.
        let args: Vec<&str> = chunks
            .iter()
            .filter_map(|c| {
                c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            })
            .collect();
        assert_eq!(args[0], "", "the header chunk carries no arguments");
        assert!(args.len() > 20, "{}", args.len());
        let finish: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&Value::from("tool_calls")]);
    }

    /// GLM-5: `<tool_call>name<arg_key>…` calls stream as tool_call deltas
    /// (a header, then one argument member per completed pair).
    #[tokio::test]
    async fn glm_calls_stream_as_tool_call_deltas() {
        let out = "<think>Two calls.</think>Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>/tmp/a</arg_value>\n</tool_call>";
        let (chunks, reasoning, text, calls) = chunks("glm5_next", out).await;
        assert_eq!(
            (reasoning.as_str(), text.as_str()),
            ("Two calls.", "Checking.")
        );
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0][1..],
            [
                "get_weather".to_string(),
                "{\"city\": \"Oslo\", \"days\": 3}".into()
            ]
        );
        assert_eq!(
            calls[1][1..],
            ["read_file".to_string(), "{\"path\": \"/tmp/a\"}".into()]
        );
        let finish: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0))
            .map(|c| &c["finish_reason"])
            .filter(|f| !f.is_null())
            .collect();
        assert_eq!(finish, [&Value::from("tool_calls")]);
    }
}
