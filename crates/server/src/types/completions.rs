//! `POST /v1/completions` (OpenAI legacy completions).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::chat::StreamOptions;
use super::common::Usage;
use crate::params::StopField;

#[derive(Debug, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// Default 16, as in OpenAI's API.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u64>,
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f64>,
    #[schema(minimum = -2, maximum = 2)]
    pub presence_penalty: Option<f64>,
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f64>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Log-probabilities with this many alternatives (0-5).
    #[schema(maximum = 5)]
    pub logprobs: Option<u64>,
    /// Return the prompt before the completion (with `logprobs`, the prompt
    /// tokens' logprobs too).
    pub echo: Option<bool>,
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u64>,
    #[schema(minimum = 1, maximum = 1)]
    pub best_of: Option<u64>,
    #[schema(max_length = 0)]
    pub suffix: Option<String>,
    pub mtp_depth: Option<u64>,
    /// Extension: constrain the completion to a grammar: `{"type": "lark" |
    /// "regex" | "json_schema", "value": …}` (a bare string is Lark, in
    /// llguidance's dialect).
    #[schema(value_type = Option<Object>)]
    pub grammar: Option<serde_json::Value>,
    /// `{"type": "json_object" | "json_schema", …}` as in chat (vLLM
    /// accepts it here too).
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<serde_json::Value>,
}

/// Text, token ids, or a one-element batch of either.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    TextBatch(Vec<String>),
    TokenBatch(Vec<Vec<u32>>),
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub text: String,
    pub index: usize,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// The legacy logprobs shape: parallel arrays.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    /// `null` for the first prompt token (nothing predicts it).
    pub token_logprobs: Vec<Option<f32>>,
    #[schema(value_type = Vec<Object>)]
    pub top_logprobs: Vec<Option<serde_json::Map<String, serde_json::Value>>>,
    pub text_offset: Vec<usize>,
}
