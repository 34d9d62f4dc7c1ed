//! The request layer every generation API shares.
//!
//! A route maps its API's request onto [`Common`] (the parameters all APIs
//! carry), renders its prompt, and hands both to [`Turn::start`], which
//! admits the job and returns the turn's item stream with a [`Head`] (id,
//! model, seed, warnings). [`Turn::respond`] then either collects the turn
//! ([`Finished`]) for a JSON body or drives a [`Writer`] that maps
//! [`Item`]s to the API's SSE events. So each route only maps shapes:
//! validation, admission, the event loop and its disconnect handling live
//! here once.

use std::future::Future;
use std::sync::Arc;

use axum::Json;
use axum::response::{IntoResponse, Response};
use ds4_text::ToolSchemas;
use serde::Serialize;
use serde_json::Value;

use crate::admission::{Generation, admit};
use crate::error::ApiError;
use crate::ids::{new_id, unix_now};
use crate::output::{Collected, Item, Output, OutputParser, TurnStream};
use crate::params::{self, SamplingFields, StopField};
use crate::prompt::{self, ChatTurn};
use crate::sse::{self, SseSender};
use crate::state::{AppState, SharedState};
use crate::summary::TurnSummary;
use crate::tools::FunctionTool;

/// The parameters every generation API carries, as the request gave them,
/// with the names this API gives them (for error messages).
#[derive(Debug, Default)]
pub struct Common {
    pub model: Option<String>,
    pub sampling: SamplingFields,
    /// The API's upper bound on `temperature` (OpenAI 2, Anthropic 1).
    pub max_temperature: f64,
    pub seed: Option<u64>,
    /// (field name, value) of the output limit.
    pub max_tokens: (&'static str, Option<u64>),
    /// (field name, value) of the stop strings.
    pub stop: (&'static str, Option<StopField>),
    pub n: Option<u64>,
    pub mtp_depth: Option<u64>,
    pub stream: Option<bool>,
}

/// [`Common`] once validated: what admission needs, plus the stream switch.
#[derive(Debug)]
pub struct Checked {
    pub generation: Generation,
    pub stream: bool,
    /// The offered tools' parameter schemas, by name (a tool-call format
    /// that writes untyped text types its values by them).
    pub tool_schemas: Option<Arc<ToolSchemas>>,
}

impl Common {
    /// Check every shared field (each error names its field); the route
    /// then adds the prompt and its own extras to `generation`.
    pub fn check(self, state: &AppState) -> Result<Checked, ApiError> {
        state.check_model(self.model.as_deref())?;
        params::n(self.n)?;
        let mtp_depth = params::mtp_depth(state.mtp, self.mtp_depth)?;
        let max_tokens = params::max_tokens(self.max_tokens.0, self.max_tokens.1)?;
        let sampling = self.sampling.validate(self.max_temperature)?;
        let stops = params::stops(self.stop.0, self.stop.1)?;
        Ok(Checked {
            generation: Generation {
                sampling,
                seed: self.seed,
                max_tokens,
                stops,
                mtp_depth,
                ..Generation::default()
            },
            stream: self.stream.unwrap_or(false),
            tool_schemas: None,
        })
    }
}

impl Checked {
    /// Render a conversation as this turn's prompt (`field`: the request
    /// field that carried it) and say how its output is read.
    pub fn render(
        &mut self,
        state: &AppState,
        field: &'static str,
        turn: ChatTurn,
    ) -> Result<Output, ApiError> {
        let tools = !turn.tools.is_empty();
        if tools {
            let schemas: ToolSchemas = turn
                .tools
                .iter()
                .map(|t| (t.name.clone(), t.parameters.clone()))
                .collect();
            self.tool_schemas = Some(Arc::new(schemas));
        }
        let rendered = prompt::render(state, turn).map_err(|mut e| {
            // Tokenizing stops early on a prompt past the context; the
            // error names the field that carried it.
            if e.code == Some("context_length_exceeded") {
                e.param = Some(field.into());
            }
            e
        })?;
        self.generation.prompt = rendered.tokens;
        self.generation.images = rendered.images;
        self.generation.prompt_field = field;
        self.generation.thinks = rendered.reasoning_open;
        self.generation.structural = tools && state.serving.structural_greedy;
        Ok(Output {
            tools,
            reasoning_open: rendered.reasoning_open,
            raw: false,
        })
    }
}

/// What a response carries besides the turn's output.
#[derive(Debug, Clone)]
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub seed: u64,
    pub prompt_tokens: usize,
    pub warnings: Vec<String>,
}

/// An admitted turn, not yet answered.
pub struct Turn {
    pub stream: TurnStream,
    pub head: Head,
    streaming: bool,
}

impl Turn {
    /// Admit `checked.generation` (the route has set its prompt) and start
    /// reading its events. `id_prefix` names the response (`chatcmpl-`).
    pub async fn start(
        state: &SharedState,
        checked: Checked,
        output: Output,
        id_prefix: &str,
    ) -> Result<Turn, ApiError> {
        let profile = if output.raw {
            ds4_text::TextProfile::for_family("")
        } else {
            state.profile
        };
        let memory =
            (state.serving.exact_tool_replay && !output.raw).then(|| state.tool_memory.clone());
        let parser = OutputParser::new(&profile, output.tools, output.reasoning_open)
            .with_tool_schemas(checked.tool_schemas.clone())
            .with_memory(memory);
        let admitted = admit(state, checked.generation).await?;
        Ok(Turn {
            head: Head {
                id: new_id(id_prefix),
                created: unix_now(),
                model: state.config.model_id.clone(),
                seed: admitted.seed,
                prompt_tokens: admitted.prompt_tokens,
                warnings: admitted.warnings,
            },
            stream: TurnStream::new(admitted.events, parser)
                .with_budget(admitted.budget)
                .with_guard(Box::new(admitted.ticket)),
            streaming: checked.stream,
        })
    }

