//! Rules the server enforces that the request types' derived schemas do not
//! state, written into the document so that a request valid under it is
//! one the server takes (schemathesis checks both directions in `.ci/run`).
//!
//! Each rule here mirrors a check in the routes or `crate::params`; the
//! test below pins that the document carries them.

use serde_json::{Value, json};

use crate::params::MAX_STOPS;

/// Apply every rule to the document's `components.schemas` and paths.
pub fn apply(doc: &mut Value) {
    if let Some(schemas) = doc.pointer_mut("/components/schemas") {
        unsigned_ranges(schemas);
        stop_strings(schemas);
        count_tokens_schema(schemas);
        block_types(schemas);
        logprobs_dependency(schemas);
        unsupported_fields(schemas);
        tool_choices(schemas);
        structured_outputs(schemas);
        prompt_batches(schemas);
    }
    if let Some(body) = doc.pointer_mut(
        "/paths/~1v1~1messages~1count_tokens/post/requestBody/content/application~1json/schema",
    ) {
        *body = json!({"$ref": "#/components/schemas/CountTokensRequest"});
    }
}

/// Unsigned integers (`format: uint64` …, from utoipa's
/// `non_strict_integers`) get their real range: a JSON number above
/// `u64::MAX` does not parse, and without a `maximum` the document would
/// call it valid (with `int64` it called values above `i64::MAX` invalid,
/// which the server takes).
fn unsigned_ranges(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            // utoipa spells them `u-int64` …; the usual name is `uint64`.
            let unsigned = match map.get("format").and_then(Value::as_str) {
                Some("uint64" | "u-int64") => Some(("uint64", json!(u64::MAX))),
                Some("uint32" | "u-int32") => Some(("uint32", json!(u32::MAX))),
                Some("uint16" | "u-int16") => Some(("uint16", json!(u16::MAX))),
                Some("uint8" | "u-int8") => Some(("uint8", json!(u8::MAX))),
                _ => None,
            };
            if let Some((format, max)) = unsigned {
                map.insert("format".into(), json!(format));
                map.entry("minimum").or_insert(json!(0));
                map.entry("maximum").or_insert(max);
            }
            for v in map.values_mut() {
                unsigned_ranges(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(unsigned_ranges),
        _ => {}
    }
}

/// Stop strings: non-empty, at most `MAX_STOPS` of them
/// (`crate::params::stops`).
fn stop_strings(schemas: &mut Value) {
    let one = json!({"type": "string", "minLength": 1});
    let many = json!({"type": "array", "items": one, "maxItems": MAX_STOPS});
    if let Some(stop) = schemas.get_mut("StopField") {
        *stop = json!({
            "oneOf": [one, many],
            "description": "One stop string or a list of them; each non-empty."
        });
    }
    if let Some(p) = schemas.pointer_mut("/MessagesRequest/properties/stop_sequences") {
        *p = json!({"type": ["array", "null"], "items": one, "maxItems": MAX_STOPS});
    }
}

/// `/v1/messages` needs `max_tokens` (as Anthropic's does); count_tokens,
/// which shares its request type, does not: it gets a copy of the schema
/// without that requirement.
fn count_tokens_schema(schemas: &mut Value) {
    let Some(messages) = schemas.get_mut("MessagesRequest") else {
        return;
    };
    let count = messages.clone();
    if let Some(required) = messages["required"].as_array_mut()
        && !required.contains(&json!("max_tokens"))
    {
        required.push(json!("max_tokens"));
    }
    if let Some(p) = messages.pointer_mut("/properties/max_tokens") {
        p["type"] = json!("integer");
        p["description"] = json!("Required.");
    }
    if let Some(schemas) = schemas.as_object_mut() {
        schemas.insert("CountTokensRequest".into(), count);
    }
}

/// Anthropic content blocks: the types a text model reads
/// (`routes::messages::convert`); an `image` or `document` block is refused
/// by a model without vision.
fn block_types(schemas: &mut Value) {
    // System blocks share the type but only their text is read, whatever
    // their `type`: they keep the open schema, as `SystemBlock`.
    if let Some(block) = schemas.get("Block").cloned()
        && let Some(map) = schemas.as_object_mut()
    {
        map.insert("SystemBlock".into(), block);
        if let Some(system) = map.get_mut("SystemPrompt") {
            retarget(
                system,
                "#/components/schemas/Block",
                "#/components/schemas/SystemBlock",
            );
        }
    }
    if let Some(kind) = schemas.pointer_mut("/Block/properties/type") {
        kind["enum"] = json!([
            "text",
            "thinking",
            "redacted_thinking",
            "tool_use",
            "tool_result"
        ]);
    }
}

/// A model that reads images also takes Anthropic `image` blocks.
pub fn accept_image_blocks(schemas: &mut serde_json::Map<String, Value>) {
    if let Some(Value::Array(kinds)) = schemas
        .get_mut("Block")
        .and_then(|b| b.pointer_mut("/properties/type/enum"))
    {
        kinds.push(json!("image"));
    }
}

/// Every `$ref` to `from` inside `schema` now points at `to`.
fn retarget(schema: &mut Value, from: &str, to: &str) {
    match schema {
        Value::Object(map) => {
            if map.get("$ref").and_then(Value::as_str) == Some(from) {
                map.insert("$ref".into(), json!(to));
            }
            map.values_mut().for_each(|v| retarget(v, from, to));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| retarget(v, from, to)),
        _ => {}
    }
}

/// Chat `top_logprobs` (a number) needs `logprobs: true`
/// (`routes::chat::prepare`), as OpenAI's does.
fn logprobs_dependency(schemas: &mut Value) {
    if let Some(chat) = schemas
        .get_mut("ChatCompletionRequest")
        .and_then(Value::as_object_mut)
    {
        chat.insert(
            "if".into(),
            json!({"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}}),
        );
        chat.insert(
            "then".into(),
            json!({"required": ["logprobs"], "properties": {"logprobs": {"const": true}}}),
        );
    }
}

/// `tool_choice` is read as JSON (`constraints::ToolChoice`): the document
/// states the forms the server takes, so a generated `{}` is not called
/// valid (OpenAI: a mode or a named function, in the Chat or the Responses
/// form; Anthropic: `{"type": …}`, with a name for `tool`).
fn tool_choices(schemas: &mut Value) {
    let named = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required});
    let openai = json!({"oneOf": [
        {"type": "null"},
        {"type": "string", "enum": ["auto", "none", "required"]},
        named(
            json!({
                "type": {"const": "function"},
                "function": named(json!({"name": {"type": "string"}}), json!(["name"])),
            }),
            json!(["type", "function"]),
        ),
        named(
            json!({"type": {"const": "function"}, "name": {"type": "string"}}),
            json!(["type", "name"]),
        ),
    ]});
    let anthropic = json!({"oneOf": [
        {"type": "null"},
        named(
            json!({"type": {"type": "string", "enum": ["auto", "any", "none"]}}),
            json!(["type"]),
        ),
        named(
            json!({"type": {"const": "tool"}, "name": {"type": "string"}}),
            json!(["type", "name"]),
        ),
    ]});
    for (request, schema) in [
        ("ChatCompletionRequest", &openai),
        ("ResponsesRequest", &openai),
        ("MessagesRequest", &anthropic),
    ] {
        if let Some(p) = schemas.pointer_mut(&format!("/{request}/properties/tool_choice")) {
            *p = schema.clone();
        }
    }
}

/// `response_format` and the `grammar` extension are read as JSON
/// (`constraints::response_format`, `constraints::grammar_field`): the
/// document states their forms. What no schema can say (a Lark grammar or
/// a JSON schema the constraint engine cannot compile) stays a 400.
fn structured_outputs(schemas: &mut Value) {
    let kind = |k: &str| json!({"type": "object", "properties": {"type": {"const": k}}, "required": ["type"]});
    let response_format = json!({"oneOf": [
        {"type": "null"},
        kind("text"),
        kind("json_object"),
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "strict": {"type": ["boolean", "null"]},
                        "schema": {"type": ["object", "boolean", "null"]},
                    },
                },
            },
            "required": ["type", "json_schema"],
        },
    ]});
    let grammar = json!({"oneOf": [
        {"type": "null"},
        {"type": "string", "description": "A Lark grammar (llguidance's dialect)."},
        {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["lark", "regex"]},
                "value": {"type": "string"},
            },
            "required": ["type", "value"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "value": {"type": ["object", "boolean"]},
            },
            "required": ["type", "value"],
        },
    ]});
    for request in ["ChatCompletionRequest", "CompletionRequest"] {
        for (field, schema) in [("response_format", &response_format), ("grammar", &grammar)] {
            if let Some(p) = schemas.pointer_mut(&format!("/{request}/properties/{field}")) {
                *p = schema.clone();
            }
        }
    }
}

