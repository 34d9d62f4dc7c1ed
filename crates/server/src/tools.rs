//! The functions a request offers the model, in the API-neutral form the
//! prompt renderers (`prompt`, `deepseek_prompt`) and the structured-output
//! compiler (`constraints`) read. A leaf module: every layer that needs a
//! tool names this one, none of them each other.

use serde_json::{Map, Value, json};

/// How the API spelled a tool (ds4 lists tools in its prompt as the client
/// sent them: an OpenAI chat tool's `function` object, an Anthropic tool,
/// a Responses function tool).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolShape {
    OpenAiFunction,
    Anthropic,
    Responses,
}

/// A function the model may call.
#[derive(Debug, Clone)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
    /// Whether the request gave `parameters` (else `parameters` is the empty
    /// object schema).
    pub has_parameters: bool,
    pub shape: ToolShape,
}

impl FunctionTool {
    /// A tool as an API declared it (no schema: an empty object).
    pub fn new(
        shape: ToolShape,
        name: String,
        description: Option<String>,
        parameters: Option<Value>,
    ) -> Self {
        Self {
            name,
            description,
            has_parameters: parameters.is_some(),
            parameters: parameters.unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            shape,
        }
    }

    /// The tool as one line of JSON in the API's own shape and key order
    /// (`name`, `description`, the schema under the API's key), fields the
    /// request left out omitted: the line ds4's tools block lists. Extra
    /// keys a client may add to a tool object are not kept.
    pub fn schema_line(&self) -> String {
        let mut m = Map::new();
        if self.shape == ToolShape::Responses {
            m.insert("type".into(), json!("function"));
        }
        m.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            m.insert("description".into(), json!(d));
        }
        if self.has_parameters {
            let key = match self.shape {
                ToolShape::Anthropic => "input_schema",
                ToolShape::OpenAiFunction | ToolShape::Responses => "parameters",
            };
            m.insert(key.into(), self.parameters.clone());
        }
        Value::Object(m).to_string()
    }

    /// The OpenAI/transformers tool shape templates expect.
    pub fn to_template(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description.clone().unwrap_or_default(),
                "parameters": self.parameters,
            }
        })
    }
}