    /// Answer: an SSE stream written by the writer `make` builds, or the
    /// JSON body `complete` builds from the finished turn.
    pub async fn respond<W, T>(
        self,
        state: &AppState,
        make: impl FnOnce(SseSender, Head) -> W,
        complete: impl FnOnce(Head, Finished) -> T,
    ) -> Result<Response, ApiError>
    where
        W: Writer + 'static,
        T: Serialize,
    {
        if self.streaming {
            let (turn, head) = (self.stream, self.head);
            return Ok(sse::respond(state.config.keep_alive, move |tx| {
                let gone = tx.gone();
                drive(turn, make(tx, head), gone)
            }));
        }
        let finished = Finished::run(self.stream).await?;
        Ok(Json(complete(self.head, finished)).into_response())
    }
}

/// A turn run to its end: the collected output and the summary.
#[derive(Debug)]
pub struct Finished {
    pub output: Collected,
    pub summary: TurnSummary,
}

impl Finished {
    pub async fn run(turn: TurnStream) -> Result<Finished, ApiError> {
        let mut output = Collected::run(turn).await.map_err(ApiError::internal)?;
        let summary = output
            .summary
            .take()
            .ok_or_else(|| ApiError::internal("the turn ended without a summary"))?;
        Ok(Finished { output, summary })
    }
}

/// An API's SSE writer: [`Item`]s in, that API's events out. Every method
/// returns false when the client is gone or the stream must end (a failed
/// turn), and [`drive`] then stops, which drops the turn's events and so
/// cancels it in the worker.
pub trait Writer: Send {
    /// What goes out before the first item (`message_start`, a role chunk).
    fn open(&mut self) -> impl Future<Output = bool> + Send;
    fn item(&mut self, item: Item) -> impl Future<Output = bool> + Send;
    /// After the items of one worker event (writers that batch flush here).
    fn batch_end(&mut self) -> impl Future<Output = bool> + Send {
        async { true }
    }
    /// After the turn ended normally (OpenAI's `[DONE]`).
    fn close(self) -> impl Future<Output = ()> + Send;
}

/// Feed a turn's items to `w` until the turn ends or the client leaves
/// (`gone` resolves: the response body was dropped). Leaving drops the
/// turn's stream, which cancels its job at once, waiting or running.
pub async fn drive(mut turn: TurnStream, mut w: impl Writer, gone: impl Future<Output = ()>) {
    if !w.open().await {
        return;
    }
    tokio::pin!(gone);
    loop {
        // A client that leaves while its turn waits in the queue (or in a
        // long prefill) sends nothing: notice it without waiting for the
        // turn's next event.
        let items = tokio::select! {
            items = turn.next() => items,
            () = &mut gone => return,
        };
        let Some(items) = items else { break };
        for item in items {
            if !w.item(item).await {
                return;
            }
        }
        if !w.batch_end().await {
            return;
        }
    }
    w.close().await;
}

/// OpenAI's tools (chat and responses) under its `tool_choice`: `map`
/// turns the i-th declared tool into a function tool (`None`: skipped).
pub fn openai_tools<T>(
    tools: Option<Vec<T>>,
    choice: Option<&Value>,
    map: impl Fn(usize, T) -> Result<Option<FunctionTool>, ApiError>,
) -> Result<Vec<FunctionTool>, ApiError> {
    if !openai_tool_choice(choice)? {
        return Ok(Vec::new());
    }
    tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .filter_map(|(i, t)| map(i, t).transpose())
        .collect()
}

/// OpenAI's `tool_choice`: whether tools are offered (a forced call is
/// the route's constraint: `constraints::forced_call`).
fn openai_tool_choice(choice: Option<&Value>) -> Result<bool, ApiError> {
    Ok(crate::constraints::ToolChoice::openai(choice)?.offers_tools())
}

#[cfg(test)]
pub mod scripted {
    //! Scripted model output through the real stream/writer path, for tests
    //! of each API's parsing and SSE shapes without a model.

