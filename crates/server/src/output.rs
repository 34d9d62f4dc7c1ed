//! From the worker's events to what an API reports: reasoning split from
//! the answer and tool calls parsed (per the family's text profile), token
//! by token, plus the turn's end. Streaming writers and the non-streaming
//! collector consume the same [`Item`]s, so both report the same thing.

use ds4_engine::decode::TokenLogprobs;
use ds4_text::{ReasoningSplitter, Split, TextProfile, ToolCallParser, ToolEvent};
use tokio::sync::mpsc;

use crate::ids::new_id;
use crate::worker::{TokenOut, TurnSummary, WorkEvent};

#[derive(Debug, Clone)]
pub enum Item {
    /// The worker picked the job up.
    Started,
    Reasoning(String),
    Text(String),
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        delta: String,
    },
    ToolEnd {
        index: usize,
    },
    /// A generated token (after the text it released).
    Token(TokenOut),
    PromptLogprobs(Vec<Option<TokenLogprobs>>),
    Finished(TurnSummary),
    Failed(String),
}

/// Splits reasoning, then parses tool calls out of the answer.
pub struct OutputParser {
    reasoning: Option<ReasoningSplitter>,
    tools: Option<ToolCallParser>,
    ids: Vec<String>,
}

impl OutputParser {
    /// `tools`: the request offered tools (otherwise tool-like text is text).
    pub fn new(profile: &TextProfile, tools: bool, reasoning_open: bool) -> Self {
        Self {
            reasoning: profile
                .reasoning
                .map(|m| ReasoningSplitter::new(m, reasoning_open)),
            tools: profile
                .tool_calls
                .filter(|_| tools)
                .map(ToolCallParser::new),
            ids: Vec::new(),
        }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<Item>) {
        let splits = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => vec![Split::Text(text.to_string())],
        };
        self.route(splits, out);
    }

    pub fn finish(&mut self, out: &mut Vec<Item>) {
        if let Some(r) = &mut self.reasoning {
            let splits = r.finish();
            self.route(splits, out);
        }
        if let Some(t) = &mut self.tools {
            let events = t.finish();
            self.tool_events(events, out);
        }
    }

    fn route(&mut self, splits: Vec<Split>, out: &mut Vec<Item>) {
        for s in splits {
            match s {
                Split::Reasoning(r) => out.push(Item::Reasoning(r)),
                Split::Text(t) => match &mut self.tools {
                    Some(p) => {
                        let events = p.push(&t);
                        self.tool_events(events, out);
                    }
                    None if !t.is_empty() => out.push(Item::Text(t)),
                    None => {}
                },
            }
        }
    }

    fn tool_events(&mut self, events: Vec<ToolEvent>, out: &mut Vec<Item>) {
        for e in events {
            out.push(match e {
                ToolEvent::Text(t) => Item::Text(t),
                ToolEvent::Start { index, name } => {
                    let id = new_id("call_");
                    self.ids.push(id.clone());
                    Item::ToolStart { index, id, name }
                }
                ToolEvent::Arguments { index, delta } => Item::ToolArgs { index, delta },
                ToolEvent::End { index } => Item::ToolEnd { index },
            });
        }
    }
}

/// A turn's events as [`Item`]s.
pub struct TurnStream {
    events: mpsc::UnboundedReceiver<WorkEvent>,
    parser: OutputParser,
    done: bool,
}

impl TurnStream {
    pub fn new(events: mpsc::UnboundedReceiver<WorkEvent>, parser: OutputParser) -> Self {
        Self {
            events,
            parser,
            done: false,
        }
    }

    /// The next batch of items; `None` after the turn ended.
    pub async fn next(&mut self) -> Option<Vec<Item>> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        match self.events.recv().await {
            Some(WorkEvent::Started { .. }) => out.push(Item::Started),
            Some(WorkEvent::PromptLogprobs(lps)) => out.push(Item::PromptLogprobs(lps)),
            Some(WorkEvent::Delta { text, token }) => {
                self.parser.push(&text, &mut out);
                out.push(Item::Token(token));
            }
            Some(WorkEvent::Tail(text)) => self.parser.push(&text, &mut out),
            Some(WorkEvent::Finished(summary)) => {
                self.parser.finish(&mut out);
                out.push(Item::Finished(summary));
                self.done = true;
            }
            Some(WorkEvent::Failed(message)) => {
                out.push(Item::Failed(message));
                self.done = true;
            }
            None => {
                out.push(Item::Failed("the engine worker stopped".into()));
                self.done = true;
            }
        }
        Some(out)
    }
}

