//! Structured outputs at the API edge: OpenAI `response_format`
//! (`json_object`, `json_schema` with `name` / `strict`), the `grammar`
//! extension (chat and completions), and forced tool calls (OpenAI
//! `tool_choice: "required"` or a named function, Anthropic `any` / `tool`).
//! Each becomes a [`ds4_constraint::Grammar`] compiled against the model's
//! vocabulary before the job is queued, so a grammar the engine cannot
//! compile is a 400 that names the field and what in it is unsupported.
//! The compiled [`Constraint`] travels with the job; the worker's observer
//! answers the decode loops' masks from it (see `worker.rs`).
//!
//! The `grammar` extension: `{"type": "lark" | "regex" | "json_schema",
//! "value": …}` (a Lark grammar in llguidance's dialect or a regex as a
//! string, a schema as an object); a bare string is a Lark grammar.

use ds4_constraint::{Constraint, ConstraintError, ForcedTool, Grammar};
use serde_json::Value;

use crate::error::ApiError;
use crate::output::Output;
use crate::state::AppState;
use crate::tools::FunctionTool;

/// How a request's `tool_choice` reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// Some call must be made (OpenAI `required`, Anthropic `any`).
    Required,
    /// This function must be called.
    Named(String),
}

impl ToolChoice {
    /// OpenAI: `"auto" | "none" | "required"` or `{"type": "function",
    /// "function": {"name": …}}` (Responses: `{"type": "function", "name":
    /// …}`).
    pub fn openai(choice: Option<&Value>) -> Result<Self, ApiError> {
        match choice {
            None | Some(Value::Null) => Ok(Self::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(Self::Auto),
                "none" => Ok(Self::None),
                "required" => Ok(Self::Required),
                other => Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice {other:?} is not one of \"auto\", \"none\", \"required\" or \
                         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                    ),
                )),
            },
            Some(obj) => {
                let name = obj["function"]["name"].as_str().or(obj["name"].as_str());
                match (obj["type"].as_str(), name) {
                    (Some("function"), Some(name)) => Ok(Self::Named(name.to_string())),
                    _ => Err(ApiError::invalid(
                        "tool_choice",
                        format!(
                            "tool_choice {obj} is not supported: use \"auto\", \"none\", \
                             \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": \
                             …}}}}"
                        ),
                    )),
                }
            }
        }
    }

    /// Anthropic: `{"type": "auto" | "any" | "none"}` or `{"type": "tool",
    /// "name": …}`.
    pub fn anthropic(choice: Option<&Value>) -> Result<Self, ApiError> {
        let Some(choice) = choice.filter(|c| !c.is_null()) else {
            return Ok(Self::Auto);
        };
        match (choice["type"].as_str(), choice["name"].as_str()) {
            (Some("auto"), _) => Ok(Self::Auto),
            (Some("none"), _) => Ok(Self::None),
            (Some("any"), _) => Ok(Self::Required),
            (Some("tool"), Some(name)) => Ok(Self::Named(name.to_string())),
            _ => Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice {choice} is not supported: use {{\"type\": \"auto\"}}, \
                     {{\"type\": \"any\"}}, {{\"type\": \"none\"}} or {{\"type\": \"tool\", \
                     \"name\": …}}"
                ),
            )),
        }
    }

    /// Whether tools are offered to the model at all.
    pub fn offers_tools(&self) -> bool {
        *self != Self::None
    }
}

/// A request's constraint, before compilation: the grammar and the field
/// that asked for it (named in errors).
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub field: &'static str,
    pub grammar: Grammar,
}

/// The forced call of `choice` over the offered `tools`, if it forces one
/// (`tool_choice` names a tool that was not declared: 400).
pub fn forced_call(
    state: &AppState,
    choice: &ToolChoice,
    tools: &[FunctionTool],
) -> Result<Option<Requested>, ApiError> {
    let candidates: Vec<&FunctionTool> = match choice {
        ToolChoice::Auto | ToolChoice::None => return Ok(None),
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
    };
    if candidates.is_empty() {
        let message = match choice {
            ToolChoice::Named(name) => {
                format!("tool_choice names the function {name:?}, which is not in tools")
            }
            _ => "tool_choice forces a tool call but no tools were given".to_string(),
        };
        return Err(ApiError::invalid("tool_choice", message));
    }
    let Some(format) = state.profile.tool_calls else {
        return Err(ApiError::invalid(
            "tool_choice",
            format!(
                "the {} family has no tool-call format to force a call in",
                state.profile.family
            ),
        ));
    };
    let forced: Vec<ForcedTool> = candidates
        .iter()
        .map(|t| ForcedTool {
            name: t.name.clone(),
            parameters: t.parameters.clone(),
        })
        .collect();
    let grammar = ds4_constraint::tool_call_grammar(format, &forced)
        .map_err(|e| ApiError::invalid("tool_choice", e.to_string()))?;
    Ok(Some(Requested {
        field: "tool_choice",
        grammar,
    }))
}

/// OpenAI `response_format`: `text` (no constraint), `json_object`, or
/// `json_schema` with `json_schema: {name, schema, strict?}`. The schema is
/// enforced whether or not `strict` is set (decoding is constrained either
/// way).
pub fn response_format(format: Option<&Value>) -> Result<Option<Requested>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let fields = FormatFields {
        whole: "response_format",
        kind: "response_format.type",
        spec: "response_format.json_schema",
    };
    if format["type"].as_str() == Some("json_schema") && !format["json_schema"].is_object() {
        return Err(ApiError::invalid(
            fields.spec,
            "response_format.json_schema must be an object with `name` and `schema`",
        ));
    }
    format_grammar(format, &format["json_schema"], &fields)
}