    use std::time::Duration;

    use ds4_engine::decode::FinishReason;
    use ds4_text::TextProfile;
    use serde_json::Value;
    use tokio::sync::mpsc;

    use super::{Head, Writer, drive};
    use crate::events::{TokenOut, WorkEvent};
    use crate::output::{OutputParser, TurnStream};
    use crate::summary::TurnSummary;

    pub fn summary(completion_tokens: usize) -> TurnSummary {
        TurnSummary {
            finish_reason: FinishReason::StopToken,
            prompt_tokens: 3,
            completion_tokens,
            cached_tokens: 0,
            stop_token: true,
            stop_sequence: None,
            prefill_tokens: 3,
            prefill: Duration::ZERO,
            decode_tokens: completion_tokens,
            decode: Duration::ZERO,
            first_token: None,
            mtp: None,
        }
    }

    /// The worker's events for `output`, one character per token.
    pub fn events(output: &str, finish: FinishReason) -> mpsc::UnboundedReceiver<WorkEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(WorkEvent::Started { cached_tokens: 0 });
        let mut n = 0;
        for (i, ch) in output.chars().enumerate() {
            let token = TokenOut {
                id: i as u32,
                logprobs: None,
            };
            let _ = tx.send(WorkEvent::Delta {
                text: ch.to_string(),
                token,
            });
            n += 1;
        }
        let _ = tx.send(WorkEvent::Tail(String::new()));
        let mut s = summary(n);
        s.finish_reason = finish;
        let _ = tx.send(WorkEvent::Finished(s));
        rx
    }

    pub fn stream(family: &str, tools: bool, open: bool, output: &str) -> TurnStream {
        let parser = OutputParser::new(&TextProfile::for_family(family), tools, open);
        TurnStream::new(events(output, FinishReason::StopToken), parser)
    }

    pub fn head() -> Head {
        Head {
            id: "id_1".into(),
            created: 0,
            model: "m".into(),
            seed: 7,
            prompt_tokens: 3,
            warnings: Vec::new(),
        }
    }

    /// Run `writer` over `turn` through a real SSE response and parse what
    /// a client would read: (event name, data) pairs, data as JSON (or the
    /// bare string, e.g. `[DONE]`).
    pub async fn sse<W: Writer + 'static>(
        turn: TurnStream,
        make: impl FnOnce(crate::sse::SseSender) -> W,
    ) -> Vec<(Option<String>, Value)> {
        let response = crate::sse::respond(Duration::from_secs(60), move |tx| {
            let gone = tx.gone();
            drive(turn, make(tx), gone)
        });
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("the SSE body");
        let text = String::from_utf8_lossy(&bytes);
        text.split("\n\n")
            .filter_map(|block| {
                let mut event = None;
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event:") {
                        event = Some(e.trim().to_string());
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                    }
                }
                let data = data.join("\n");
                (!data.is_empty()).then(|| {
                    let v = serde_json::from_str(&data).unwrap_or(Value::String(data));
                    (event, v)
                })
            })
            .collect()
    }
}
