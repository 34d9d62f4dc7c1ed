//! `POST /v1/completions`: a raw prompt (text or token ids), no template.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use ds4_engine::decode::TokenLogprobs;
use ds4_text::Tokenizer;
use serde_json::json;

use crate::constraints;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::output::{Item, Output};
use crate::params::{self, SamplingFields};
use crate::request::{Common, Finished, Head, Turn, Writer};
use crate::sse::SseSender;
use crate::state::{AppState, SharedState};
use crate::types::common::{Usage, finish_reason, token_text};
use crate::types::completions::*;

#[utoipa::path(
    post,
    path = "/v1/completions",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "A completion, or an SSE stream of completion chunks", body = Completion),
        (status = 400, description = "Invalid request"),
    )
)]
pub async fn completions(
    State(state): State<SharedState>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    state.metrics.request("completions");
    let include_usage = req
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
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
        max_tokens: ("max_tokens", Some(req.max_tokens.unwrap_or(16))),
        stop: ("stop", req.stop),
        n: req.n,
        mtp_depth: req.mtp_depth,
        stream: req.stream,
    }
    .check(&state)?;
    params::n(req.best_of).map_err(|_| ApiError::invalid("best_of", "best_of must be 1"))?;
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(
            "suffix",
            "suffix (fill-in-the-middle) is not supported",
        ));
    }
    let logprobs = match req.logprobs {
        Some(k) if k > 5 => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("logprobs = {k} is out of range: at most 5"),
            ));
        }
        other => other.map(|k| k as usize),
    };
    let echo = req.echo.unwrap_or(false);
    let prompt = prompt_tokens(&state, req.prompt)?;
    let prompt_text = state
        .tokenizer
        .decode(&prompt, false)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let g = &mut checked.generation;
    g.prompt = prompt.clone();
    g.prompt_field = "prompt";
    g.logprobs = logprobs;
    g.prompt_logprobs = logprobs.filter(|_| echo);
    let output = Output {
        raw: true,
        ..Output::default()
    };
    let requested = constraints::one_of(vec![
        constraints::response_format(req.response_format.as_ref())?,
        constraints::grammar_field(req.grammar.as_ref())?,
    ])?;
    checked.generation.constraint = constraints::compile(&state, requested, output)?;
    let turn = Turn::start(&state, checked, output, "cmpl-").await?;
    let echo = Echo {
        text: echo.then_some(prompt_text),
        prompt,
    };
    let tokenizer = state.tokenizer.clone();
    let echo_json = echo.clone();
    turn.respond(
        &state,
        |tx, head| ChunkWriter {
            tx,
            head,
            echo,
            include_usage,
            stops: tokenizer.stop_token_ids().to_vec(),
            tokenizer,
            offset: 0,
            text: String::new(),
            lps: None,
        },
        |head, done| complete(&state, head, echo_json, done),
    )
    .await
}

/// The prompt as token ids: text is tokenized as transformers' `encode`
/// does (BOS when the tokenizer asks for it); ids are checked against the
/// vocabulary.
fn prompt_tokens(state: &AppState, prompt: PromptInput) -> Result<Vec<u32>, ApiError> {
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid(
                "prompt",
                format!("prompt: batches of {n} prompts are not supported (send one)"),
            ))
        }
    };
    let ids = match prompt {
        PromptInput::Text(t) => return encode(state, &t),
        PromptInput::TextBatch(mut v) => {
            one(v.len())?;
            return encode(state, &v.remove(0));
        }
        PromptInput::Tokens(ids) => ids,
        PromptInput::TokenBatch(mut v) => {
            one(v.len())?;
            v.remove(0)
        }
    };
    let vocab = state.tokenizer.vocab_size();
    if let Some((i, id)) = ids
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= vocab)
    {
        return Err(ApiError::invalid(
            format!("prompt[{i}]"),
            format!("prompt[{i}] = {id} is not a token id (the vocabulary has {vocab})"),
        ));
    }
    Ok(ids)
}

fn encode(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state.encode_prompt(text)
}

/// The prompt, echoed when the request asked for it.
#[derive(Clone)]
struct Echo {
    text: Option<String>,
    prompt: Vec<u32>,
}

/// Legacy logprobs for `tokens`, continuing at `offset` in the text.
fn legacy_logprobs(
    tokenizer: &Tokenizer,
    out: &mut CompletionLogprobs,
    entries: impl Iterator<Item = (u32, Option<TokenLogprobs>)>,
    offset: &mut usize,
) {
    for (id, lp) in entries {
        let text = token_text(tokenizer, id);
        out.text_offset.push(*offset);
        *offset += text.len();
        out.tokens.push(text);
        out.token_logprobs
            .push(lp.as_ref().map(|l| finite(l.logprob)));
        out.top_logprobs.push(lp.map(|l| {
            l.top
                .iter()
                .map(|&(t, x)| (token_text(tokenizer, t), json!(finite(x))))
                .collect()
        }));
    }
}

