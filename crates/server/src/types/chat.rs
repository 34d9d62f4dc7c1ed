//! `POST /v1/chat/completions` (OpenAI Chat Completions).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::common::{LogprobEntry, Usage};
use crate::params::StopField;

#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessage>,
    #[schema(minimum = 1)]
    pub max_tokens: Option<u64>,
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<u64>,
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f64>,
    #[schema(minimum = 0, maximum = 1)]
    pub top_p: Option<f64>,
    /// Extension (also vLLM's).
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    /// Extension; only families whose law has min_p use it.
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
    pub logprobs: Option<bool>,
    #[schema(maximum = 20)]
    pub top_logprobs: Option<u64>,
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u64>,
    pub tools: Option<Vec<ChatTool>>,
    pub tool_choice: Option<Value>,
    /// `low` | `medium` | `high` turn reasoning on, `none` | `minimal` off
    /// (for families that reason; `deepseek_v4`: `max` asks for Think Max,
    /// `xhigh` … `minimal` are high, `none` off).
    pub reasoning_effort: Option<String>,
    /// Extension (`deepseek_v4`, as ds4): `{"type": "enabled" | "disabled"}`
    /// or a boolean; other families ignore it.
    pub thinking: Option<Value>,
    /// Extension (`deepseek_v4`, as ds4): `false` turns thinking off; other
    /// families ignore it.
    pub think: Option<bool>,
    /// Extension: MTP draft depth (0 only: no served family has MTP).
    pub mtp_depth: Option<u64>,
    /// `{"type": "text" | "json_object"}` or `{"type": "json_schema",
    /// "json_schema": {"name", "schema", "strict"}}`: the reply is
    /// constrained to JSON (valid against the schema).
    #[schema(value_type = Option<Object>)]
    pub response_format: Option<Value>,
    /// Extension: constrain the reply to a grammar: `{"type": "lark" |
    /// "regex" | "json_schema", "value": …}` (a bare string is Lark, in
    /// llguidance's dialect).
    #[schema(value_type = Option<Object>)]
    pub grammar: Option<Value>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// The role name chat templates know (`developer` is a system message).
    pub fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatMessage {
    pub role: Role,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_calls: Option<Vec<ToolCall>>,
    pub tool_call_id: Option<String>,
    /// Earlier reasoning, sent back by clients that keep it.
    pub reasoning_content: Option<String>,
}

/// A string, or a list of content parts (text, and `image_url` for models
/// that read images).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// `image_url` parts: `{"url": "data:image/png;base64,…", "detail": …}`
    /// (or the URL string).
    #[schema(value_type = Option<Object>)]
    pub image_url: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text of the arguments.
    pub arguments: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatTool {
    #[serde(rename = "type")]
    pub kind: String,
    /// Required for `function` tools; other types (`custom`) have none.
    pub function: Option<FunctionDef>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FunctionDef {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    /// Extension: parameters the family's law ignored, and similar notes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    pub message: AssistantMessage,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChoiceLogprobs {
    pub content: Vec<LogprobEntry>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    /// Present (null) on every chunk when usage was asked for; set on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: usize,
    pub delta: Delta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}
