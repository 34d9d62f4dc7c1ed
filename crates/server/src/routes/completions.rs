//! `POST /v1/completions`: a raw prompt (text or token ids), no template.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use ds4_engine::decode::TokenLogprobs;
use ds4_text::Tokenizer;
use serde_json::json;

use crate::admission::{Generation, admit};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::ids::{new_id, unix_now};
use crate::output::{Collected, Item, OutputParser, TurnStream};
use crate::params::{self, SamplingFields};
use crate::sse::{self, SseSender};
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
    state.check_model(req.model.as_deref())?;
    params::n(req.n)?;
    params::n(req.best_of).map_err(|_| ApiError::invalid("best_of", "best_of must be 1"))?;
    let mtp_depth = params::mtp_depth(state.mtp, req.mtp_depth)?;
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
    let sampling = SamplingFields {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        min_p: req.min_p,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
    }
    .validate()?;
    let max_tokens = params::max_tokens("max_tokens", Some(req.max_tokens.unwrap_or(16)))?;
    let prompt_text = state
        .tokenizer
        .decode(&prompt, false)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let admitted = admit(
        &state,
        Generation {
            prompt: prompt.clone(),
            prompt_field: "prompt",
            sampling,
            seed: req.seed,
            max_tokens,
            stops: params::stops("stop", req.stop)?,
            logprobs,
            prompt_logprobs: logprobs.filter(|_| echo),
            mtp_depth,
            warnings: Vec::new(),
        },
    )?;
    let turn = TurnStream::new(
        admitted.events,
        OutputParser::new(&ds4_text::TextProfile::for_family(""), false, false),
    );
    let head = Head {
        id: new_id("cmpl-"),
        created: unix_now(),
        model: state.config.model_id.clone(),
        seed: admitted.seed,
        warnings: admitted.warnings,
        echo: echo.then_some(prompt_text),
        prompt,
    };
    if req.stream.unwrap_or(false) {
        let include_usage = req
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        let tokenizer = state.tokenizer.clone();
        return Ok(sse::respond(state.config.keep_alive, move |tx| {
            stream(tx, turn, head, include_usage, tokenizer)
        }));
    }
    let c = Collected::run(turn).await.map_err(ApiError::internal)?;
    Ok(Json(complete(&state, head, c)?).into_response())
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
    state
        .tokenizer
        .encode_prompt(text)
        .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))
}

struct Head {
    id: String,
    created: u64,
    model: String,
    seed: u64,
    warnings: Vec<String>,
    echo: Option<String>,
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

fn complete(state: &AppState, head: Head, c: Collected) -> Result<Completion, ApiError> {
    let summary = c
        .summary
        .ok_or_else(|| ApiError::internal("the turn ended without a summary"))?;
    let stops = state.tokenizer.stop_token_ids();
    let logprobs = c.tokens.iter().any(|t| t.logprobs.is_some()).then(|| {
        let mut out = CompletionLogprobs::default();
        let mut offset = 0;
        if head.echo.is_some() {
            let prompt_lps = c
                .prompt_logprobs
                .iter()
                .cloned()
                .chain(std::iter::repeat(None));
            legacy_logprobs(
                &state.tokenizer,
                &mut out,
                head.prompt.iter().copied().zip(prompt_lps),
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
    let text = match head.echo {
        Some(p) => p + &c.text,
        None => c.text,
    };
    Ok(Completion {
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
    })
}

async fn stream(
    tx: SseSender,
    mut turn: TurnStream,
    head: Head,
    include_usage: bool,
    tokenizer: Arc<Tokenizer>,
) {
    let chunk =
        |text: String, logprobs: Option<CompletionLogprobs>, finish: Option<&'static str>| {
            Completion {
                id: head.id.clone(),
                object: "text_completion",
                created: head.created,
                model: head.model.clone(),
                choices: vec![CompletionChoice {
                    text,
                    index: 0,
                    logprobs,
                    finish_reason: finish,
                }],
                usage: None,
                warnings: Vec::new(),
            }
        };
    let mut offset = 0;
    let mut first = chunk(head.echo.clone().unwrap_or_default(), None, None);
    first.warnings = head.warnings.clone();
    if !tx.json(None, &first).await {
        return;
    }
    let stops = tokenizer.stop_token_ids().to_vec();
    while let Some(items) = turn.next().await {
        let mut text = String::new();
        let mut lps: Option<CompletionLogprobs> = None;
        for item in items {
            match item {
                Item::Text(t) | Item::Reasoning(t) => text.push_str(&t),
                Item::Token(t) if t.logprobs.is_some() && !stops.contains(&t.id) => {
                    let out = lps.get_or_insert_with(CompletionLogprobs::default);
                    legacy_logprobs(
                        &tokenizer,
                        out,
                        std::iter::once((t.id, t.logprobs)),
                        &mut offset,
                    );
                }
                Item::PromptLogprobs(p) => {
                    let mut out = CompletionLogprobs::default();
                    let entries = head
                        .prompt
                        .iter()
                        .copied()
                        .zip(p.into_iter().chain(std::iter::repeat(None)));
                    legacy_logprobs(&tokenizer, &mut out, entries, &mut offset);
                    if !tx.json(None, &chunk(String::new(), Some(out), None)).await {
                        return;
                    }
                }
                Item::Finished(summary) => {
                    if (!text.is_empty() || lps.is_some())
                        && !tx
                            .json(None, &chunk(std::mem::take(&mut text), lps.take(), None))
                            .await
                    {
                        return;
                    }
                    if !tx
                        .json(
                            None,
                            &chunk(String::new(), None, Some(finish_reason(&summary, false))),
                        )
                        .await
                    {
                        return;
                    }
                    if include_usage {
                        let mut last = chunk(String::new(), None, None);
                        last.choices.clear();
                        last.usage = Some(Usage::of(&summary, head.seed));
                        if !tx.json(None, &last).await {
                            return;
                        }
                    }
                }
                Item::Failed(message) => {
                    let _ = tx.error(&ApiError::internal(message)).await;
                    return;
                }
                _ => {}
            }
        }
        if (!text.is_empty() || lps.is_some()) && !tx.json(None, &chunk(text, lps, None)).await {
            return;
        }
    }
    let _ = tx.done().await;
}
