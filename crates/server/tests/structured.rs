//! Structured outputs over a real listening server with the default model:
//! `response_format` (json_object, json_schema), the `grammar` extension on
//! chat and completions, forced tool calls (OpenAI `required` / named,
//! Anthropic `any` / `tool`, streaming and not), refusals that name what is
//! unsupported, a grammar that admits no token, and `count_tokens`
//! unaffected by `tool_choice`; the Responses API's `text.format`.

mod common;

use common::{MODEL_ID, TestServer, start, user};
use serde_json::{Value, json};

fn chat(extra: Value) -> Value {
    let mut body =
        json!({ "model": MODEL_ID, "messages": user("Describe a cat."), "max_tokens": 80 });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            b.insert(k.clone(), v.clone());
        }
    }
    body
}

fn weather_tool() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city", "unit"],
                // Closed: an open object lets a sampled call add keys until
                // the token limit cuts it (then the finish is `length`).
                "additionalProperties": false
            }
        }
    }, {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}}, "required": ["zone"], "additionalProperties": false}}
    }])
}

async fn content(s: &TestServer, body: Value) -> (Value, String) {
    let (status, r) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{r}");
    let text = r["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    (r, text)
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_response_format_and_grammar() {
    let s = start().await;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            "colour": {"type": "string", "enum": ["black", "white", "ginger"]}
        },
        "required": ["name", "legs", "colour"],
        "additionalProperties": false
    });
    for seed in 0..3 {
        let (r, text) = content(
            &s,
            chat(json!({"seed": seed, "temperature": 1.0, "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "strict": true, "schema": schema}}})),
        )
        .await;
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 16, "{v}");
        assert!((0..=8).contains(&v["legs"].as_i64().unwrap()), "{v}");
        assert!(
            ["black", "white", "ginger"].contains(&v["colour"].as_str().unwrap()),
            "{v}"
        );
        assert_eq!(v.as_object().unwrap().len(), 3);
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }
    let (_, text) = content(
        &s,
        chat(json!({"temperature": 0, "response_format": {"type": "json_object"}})),
    )
    .await;
    // A json_object reply is an object (it may be cut by max_tokens, so only
    // its start is checked here; the e2e suite checks complete ones).
    assert!(text.starts_with('{'), "{text:?}");

    // The same seed replays under a grammar.
    let body = chat(
        json!({"seed": 7, "temperature": 1.0, "grammar": {"type": "regex", "value": "(Meow|Purr)( (meow|purr)){2,5}\\."}}),
    );
    let (_, a) = content(&s, body.clone()).await;
    let (_, b) = content(&s, body).await;
    assert_eq!(a, b);
    let words: Vec<&str> = a.trim_end_matches('.').split(' ').collect();
    assert!(a.ends_with('.') && (3..=6).contains(&words.len()), "{a:?}");

    // Completions take the grammar too (a bare string is Lark).
    let (status, r) = s
        .post(
            "/v1/completions",
            &json!({"model": MODEL_ID, "prompt": "The answer is", "max_tokens": 8, "grammar": "start: \" \" (\"yes\" | \"no\")"}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let t = r["choices"][0]["text"].as_str().unwrap();
    assert!(t == " yes" || t == " no", "{t:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_forced_tool_calls() {
    let s = start().await;
    for (choice, want) in [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "get_time"}}),
            Some("get_time"),
        ),
    ] {
        let (r, _) = content(
            &s,
            chat(json!({"tools": weather_tool(), "tool_choice": choice, "temperature": 0})),
        )
        .await;
        let choice0 = &r["choices"][0];
        assert_eq!(choice0["finish_reason"], "tool_calls", "{r}");
        let call = &choice0["message"]["tool_calls"][0]["function"];
        if let Some(name) = want {
            assert_eq!(call["name"], name);
        }
        let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{args}");
    }
    // Streaming: the call arrives as tool_call deltas.
    let (status, events) = s
        .post_sse(
            "/v1/chat/completions",
            &chat(json!({"tools": weather_tool(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "stream": true, "temperature": 0.7, "seed": 1})),
        )
        .await;
    assert_eq!(status, 200);
    let mut args = String::new();
    let mut name = String::new();
    let mut finish = Value::Null;
    for (_, data) in &events {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let d = &v["choices"][0]["delta"];
        if let Some(f) = d["tool_calls"][0]["function"]["name"].as_str() {
            name.push_str(f);
        }
        if let Some(a) = d["tool_calls"][0]["function"]["arguments"].as_str() {
            args.push_str(a);
        }
        if !v["choices"][0]["finish_reason"].is_null() {
            finish = v["choices"][0]["finish_reason"].clone();
        }
    }
    assert_eq!(name, "get_weather");
    assert_eq!(finish, "tool_calls");
    let args: Value = serde_json::from_str(&args).unwrap();
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
        "{args}"
    );

    // Anthropic: `any` and `tool`, and count_tokens ignores the choice.
    let tools = json!([{"name": "get_weather", "input_schema": weather_tool()[0]["function"]["parameters"]}]);
    for choice in [
        json!({"type": "any"}),
        json!({"type": "tool", "name": "get_weather"}),
    ] {
        let body = json!({"model": MODEL_ID, "max_tokens": 80, "messages": user("Weather in Paris?"), "tools": tools, "tool_choice": choice});
        let (status, r) = s.post("/v1/messages", &body).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["stop_reason"], "tool_use", "{r}");
        let block = r["content"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "tool_use")
            .unwrap();
        assert_eq!(block["name"], "get_weather");
        assert!(block["input"]["city"].is_string(), "{block}");
        let (status, n) = s.post("/v1/messages/count_tokens", &body).await;
        assert_eq!(status, 200, "{n}");
        let mut plain = body.clone();
        plain.as_object_mut().unwrap().remove("tool_choice");
        let (_, m) = s.post("/v1/messages/count_tokens", &plain).await;
        assert_eq!(n["input_tokens"], m["input_tokens"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_unsupported_constraints_are_refused_by_name() {
    let s = start().await;
    let cases = [
        (
            chat(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}}}),
            ),
            "response_format",
            "not",
        ),
        (
            chat(json!({"response_format": {"type": "xml"}})),
            "response_format.type",
            "json_schema",
        ),
        (
            chat(json!({"grammar": {"type": "lark", "value": "start: ("}})),
            "grammar",
            "grammar",
        ),
        (
            chat(json!({"grammar": {"type": "cfg", "value": "x"}})),
            "grammar.type",
            "lark",
        ),
        (
            chat(
                json!({"tools": weather_tool(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            ),
            "tool_choice",
            "nope",
        ),
        (
            chat(json!({"grammar": "start: \"a\"", "response_format": {"type": "json_object"}})),
            "grammar",
            "cannot be combined",
        ),
    ];
    for (body, param, needle) in cases {
        let (status, r) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{r}");
        assert_eq!(r["error"]["param"], param, "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
    }
    // A grammar that admits no token (its only terminal is the empty
    // intersection of two languages): the turn ends with a clear finish
    // reason instead of looping.
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &chat(
                json!({"grammar": {"type": "lark", "value": "start: X\nX: /[a-z]+/ & /[0-9]+/\n"}}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "no_allowed_token", "{r}");
}

/// The Responses API's `text.format` (the schema's fields beside `type`, as
/// Codex and `responses.parse(text_format=…)` send it) constrains the reply
/// like chat's `response_format`, is echoed in the response object, and is
/// refused by name when malformed or combined with a forced call.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_responses_text_format() {
    let s = start().await;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8}
        },
        "required": ["name", "legs"],
        "additionalProperties": false
    });
    let format = json!({"type": "json_schema", "name": "cat", "strict": true, "schema": schema});
    for seed in 0..3 {
        let body = json!({"model": MODEL_ID, "input": "Describe a cat.", "max_output_tokens": 80,
            "seed": seed, "temperature": 1.0, "text": {"format": format}});
        let (status, r) = s.post("/v1/responses", &body).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["status"], "completed", "{r}");
        assert_eq!(r["text"]["format"], format, "{r}");
        let text = r["output"][0]["content"][0]["text"].as_str().unwrap();
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v["name"].as_str().unwrap().chars().count() <= 16, "{v}");
        assert!((0..=8).contains(&v["legs"].as_i64().unwrap()), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
    }
    // No format: plain text, and the echo says so.
    let body = json!({"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4});
    let (status, r) = s.post("/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["text"], json!({"format": {"type": "text"}}), "{r}");

    let refused = [
        (json!({"text": "json"}), "text", "object"),
        (
            json!({"text": {"format": {"type": "xml"}}}),
            "text.format.type",
            "json_schema",
        ),
        (
            json!({"text": {"format": {"type": "json_schema", "name": 3, "schema": {}}}}),
            "text.format.name",
            "string",
        ),
        (
            json!({"text": {"format": {"type": "json_object"}}, "tool_choice": "required",
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}]}),
            "tool_choice",
            "cannot be combined",
        ),
    ];
    for (extra, param, needle) in refused {
        let mut body = json!({"model": MODEL_ID, "input": "Hi", "max_output_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, r) = s.post("/v1/responses", &body).await;
        assert_eq!(status, 400, "{r}");
        assert_eq!(r["error"]["param"], param, "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{msg}");
    }
}
