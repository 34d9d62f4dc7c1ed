//! `POST /v1/messages` and `/v1/messages/count_tokens` (Anthropic Messages).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct MessagesRequest {
    pub model: Option<String>,
    #[schema(min_items = 1)]
    pub messages: Vec<InputMessage>,
    pub system: Option<SystemPrompt>,
    /// Required by `/v1/messages` (not by `count_tokens`).
    #[schema(minimum = 1)]
    pub max_tokens: Option<u64>,
    #[schema(minimum = 0, maximum = 1)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    pub stop_sequences: Option<Vec<String>>,
    pub stream: Option<bool>,
    pub tools: Option<Vec<AnthropicTool>>,
    pub tool_choice: Option<Value>,
    pub thinking: Option<Thinking>,
    /// `output_config.effort` (`deepseek_v4`, as ds4: `max` asks for Think
    /// Max); other families ignore it.
    pub output_config: Option<OutputConfig>,
    /// Extension: the sampler's seed (reported back in `usage.seed`).
    pub seed: Option<u64>,
    /// Extension; only families whose law has min_p use it.
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f64>,
    /// Extension: MTP draft depth (0 only).
    pub mtp_depth: Option<u64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum SystemPrompt {
    Text(String),
    Blocks(Vec<Block>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AnthropicRole {
    User,
    Assistant,
    /// Claude Code's mid-conversation system messages (a beta): rendered
    /// in place as a system message.
    System,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct InputMessage {
    pub role: AnthropicRole,
    pub content: InputContent,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum InputContent {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block. One struct for every block type (the `type` field
/// says which fields apply) so a wrong block gets a precise error.
#[derive(Debug, Deserialize, ToSchema)]
pub struct Block {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `thinking` blocks.
    pub thinking: Option<String>,
    /// `tool_use` blocks.
    pub id: Option<String>,
    pub name: Option<String>,
    pub input: Option<Value>,
    /// `tool_result` blocks.
    pub tool_use_id: Option<String>,
    pub content: Option<Value>,
    /// `image` blocks: `{"type": "base64", "media_type", "data"}`.
    pub source: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct AnthropicTool {
    /// Absent or `custom` for a client tool; server tools
    /// (`web_search_20250305`, ...) are not run here and are reported in
    /// `warnings`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct OutputConfig {
    pub effort: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Thinking {
    /// `enabled`, `adaptive` (the model decides; here: enabled, no budget)
    /// or `disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    pub budget_tokens: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<OutputBlock>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: AnthropicUsage,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputBlock {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: Value,
    },
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AnthropicUsage {
    pub input_tokens: usize,
    pub output_tokens: usize,
    pub cache_read_input_tokens: usize,
    pub cache_creation_input_tokens: usize,
    /// Extension: the sampler's seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl AnthropicUsage {
    pub fn of(s: &crate::summary::TurnSummary, seed: Option<u64>) -> Self {
        Self {
            input_tokens: s.prompt_tokens,
            output_tokens: s.completion_tokens,
            cache_read_input_tokens: s.cached_tokens,
            cache_creation_input_tokens: 0,
            seed,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCount {
    pub input_tokens: usize,
}
