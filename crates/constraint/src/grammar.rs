//! What a request constrains its output to, and how it becomes an
//! `llguidance` grammar.

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{Value, json};

use crate::error::ConstraintError;

/// The JSON schema `response_format: {"type": "json_object"}` stands for.
pub const JSON_OBJECT_SCHEMA: &str = r#"{"type": "object"}"#;

/// The JSON-schema keywords that constrain output (`llguidance` 1.9's
/// implemented set; `oneOf` only where its branches are provably disjoint,
/// otherwise refused); annotations (`title`, `description`, `default`,
/// `examples`, `$schema`, `$id`, `$comment`, `$defs`/`definitions`, …) are
/// accepted and ignored. Any other keyword is refused by name.
pub const SUPPORTED_SCHEMA_KEYWORDS: &[&str] = &[
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "const",
    "enum",
    "type",
    "items",
    "additionalItems",
    "prefixItems",
    "minItems",
    "maxItems",
    "properties",
    "additionalProperties",
    "patternProperties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// A request's constraint on its output.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A value valid against this JSON schema.
    JsonSchema(Value),
    /// Text matching this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// A grammar in `llguidance`'s Lark dialect (rule `start`; `%json {…}`
    /// embeds a JSON schema, `<[id]>` a special token by id).
    Lark(String),
}

/// JSON is written in one canonical layout (`", "` between items, `": "`
/// after keys, no other whitespace): a model cannot spend its tokens on
/// whitespace, and the text parses as written. A schema's own `x-guidance`
/// options take precedence.
pub(crate) fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with the canonical layout unless it names its own.
pub(crate) fn with_layout(schema: &Value) -> Result<Value, ConstraintError> {
    match schema {
        Value::Object(map) => {
            let mut map = map.clone();
            map.entry("x-guidance").or_insert_with(json_layout);
            Ok(Value::Object(map))
        }
        // `true` / `false` are schemas too (anything / nothing).
        Value::Bool(true) => Ok(json!({"x-guidance": json_layout()})),
        Value::Bool(false) => Ok(Value::Bool(false)),
        other => Err(ConstraintError::Invalid(format!(
            "a JSON schema is an object or a boolean, not {}",
            kind(other)
        ))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A reply that starts inside an open reasoning block: free text up to and
/// including the block's closing marker (`close`: a Lark literal or `<[id]>`
/// for a special token), blank space, then `body` (a sub-grammar).
pub(crate) fn after_reasoning(
    body: TopLevelGrammar,
    close: &str,
) -> Result<TopLevelGrammar, ConstraintError> {
    let mut grammars = vec![GrammarWithLexer::from_lark(format!(
        "start: reasoning BLANK @body\nreasoning[suffix={close}]: /(?s:.*)/\nBLANK: /[ \\t\\n]*/\n"
    ))];
    for mut g in body.grammars {
        if grammars.len() == 1 {
            g.name = Some("body".into());
        }
        grammars.push(g);
    }
    Ok(TopLevelGrammar {
        grammars,
        max_tokens: body.max_tokens,
    })
}

impl Grammar {
    pub(crate) fn to_llguidance(&self) -> Result<TopLevelGrammar, ConstraintError> {
        Ok(match self {
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(&json!({"type": "object"}))?)
            }
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(with_layout(schema)?),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(text) => {
                if text.trim().is_empty() {
                    return Err(ConstraintError::Invalid("the grammar is empty".into()));
                }
                TopLevelGrammar::from_lark(text.clone())
            }
        })
    }
}