/// OpenAI Responses `text.format`: the same three kinds as
/// `response_format`, with the schema's fields beside `type`
/// (`{"type": "json_schema", "name", "schema", "strict"}`), as the Responses
/// API and the openai client's `responses.parse(text_format=…)` send them.
pub fn text_format(text: Option<&Value>) -> Result<Option<Requested>, ApiError> {
    let Some(text) = text.filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    if !text.is_object() {
        return Err(ApiError::invalid(
            "text",
            "text must be an object such as {\"format\": {\"type\": \"json_schema\", …}}",
        ));
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    if !format.is_object() {
        return Err(ApiError::invalid(
            "text.format",
            "text.format must be an object with a `type`",
        ));
    }
    let fields = FormatFields {
        whole: "text.format",
        kind: "text.format.type",
        spec: "text.format",
    };
    format_grammar(format, format, &fields)
}

/// Where a format's parts live in the request, for the error messages.
struct FormatFields {
    /// The constraint's own field (what `one_of` names).
    whole: &'static str,
    kind: &'static str,
    /// The object that holds `name`, `schema` and `strict`.
    spec: &'static str,
}

fn format_grammar(
    format: &Value,
    spec: &Value,
    fields: &FormatFields,
) -> Result<Option<Requested>, ApiError> {
    let grammar = match format["type"].as_str() {
        Some("text") => return Ok(None),
        Some("json_object") => Grammar::JsonObject,
        Some("json_schema") => {
            if spec.get("name").is_some_and(|n| !n.is_string()) {
                let field = format!("{}.name", fields.spec);
                let message = format!("{field} must be a string");
                return Err(ApiError::invalid(field, message));
            }
            if spec
                .get("strict")
                .is_some_and(|s| !s.is_boolean() && !s.is_null())
            {
                let field = format!("{}.strict", fields.spec);
                let message = format!("{field} must be a boolean");
                return Err(ApiError::invalid(field, message));
            }
            match spec.get("schema") {
                // No schema: any JSON value (OpenAI's own default).
                None | Some(Value::Null) => Grammar::JsonSchema(Value::Bool(true)),
                Some(schema) => Grammar::JsonSchema(schema.clone()),
            }
        }
        _ => {
            return Err(ApiError::invalid(
                fields.kind,
                format!(
                    "{} {} is not one of \"text\", \"json_object\", \"json_schema\"",
                    fields.kind, format["type"]
                ),
            ));
        }
    };
    Ok(Some(Requested {
        field: fields.whole,
        grammar,
    }))
}

/// The `grammar` extension field (see the module docs).
pub fn grammar_field(value: Option<&Value>) -> Result<Option<Requested>, ApiError> {
    let field = "grammar";
    let grammar = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(lark)) => Grammar::Lark(lark.clone()),
        Some(obj @ Value::Object(_)) => match (obj["type"].as_str(), &obj["value"]) {
            (Some("lark"), Value::String(s)) => Grammar::Lark(s.clone()),
            (Some("regex"), Value::String(s)) => Grammar::Regex(s.clone()),
            (Some("json_schema"), v @ (Value::Object(_) | Value::Bool(_))) => {
                Grammar::JsonSchema(v.clone())
            }
            (Some("lark" | "regex"), _) => {
                return Err(ApiError::invalid(
                    "grammar.value",
                    "grammar.value must be a string",
                ));
            }
            (Some("json_schema"), _) => {
                return Err(ApiError::invalid(
                    "grammar.value",
                    "grammar.value must be a JSON schema (an object)",
                ));
            }
            _ => {
                return Err(ApiError::invalid(
                    "grammar.type",
                    "grammar.type must be \"lark\", \"regex\" or \"json_schema\"",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                field,
                "grammar must be a Lark grammar (a string) or {\"type\": \"lark\" | \"regex\" | \
                 \"json_schema\", \"value\": …}",
            ));
        }
    };
    Ok(Some(Requested { field, grammar }))
}

/// At most one constraint per request: a second one is a 400 naming both.
pub fn one_of(found: Vec<Option<Requested>>) -> Result<Option<Requested>, ApiError> {
    let mut found: Vec<Requested> = found.into_iter().flatten().collect();
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|r| r.field).collect();
        return Err(ApiError::invalid(
            found[1].field,
            format!(
                "{} cannot be combined: a reply follows one constraint",
                names.join(" and ")
            ),
        ));
    }
    Ok(found.pop())
}

/// Compile the request's constraint against the model's vocabulary. A
/// reply that starts inside the reasoning block (the template opened it)
/// reasons freely up to the family's closing marker, then follows the
/// grammar. An unsupported or malformed grammar is a 400 naming the field
/// and the part the engine refused.
pub fn compile(
    state: &AppState,
    requested: Option<Requested>,
    output: Output,
) -> Result<Option<Box<Constraint>>, ApiError> {
    let Some(Requested { field, grammar }) = requested else {
        return Ok(None);
    };
    let vocabulary = state
        .vocabulary
        .get(&state.tokenizer)
        .map_err(|e| ApiError::invalid(field, e.to_string()))?;
    let close = state
        .profile
        .reasoning
        .filter(|_| output.reasoning_open && !output.raw)
        .map(|m| m.close);
    match vocabulary.compile_after(&grammar, close) {
        Ok(c) => Ok(Some(Box::new(c))),
        Err(ConstraintError::Unsupported(m)) => Err(ApiError::invalid(
            field,
            format!("{field} uses something this server cannot enforce: {m}"),
        )),
        Err(e) => Err(ApiError::invalid(
            field,
            format!("{field} is not valid: {e}"),
        )),
    }
}
