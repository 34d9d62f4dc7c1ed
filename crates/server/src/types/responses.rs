//! `POST /v1/responses` (OpenAI Responses, as Codex uses it).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: ResponseInput,
    pub instructions: Option<String>,
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<u64>,
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f64>,
    pub seed: Option<u64>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<ResponseTool>>,
    pub tool_choice: Option<Value>,
    pub reasoning: Option<ReasoningConfig>,
    /// Stored conversations are not kept; a request must carry its input.
    pub previous_response_id: Option<String>,
    pub mtp_depth: Option<u64>,
    /// `{"format": {"type": "text" | "json_object"}}` or `{"format":
    /// {"type": "json_schema", "name", "schema", "strict"}}`: the reply is
    /// constrained to JSON (valid against the schema).
    #[schema(value_type = Option<Object>)]
    pub text: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<InputItem>),
}

/// An input item. One struct for every item type (`type` says which
/// fields apply; a missing `type` with a `role` is a message).
#[derive(Debug, Deserialize, ToSchema)]
pub struct InputItem {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub role: Option<String>,
    pub content: Option<Value>,
    pub call_id: Option<String>,
    pub name: Option<String>,
    pub arguments: Option<String>,
    /// `function_call_output`: a string, or an array of content items
    /// (`input_text`; images are refused).
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ResponseTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    #[schema(value_type = Option<Object>)]
    pub incomplete_details: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub model: String,
    #[schema(value_type = Vec<Object>)]
    pub output: Vec<Value>,
    pub usage: Option<ResponseUsage>,
    pub parallel_tool_calls: bool,
    pub tool_choice: &'static str,
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    /// The request's `text` (its output format), `{"format": {"type":
    /// "text"}}` when it sent none, as OpenAI echoes it.
    #[schema(value_type = Object)]
    pub text: Value,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
    /// Extension: the sampler's seed.
    pub seed: u64,
}

impl ResponseUsage {
    pub fn of(s: &crate::summary::TurnSummary, seed: u64) -> Self {
        Self {
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
        }
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InputTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: usize,
}
