//! A forced tool call (`tool_choice: "required"`, a named function,
//! Anthropic `any` / `tool`) as a grammar: the call written in the family's
//! own format (what `ds4_text::ToolCallParser` reads back), its arguments
//! constrained by the tool's JSON schema.

use ds4_text::ToolCallFormat;
use serde_json::{Value, json};

use crate::error::ConstraintError;
use crate::grammar::{Grammar, with_layout};

/// A tool the call may be to: its name and its parameters' JSON schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedTool {
    pub name: String,
    pub parameters: Value,
}

/// The grammar of exactly one call to one of `tools`, in `format`.
pub fn tool_call_grammar(
    format: ToolCallFormat,
    tools: &[ForcedTool],
) -> Result<Grammar, ConstraintError> {
    if tools.is_empty() {
        return Err(ConstraintError::Invalid("no tool to call".into()));
    }
    let mut rules = Vec::new();
    let mut calls = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let params = parameters(tool)?;
        let rule = match format {
            ToolCallFormat::Llama3Json => format!(
                "{} %json {} {}",
                lit(&format!(
                    "{{\"name\": {}, \"parameters\": ",
                    json_str(&tool.name)
                )),
                with_layout(&params)?,
                lit("}")
            ),
            ToolCallFormat::Hermes => format!(
                "{} %json {} {}",
                lit(&format!(
                    "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                    json_str(&tool.name)
                )),
                with_layout(&params)?,
                lit("}\n</tool_call>")
            ),
            ToolCallFormat::Glm => {
                let args = members(&params, |key, value, _| {
                    format!(
                        "{} {value} {}",
                        lit(&format!("<arg_key>{key}</arg_key>\n<arg_value>")),
                        lit("</arg_value>\n")
                    )
                })?;
                format!(
                    "{} {args} {}",
                    lit(&format!("<tool_call>{}\n", tool.name)),
                    lit("</tool_call>")
                )
            }
            // Qwen3.5's template writes a string raw and anything else as
            // JSON, one `<parameter=…>` block per argument.
            ToolCallFormat::QwenXml => {
                let args = members_raw_enums(&params, true, |key, value, _| {
                    // Free text runs to its last newline before the closing
                    // tag (a `TEXT` then a literal newline would leave the
                    // greedy lexeme holding the newline).
                    let (value, close) = match value.as_str() {
                        "TEXT" => ("TEXT_NL".to_string(), "</parameter>\n"),
                        _ => (value, "\n</parameter>\n"),
                    };
                    format!(
                        "{} {value} {}",
                        lit(&format!("<parameter={key}>\n")),
                        lit(close)
                    )
                })?;
                format!(
                    "{} {args} {}",
                    lit(&format!("<tool_call>\n<function={}>\n", tool.name)),
                    lit("</function>\n</tool_call>")
                )
            }
            ToolCallFormat::Dsml => {
                let args = members(&params, |key, value, raw| {
                    let string = if raw { "true" } else { "false" };
                    format!(
                        "{} {value} {}",
                        lit(&format!(
                            "<｜DSML｜parameter name=\"{key}\" string=\"{string}\">"
                        )),
                        lit("</｜DSML｜parameter>\n")
                    )
                })?;
                format!(
                    "{} {args} {}",
                    lit(&format!(
                        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"{}\">\n",
                        tool.name
                    )),
                    lit("</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
                )
            }
        };
        rules.push(format!("call_{i}: {rule}"));
        calls.push(format!("call_{i}"));
    }
    let mut lark = format!("start: {}\n", calls.join(" | "));
    for r in rules {
        lark.push_str(&r);
        lark.push('\n');
    }
    // Raw text values (GLM, DSML and Qwen XML string parameters): anything
    // up to the closing tag's `<`.
    lark.push_str("TEXT: /[^<]*/\n");
    if format == ToolCallFormat::QwenXml {
        // A Qwen XML string value and the newline the template writes after it.
        lark.push_str("TEXT_NL: /[^<]*\\n/\n");
    }
    Ok(Grammar::Lark(lark))
}

/// The tool's parameters schema (`{}` and a missing one are "any object").
fn parameters(tool: &ForcedTool) -> Result<Value, ConstraintError> {
    if tool.name.is_empty() || tool.name.contains(['"', '<', '\n']) {
        return Err(ConstraintError::Invalid(format!(
            "tool name {:?} cannot be written in a call",
            tool.name
        )));
    }
    Ok(match &tool.parameters {
        Value::Null => json!({"type": "object"}),
        Value::Object(m) if m.is_empty() => json!({"type": "object"}),
        other => other.clone(),
    })
}

/// Key/value formats (GLM, DSML, Qwen XML): one `pair(key, value_rule)` per property
/// in the schema's order, required ones mandatory, the others optional. A
/// string property's value is raw text (`TEXT`), any other a JSON value
/// under its own schema.
fn members(
    params: &Value,
    pair: impl Fn(&str, String, bool) -> String,
) -> Result<String, ConstraintError> {
    members_raw_enums(params, false, pair)
}

/// [`members`]; with `raw_enums` a string enum's value is one of its
/// strings written raw (Qwen3.5's template writes every string raw and its
/// parser keeps a string parameter's text as is, quotes included).
fn members_raw_enums(
    params: &Value,
    raw_enums: bool,
    pair: impl Fn(&str, String, bool) -> String,
) -> Result<String, ConstraintError> {
    let props = params.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = params
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(props) = props else {
        return Ok(String::new());
    };
    let mut out = Vec::new();
    for (key, schema) in props {
        if key.contains(['"', '<', '\n']) {
            return Err(ConstraintError::Unsupported(format!(
                "property name {key:?} cannot be written in this model's tool-call format"
            )));
        }
        let is_string = schema.get("type") == Some(&json!("string"));
        let enum_strings: Option<Vec<&str>> = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.iter().map(Value::as_str).collect());
        let (raw, value) = match (is_string, schema.get("enum"), enum_strings) {
            (true, None, _) => (true, "TEXT".to_string()),
            (_, Some(_), Some(options)) if raw_enums && !options.is_empty() => (
                true,
                format!(
                    "({})",
                    options
                        .iter()
                        .map(|o| lit(o))
                        .collect::<Vec<_>>()
                        .join(" | ")
                ),
            ),
            _ => (false, format!("%json {}", with_layout(schema)?)),
        };
        let p = format!("({})", pair(key, value, raw));
        out.push(if required.contains(&key.as_str()) {
            p
        } else {
            format!("{p}?")
        });
    }
    Ok(out.join(" "))
}

/// A Lark string literal for `text`.
fn lit(text: &str) -> String {
    json_str(text)
}

fn json_str(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}