/// Everything a non-streaming response needs.
#[derive(Debug, Default)]
pub struct Collected {
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<CollectedCall>,
    pub tokens: Vec<TokenOut>,
    pub prompt_logprobs: Vec<Option<TokenLogprobs>>,
    pub summary: Option<TurnSummary>,
}

#[derive(Debug, Clone)]
pub struct CollectedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

impl Collected {
    /// Run the turn to its end. Err: the engine failed.
    pub async fn run(mut stream: TurnStream) -> Result<Collected, String> {
        let mut c = Collected::default();
        while let Some(items) = stream.next().await {
            for item in items {
                match item {
                    Item::Started => {}
                    Item::Reasoning(r) => c.reasoning.push_str(&r),
                    Item::Text(t) => c.text.push_str(&t),
                    Item::ToolStart { id, name, .. } => c.tool_calls.push(CollectedCall {
                        id,
                        name,
                        arguments: String::new(),
                    }),
                    Item::ToolArgs { index, delta } => {
                        if let Some(call) = c.tool_calls.get_mut(index) {
                            call.arguments.push_str(&delta);
                        }
                    }
                    // Calls end in order: the one ending is the last started.
                    Item::ToolEnd { index } => debug_assert_eq!(index + 1, c.tool_calls.len()),
                    Item::Token(t) => c.tokens.push(t),
                    Item::PromptLogprobs(l) => c.prompt_logprobs = l,
                    Item::Finished(s) => c.summary = Some(s),
                    Item::Failed(e) => return Err(e),
                }
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::TurnSummary;
    use ds4_engine::decode::FinishReason;
    use std::time::Duration;

    fn summary() -> TurnSummary {
        TurnSummary {
            finish_reason: FinishReason::StopToken,
            prompt_tokens: 3,
            completion_tokens: 9,
            cached_tokens: 0,
            stop_token: true,
            stop_sequence: None,
            prefill_tokens: 3,
            prefill: Duration::ZERO,
            decode_tokens: 8,
            decode: Duration::ZERO,
            first_token: None,
            mtp: None,
        }
    }

    /// Feed a scripted model output one character per token through the
    /// worker's event channel and collect what the API would report.
    async fn scripted(family: &str, tools: bool, open: bool, output: &str) -> Collected {
        let (tx, rx) = mpsc::unbounded_channel();
        for (i, ch) in output.chars().enumerate() {
            let token = TokenOut {
                id: i as u32,
                logprobs: None,
            };
            tx.send(WorkEvent::Delta {
                text: ch.to_string(),
                token,
            })
            .unwrap();
        }
        tx.send(WorkEvent::Tail(String::new())).unwrap();
        tx.send(WorkEvent::Finished(summary())).unwrap();
        let parser = OutputParser::new(&TextProfile::for_family(family), tools, open);
        Collected::run(TurnStream::new(rx, parser)).await.unwrap()
    }

    #[tokio::test]
    async fn qwen_reasoning_and_hermes_calls_streamed_token_by_token() {
        let out = "<think>\nThe user wants weather.\n</think>\n\nChecking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let c = scripted("qwen4_exp", true, false, out).await;
        assert_eq!(c.reasoning, "\nThe user wants weather.\n");
        assert_eq!(c.text, "Checking.");
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!(c.tool_calls[0].name, "get_weather");
        assert_eq!(c.tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
        assert!(c.tool_calls[0].id.starts_with("call_"));
        // The template opened the block: output starts inside reasoning.
        let c = scripted("qwen4_exp", false, true, "hmm</think>Hi").await;
        assert_eq!((c.reasoning.as_str(), c.text.as_str()), ("hmm", "Hi"));
    }

    #[tokio::test]
    async fn llama_json_calls_only_when_tools_were_offered() {
        let out = "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}";
        let c = scripted("llama", true, false, out).await;
        assert_eq!(c.text, "");
        assert_eq!(c.tool_calls[0].name, "add");
        assert_eq!(c.tool_calls[0].arguments, "{\"a\": 1, \"b\": 2}");
        let c = scripted("llama", false, false, out).await;
        assert_eq!(c.text, out);
        assert!(c.tool_calls.is_empty() && c.reasoning.is_empty());
    }
}