/// `/v1/completions`' prompt: token ids are at least one, and a batch holds
/// exactly one prompt (`routes::completions::prompt_tokens`; the ids'
/// bound is the served vocabulary, set by [`token_id_bound`]).
fn prompt_batches(schemas: &mut Value) {
    let Some(forms) = schemas
        .pointer_mut("/PromptInput/oneOf")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for form in forms.iter_mut().filter(|f| f["type"] == "array") {
        let batch = form["items"]["type"] == "array" || form["items"]["type"] == "string";
        form["minItems"] = json!(1);
        if batch {
            form["maxItems"] = json!(1);
        }
        if form["items"]["type"] == "array" {
            form["items"]["minItems"] = json!(1);
        }
    }
}

/// The served vocabulary's largest token id as the bound of every token id
/// a completions prompt may hold.
pub fn token_id_bound(schemas: &mut serde_json::Map<String, Value>, vocab: usize) {
    let Some(forms) = schemas
        .get_mut("PromptInput")
        .and_then(|p| p.get_mut("oneOf"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let max = json!(vocab.saturating_sub(1));
    for form in forms.iter_mut() {
        if form["items"]["type"] == "integer" {
            form["items"]["maximum"] = max.clone();
        } else if form["items"]["items"]["type"] == "integer" {
            form["items"]["items"]["maximum"] = max.clone();
        }
    }
}

/// Fields the server parses only to refuse a value: stated as `null`.
fn unsupported_fields(schemas: &mut Value) {
    if let Some(p) = schemas.pointer_mut("/ResponsesRequest/properties/previous_response_id") {
        *p = json!({
            "type": "null",
            "description": "Not supported: responses are not stored; send the whole conversation in `input`. Any value but null is refused."
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form the document allows for `tool_choice` is one the server
    /// reads, and an empty object (schemathesis's counterexample) is not.
    #[test]
    fn tool_choice_forms_are_the_servers() {
        use crate::constraints::ToolChoice;
        let doc = crate::openapi::document();
        let s = &doc["components"]["schemas"];
        for request in ["ChatCompletionRequest", "ResponsesRequest"] {
            let forms = s[request]["properties"]["tool_choice"]["oneOf"]
                .as_array()
                .unwrap();
            assert_eq!(forms.len(), 4, "{request}");
        }
        let openai = [
            json!("auto"),
            json!("none"),
            json!("required"),
            json!({"type": "function", "function": {"name": "f"}}),
            json!({"type": "function", "name": "f"}),
        ];
        for v in &openai {
            assert!(ToolChoice::openai(Some(v)).is_ok(), "{v}");
        }
        assert!(ToolChoice::openai(Some(&json!({}))).is_err());
        let anthropic = [
            json!({"type": "auto"}),
            json!({"type": "any"}),
            json!({"type": "none"}),
            json!({"type": "tool", "name": "f"}),
        ];
        for v in &anthropic {
            assert!(ToolChoice::anthropic(Some(v)).is_ok(), "{v}");
        }
        assert!(ToolChoice::anthropic(Some(&json!({}))).is_err());
        let forms = &s["MessagesRequest"]["properties"]["tool_choice"]["oneOf"];
        assert_eq!(forms[1]["required"], json!(["type"]));
        assert_eq!(forms[2]["required"], json!(["type", "name"]));
    }

    /// The completions prompt's batches hold one prompt, token ids are
    /// bounded by the served vocabulary, and `response_format` / `grammar`
    /// list their forms (schemathesis's positive data is then served).
    #[test]
    fn prompt_and_structured_output_forms_are_stated() {
        let mut doc = crate::openapi::document();
        let schemas = doc
            .pointer_mut("/components/schemas")
            .and_then(Value::as_object_mut)
            .unwrap();
        token_id_bound(schemas, 49_152);
        let forms = schemas["PromptInput"]["oneOf"].as_array().unwrap();
        let arrays: Vec<&Value> = forms.iter().filter(|f| f["type"] == "array").collect();
        assert_eq!(arrays.len(), 3);
        assert!(arrays.iter().all(|f| f["minItems"] == json!(1)));
        assert_eq!(arrays[0]["items"]["maximum"], json!(49_151));
        assert!(arrays[0].get("maxItems").is_none(), "token ids: any length");
        assert_eq!(arrays[1]["maxItems"], json!(1));
        assert_eq!(arrays[2]["maxItems"], json!(1));
        assert_eq!(arrays[2]["items"]["items"]["maximum"], json!(49_151));
        for request in ["ChatCompletionRequest", "CompletionRequest"] {
            let p = &schemas[request]["properties"];
            assert_eq!(p["response_format"]["oneOf"].as_array().unwrap().len(), 4);
            assert_eq!(p["grammar"]["oneOf"].as_array().unwrap().len(), 4);
        }
    }

    #[test]
    fn the_document_states_the_servers_rules() {
        let doc = crate::openapi::document();
        let s = &doc["components"]["schemas"];
        let seed = &s["ChatCompletionRequest"]["properties"]["seed"];
        assert_eq!(seed["maximum"], json!(u64::MAX), "{seed}");
        assert_eq!(seed["minimum"], json!(0), "{seed}");
        assert_eq!(seed["format"], "uint64", "{seed}");
        let required = s["MessagesRequest"]["required"].as_array().unwrap();
        assert!(required.contains(&json!("max_tokens")));
        let required = s["CountTokensRequest"]["required"].as_array().unwrap();
        assert!(!required.contains(&json!("max_tokens")));
        // Optional JSON-valued fields stay optional in the document (a
        // field typed as a bare object is listed as required otherwise).
        assert_eq!(s["ChatCompletionRequest"]["required"], json!(["messages"]));
        assert_eq!(s["ResponsesRequest"]["required"], json!(["input"]));
        let required = s["CompletionRequest"]["required"].as_array().unwrap();
        assert!(!required.contains(&json!("grammar")), "{required:?}");
        assert!(
            !required.contains(&json!("response_format")),
            "{required:?}"
        );
        assert!(
            s["InputItem"]["required"]
                .as_array()
                .is_none_or(|r| !r.contains(&json!("output")))
        );
        assert_eq!(
            doc["paths"]["/v1/messages/count_tokens"]["post"]["requestBody"]["content"]["application/json"]
                ["schema"]["$ref"],
            "#/components/schemas/CountTokensRequest"
        );
        assert!(s["Block"]["properties"]["type"]["enum"].is_array());
        assert!(s["SystemBlock"]["properties"]["type"]["enum"].is_null());
        assert!(s["SystemPrompt"].to_string().contains("SystemBlock"));
        assert_eq!(s["StopField"]["oneOf"][0]["minLength"], 1);
        assert_eq!(
            s["ChatCompletionRequest"]["then"]["required"][0],
            "logprobs"
        );
        assert_eq!(
            s["ResponsesRequest"]["properties"]["previous_response_id"]["type"],
            "null"
        );
    }
}
