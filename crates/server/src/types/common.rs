//! Types several OpenAI endpoints share: usage, logprobs, models.

use ds4_engine::decode::{CallerStop, FinishReason, TokenLogprobs};
use ds4_text::Tokenizer;
use serde::Serialize;
use utoipa::ToSchema;

use crate::summary::TurnSummary;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Extension: the seed the sampler used (send it back to replay).
    pub seed: u64,
    /// Extension: where the time went.
    pub timings: Timings,
    /// Extension: speculative decoding statistics (null for AR turns).
    pub mtp: Option<MtpUsage>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MtpUsage {
    pub depth: usize,
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub acceptance_rate: f64,
}

impl MtpUsage {
    pub fn of(s: &TurnSummary) -> Option<Self> {
        s.mtp.as_ref().map(|m| Self {
            depth: m.depth,
            drafted_tokens: m.drafted_total(),
            accepted_tokens: m.accepted_total(),
            acceptance_rate: m.acceptance_rate(),
        })
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens reused from the live session instead of prefilled.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Timings {
    pub prefill_tokens: usize,
    pub prefill_ms: f64,
    pub decode_tokens: usize,
    pub decode_ms: f64,
    /// From the start of the turn to the first token.
    pub first_token_ms: Option<f64>,
}

impl Timings {
    pub fn of(s: &TurnSummary) -> Self {
        Self {
            prefill_tokens: s.prefill_tokens,
            prefill_ms: s.prefill.as_secs_f64() * 1e3,
            decode_tokens: s.decode_tokens,
            decode_ms: s.decode.as_secs_f64() * 1e3,
            first_token_ms: s.first_token.map(|d| d.as_secs_f64() * 1e3),
        }
    }
}

impl Usage {
    pub fn of(s: &TurnSummary, seed: u64) -> Self {
        Self {
            prompt_tokens: s.prompt_tokens,
            completion_tokens: s.completion_tokens,
            total_tokens: s.prompt_tokens + s.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: s.cached_tokens,
            },
            seed,
            timings: Timings::of(s),
            mtp: MtpUsage::of(s),
        }
    }
}

/// OpenAI's finish reason: `tool_calls` when the reply called tools, unless
/// the token limit cut it (then the last call may be incomplete, and
/// `length` says so, as OpenAI does).
pub fn finish_reason(s: &TurnSummary, tool_calls: bool) -> &'static str {
    match s.finish_reason {
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
        _ if tool_calls => "tool_calls",
        FinishReason::StopToken | FinishReason::Caller(CallerStop::StopString) => "stop",
        FinishReason::Caller(CallerStop::Cancelled) => "stop",
        // The request's grammar admits no token at this point: the reply
        // ended there rather than loop (an extension value).
        FinishReason::NoAllowedToken => "no_allowed_token",
    }
}

/// One token's logprob in the chat shape.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// The text of one token (special tokens included, as the API shows them).
pub fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// Logprobs may be -inf for a masked token; JSON has no infinity, so report
/// the most negative finite value as OpenAI does (-9999.0).
fn finite(x: f32) -> f32 {
    if x.is_finite() { x } else { -9999.0 }
}

impl LogprobEntry {
    pub fn of(tokenizer: &Tokenizer, lp: &TokenLogprobs) -> Self {
        let token = token_text(tokenizer, lp.token);
        Self {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob: finite(lp.logprob),
            top_logprobs: lp
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let token = token_text(tokenizer, id);
                    TopLogprob {
                        bytes: token.as_bytes().to_vec(),
                        token,
                        logprob: finite(logprob),
                    }
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Extension: the context window in tokens.
    pub context_length: usize,
    /// Extension: the model family.
    pub family: &'static str,
    /// Extension: the backend and kernels the model runs on (`cpu-avx512`,
    /// `cpu-avx512-fast` for the fast CPU kernel set, `cuda-sm_90a`).
    pub backend: String,
    /// Extension: the kernel set of the model's products: `reference` (f32
    /// activations, exact dequantized products) or `fast` (int8
    /// activations, integer dot products).
    pub kernel_set: &'static str,
    /// Extension: the KV cache element type (`f32`, or `f16` rows: the
    /// CPU fast set's default for llama models).
    pub kv_cache: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}
