//! From the worker's events to what an API reports: reasoning split from
//! the answer and tool calls parsed (per the family's text profile), token
//! by token, plus the turn's end. Streaming writers and the non-streaming
//! collector consume the same [`Item`]s, so both report the same thing.

use ds4_engine::decode::{FinishReason, TokenLogprobs};
use std::sync::Arc;

use ds4_text::{ReasoningSplitter, Split, TextProfile, ToolCallParser, ToolEvent, ToolSchemas};
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::events::{TokenOut, WorkEvent};
use crate::ids::new_id;
use crate::summary::TurnSummary;
use crate::tool_memory::ToolMemory;

/// How the turn's text is read: tools offered, and whether the template
/// opened the reasoning block.
#[derive(Debug, Clone, Copy, Default)]
pub struct Output {
    pub tools: bool,
    pub reasoning_open: bool,
    /// Plain text (no reasoning split, no tool calls): `/v1/completions`.
    pub raw: bool,
}

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
    format: Option<ds4_text::ToolCallFormat>,
    ids: Vec<String>,
    /// Where sampled tool-call blocks are remembered under their call ids
    /// (families with exact replay).
    memory: Option<ToolMemory>,
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
            format: profile.tool_calls.filter(|_| tools),
            ids: Vec::new(),
            memory: None,
        }
    }

    /// Type tool-call values by the offered tools' schemas (Qwen3.5's XML
    /// calls write every value as text). Before any output.
    pub fn with_tool_schemas(mut self, schemas: Option<Arc<ToolSchemas>>) -> Self {
        if let Some(format) = self.format {
            self.tools = Some(ToolCallParser::with_schemas(format, schemas));
        }
        self
    }

    /// Remember each sampled tool-call block in `memory` under the ids the
    /// client receives for its calls.
    pub fn with_memory(mut self, memory: Option<ToolMemory>) -> Self {
        self.memory = memory;
        self
    }

    /// Inside an open reasoning block (the model has not closed it yet).
    pub fn in_reasoning(&self) -> bool {
        self.reasoning
            .as_ref()
            .is_some_and(ReasoningSplitter::in_reasoning)
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
                ToolEvent::Block { calls, raw } => {
                    if let (Some(memory), Some(ids)) = (&self.memory, self.ids.get(calls)) {
                        memory.remember(ids, &raw);
                    }
                    continue;
                }
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

/// A reasoning budget (Anthropic `thinking.budget_tokens`). The engine's
/// token callback can stop a turn but not force tokens, so the budget is
/// kept in two jobs: the first is limited to `tokens`; when it used them
/// all with the reasoning block still open, the block is closed by
/// appending the family's closing marker to what was generated, and a
/// second job continues from there with what is left of `max_tokens`. The
/// live session covers the first job's tokens exactly, so the second only
/// prefills the marker. What the client sees is one turn: one reasoning
/// block, closed, then the answer; usage counts the marker as output.
pub struct Budget {
    pub tokens: usize,
    /// The whole turn's limit (already clamped to the context).
    pub max_tokens: usize,
    pub prompt: Vec<u32>,
    /// The closing marker as text (what the parser sees) and as tokens
    /// (what the model sees).
    pub close: String,
    pub close_ids: Vec<u32>,
    /// Queue the continuation: (prompt, max_tokens) → its events.
    pub resubmit: Resubmit,
}

/// How a budgeted turn queues its continuation.
pub type Resubmit = Box<
    dyn FnOnce(
            Vec<u32>,
            usize,
        ) -> BoxFuture<'static, Result<mpsc::UnboundedReceiver<WorkEvent>, String>>
        + Send,
>;

/// The first job of a budgeted turn, once it has ended.
struct Carried {
    summary: TurnSummary,
    injected: usize,
}

/// A turn's events as [`Item`]s.
pub struct TurnStream {
    events: mpsc::UnboundedReceiver<WorkEvent>,
    parser: OutputParser,
    done: bool,
    budget: Option<Budget>,
    /// The tokens generated so far (kept only under a budget).
    generated: Vec<u32>,
    carried: Option<Carried>,
    /// Dropped with the stream: cancels the turn's jobs if the client
    /// leaves before the end (`admission::Ticket`).
    _guard: Option<Box<dyn Send>>,
}

impl TurnStream {
    pub fn new(events: mpsc::UnboundedReceiver<WorkEvent>, parser: OutputParser) -> Self {
        Self {
            events,
            parser,
            done: false,
            budget: None,
            generated: Vec::new(),
            carried: None,
            _guard: None,
        }
    }

    pub fn with_guard(mut self, guard: Box<dyn Send>) -> Self {
        self._guard = Some(guard);
        self
    }

    pub fn with_budget(mut self, budget: Option<Budget>) -> Self {
        self.budget = budget;
        self
    }

    /// The next batch of items; `None` after the turn ended.
    pub async fn next(&mut self) -> Option<Vec<Item>> {
        if self.done {
            return None;
        }
        let mut out = Vec::new();
        match self.events.recv().await {
            // A continuation's start is not a new turn.
            Some(WorkEvent::Started { .. }) if self.carried.is_some() => {}
            Some(WorkEvent::Started { .. }) => out.push(Item::Started),
            Some(WorkEvent::PromptLogprobs(lps)) => out.push(Item::PromptLogprobs(lps)),
            Some(WorkEvent::Delta { text, token }) => {
                if self.budget.is_some() {
                    self.generated.push(token.id);
                }
                self.parser.push(&text, &mut out);
                out.push(Item::Token(token));
            }
            Some(WorkEvent::Tail(text)) => self.parser.push(&text, &mut out),
            Some(WorkEvent::Finished(summary)) => {
                if let Some(budget) = self.budget.take() {
                    return Some(match self.continue_past(budget, summary, &mut out).await {
                        None => out,
                        Some(summary) => self.finish(summary, out),
                    });
                }
                let summary = match self.carried.take() {
                    Some(first) => merge(first, summary),
                    None => summary,
                };
                return Some(self.finish(summary, out));
            }
            Some(WorkEvent::Failed(message)) => {
                out.push(Item::Failed(message));
                self.done = true;
            }
            None => {
                out.push(Item::Failed(
                    "the server stopped before the turn ended".into(),
                ));
                self.done = true;
            }
        }
        Some(out)
    }

    fn finish(&mut self, summary: TurnSummary, mut out: Vec<Item>) -> Vec<Item> {
        self.parser.finish(&mut out);
        out.push(Item::Finished(summary));
        self.done = true;
        out
    }

    /// The first job of a budgeted turn ended: queue the continuation when
    /// it stopped at the budget with room left, closing the reasoning if it
    /// is still open. Some: the turn is over (with this summary).
    async fn continue_past(
        &mut self,
        budget: Budget,
        summary: TurnSummary,
        out: &mut Vec<Item>,
    ) -> Option<TurnSummary> {
        let at_budget = matches!(summary.finish_reason, FinishReason::MaxTokens)
            && summary.completion_tokens >= budget.tokens;
        let left = budget.max_tokens.saturating_sub(summary.completion_tokens);
        let close = if self.parser.in_reasoning() {
            budget.close_ids.as_slice()
        } else {
            &[]
        };
        // At least one token must be left to generate after the marker.
        if !at_budget || left <= close.len() {
            return Some(summary);
        }
        let mut prompt = budget.prompt;
        prompt.extend_from_slice(&self.generated);
        prompt.extend_from_slice(close);
        let injected = close.len();
        match (budget.resubmit)(prompt, left - injected).await {
            Ok(events) => {
                if injected > 0 {
                    self.parser.push(&budget.close, out);
                }
                self.events = events;
                self.carried = Some(Carried { summary, injected });
                None
            }
            Err(message) => {
                out.push(Item::Failed(format!(
                    "could not continue after the reasoning budget: {message}"
                )));
                self.done = true;
                None
            }
        }
    }
}

/// One summary for a turn that ran as two jobs (see [`Budget`]).
fn merge(first: Carried, second: TurnSummary) -> TurnSummary {
    let a = first.summary;
    TurnSummary {
        finish_reason: second.finish_reason,
        prompt_tokens: a.prompt_tokens,
        completion_tokens: a.completion_tokens + first.injected + second.completion_tokens,
        cached_tokens: a.cached_tokens,
        stop_token: second.stop_token,
        stop_sequence: second.stop_sequence,
        prefill_tokens: a.prefill_tokens + second.prefill_tokens,
        prefill: a.prefill + second.prefill,
        decode_tokens: a.decode_tokens + second.decode_tokens,
        decode: a.decode + second.decode,
        first_token: a.first_token,
        mtp: second.mtp.or(a.mtp),
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
    use crate::request::scripted;

    /// Feed a scripted model output one character per token through the
    /// worker's event channel and collect what the API would report.
    async fn scripted(family: &str, tools: bool, open: bool, output: &str) -> Collected {
        Collected::run(scripted::stream(family, tools, open, output))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn qwen_reasoning_and_xml_calls_streamed_token_by_token() {
        let out = "<think>\nThe user wants weather.\n</think>\n\nChecking.<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
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

    /// A budgeted turn whose continuation is scripted too: the first job
    /// writes `first` and stops at the budget, the second writes `second`.
    /// Returns what the client sees and the continuation's prompt.
    async fn budgeted(
        open: bool,
        first: &str,
        second: &str,
        max_tokens: usize,
    ) -> (Collected, Option<(Vec<u32>, usize)>) {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = asked.clone();
        let second = second.to_string();
        let budget = Budget {
            tokens: first.chars().count(),
            max_tokens,
            prompt: vec![100, 101],
            close: "</think>\n\n".into(),
            close_ids: vec![900, 901],
            resubmit: Box::new(move |prompt, max| {
                *seen.lock().unwrap() = Some((prompt, max));
                let events = scripted::events(&second, FinishReason::StopToken);
                Box::pin(async move { Ok(events) })
            }),
        };
        let parser = OutputParser::new(&TextProfile::for_family("qwen4_exp"), false, open);
        let stream = TurnStream::new(scripted::events(first, FinishReason::MaxTokens), parser)
            .with_budget(Some(budget));
        let c = Collected::run(stream).await.unwrap();
        let asked = asked.lock().unwrap().take();
        (c, asked)
    }

    #[tokio::test]
    async fn reasoning_budget_closes_the_block_and_continues() {
        // Still reasoning when the budget (6 tokens) is spent: the marker is
        // appended for the model and the answer follows in the same turn.
        let (c, asked) = budgeted(true, "abcdef", "Answer.", 20).await;
        assert_eq!(c.reasoning, "abcdef");
        assert_eq!(c.text, "Answer.");
        let (prompt, max) = asked.expect("a continuation");
        assert_eq!(prompt, [100, 101, 0, 1, 2, 3, 4, 5, 900, 901]);
        assert_eq!(max, 20 - 6 - 2);
        let s = c.summary.unwrap();
        assert_eq!(s.completion_tokens, 6 + 2 + 7);
        assert_eq!(s.prompt_tokens, 3);
        assert!(matches!(s.finish_reason, FinishReason::StopToken));

        // The model closed its reasoning within the budget: nothing is
        // injected, the turn just continues.
        let (c, asked) = budgeted(false, "<think>a</think>Hi", " there", 40).await;
        assert_eq!((c.reasoning.as_str(), c.text.as_str()), ("a", "Hi there"));
        let (prompt, max) = asked.unwrap();
        assert_eq!(prompt.len(), 2 + 18);
        assert_eq!(max, 40 - 18);

        // No room after the marker: the turn ends at the budget.
        let (c, asked) = budgeted(true, "abcdef", "never", 8).await;
        assert!(asked.is_none());
        assert_eq!(c.reasoning, "abcdef");
        assert!(matches!(
            c.summary.unwrap().finish_reason,
            FinishReason::MaxTokens
        ));
    }
}