fn finite(x: f32) -> f32 {
    if x.is_finite() { x } else { -9999.0 }
}

fn complete(state: &AppState, head: Head, echo: Echo, done: Finished) -> Completion {
    let Finished { output: c, summary } = done;
    let stops = state.tokenizer.stop_token_ids();
    let logprobs = c.tokens.iter().any(|t| t.logprobs.is_some()).then(|| {
        let mut out = CompletionLogprobs::default();
        let mut offset = 0;
        if echo.text.is_some() {
            let prompt_lps = c
                .prompt_logprobs
                .iter()
                .cloned()
                .chain(std::iter::repeat(None));
            legacy_logprobs(
                &state.tokenizer,
                &mut out,
                echo.prompt.iter().copied().zip(prompt_lps),
                &mut offset,
            );
        }
        let generated = c
            .tokens
            .iter()
            .filter(|t| !stops.contains(&t.id))
            .map(|t| (t.id, t.logprobs.clone()));
        legacy_logprobs(&state.tokenizer, &mut out, generated, &mut offset);
        out
    });
    let text = match echo.text {
        Some(p) => p + &c.text,
        None => c.text,
    };
    Completion {
        id: head.id,
        object: "text_completion",
        created: head.created,
        model: head.model,
        choices: vec![CompletionChoice {
            text,
            index: 0,
            logprobs,
            finish_reason: Some(finish_reason(&summary, false)),
        }],
        usage: Some(Usage::of(&summary, head.seed)),
        warnings: head.warnings,
    }
}

/// Completion chunks: the text and logprobs of one worker event per chunk.
struct ChunkWriter {
    tx: SseSender,
    head: Head,
    echo: Echo,
    include_usage: bool,
    tokenizer: Arc<Tokenizer>,
    stops: Vec<u32>,
    offset: usize,
    text: String,
    lps: Option<CompletionLogprobs>,
}

impl ChunkWriter {
    fn chunk(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> Completion {
        Completion {
            id: self.head.id.clone(),
            object: "text_completion",
            created: self.head.created,
            model: self.head.model.clone(),
            choices: vec![CompletionChoice {
                text,
                index: 0,
                logprobs,
                finish_reason: finish,
            }],
            usage: None,
            warnings: Vec::new(),
        }
    }

    /// Pending text and logprobs as one chunk.
    async fn flush(&mut self) -> bool {
        if self.text.is_empty() && self.lps.is_none() {
            return true;
        }
        let (text, lps) = (std::mem::take(&mut self.text), self.lps.take());
        let c = self.chunk(text, lps, None);
        self.tx.json(None, &c).await
    }
}

impl Writer for ChunkWriter {
    async fn open(&mut self) -> bool {
        let mut first = self.chunk(self.echo.text.clone().unwrap_or_default(), None, None);
        first.warnings = self.head.warnings.clone();
        self.tx.json(None, &first).await
    }

    async fn item(&mut self, item: Item) -> bool {
        match item {
            Item::Text(t) | Item::Reasoning(t) => self.text.push_str(&t),
            Item::Token(t) if t.logprobs.is_some() && !self.stops.contains(&t.id) => {
                let out = self.lps.get_or_insert_with(CompletionLogprobs::default);
                legacy_logprobs(
                    &self.tokenizer,
                    out,
                    std::iter::once((t.id, t.logprobs)),
                    &mut self.offset,
                );
            }
            Item::PromptLogprobs(p) => {
                let mut out = CompletionLogprobs::default();
                let entries = self
                    .echo
                    .prompt
                    .iter()
                    .copied()
                    .zip(p.into_iter().chain(std::iter::repeat(None)));
                legacy_logprobs(&self.tokenizer, &mut out, entries, &mut self.offset);
                let c = self.chunk(String::new(), Some(out), None);
                return self.tx.json(None, &c).await;
            }
            Item::Finished(summary) => {
                if !self.flush().await {
                    return false;
                }
                let c = self.chunk(String::new(), None, Some(finish_reason(&summary, false)));
                if !self.tx.json(None, &c).await {
                    return false;
                }
                if self.include_usage {
                    let mut last = self.chunk(String::new(), None, None);
                    last.choices.clear();
                    last.usage = Some(Usage::of(&summary, self.head.seed));
                    return self.tx.json(None, &last).await;
                }
            }
            Item::Failed(message) => {
                let _ = self.tx.error(&ApiError::internal(message)).await;
                return false;
            }
            _ => {}
        }
        true
    }

    async fn batch_end(&mut self) -> bool {
        self.flush().await
    }

    async fn close(self) {
        let _ = self.tx.done().await;
    }
}
