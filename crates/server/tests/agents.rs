//! The request shapes coding agents send (Claude Code, Codex, aider and
//! litellm), over a real listening server with the default model: each is
//! served, or refused in words the client recognises (issue 19).

mod common;

use common::{MODEL_ID, start, start_with, user};
use serde_json::{Value, json};

fn message(r: &Value) -> String {
    r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Claude Code's first requests: a system message inside `messages` (its
/// mid-conversation beta), adaptive thinking, its own model names, a
/// thinking budget below Anthropic's minimum, `?beta=true` on the path.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_claude_code_request_shapes() {
    let s = start().await;
    let body = json!({
        "model": "claude-opus-4-8",
        "max_tokens": 4,
        "temperature": 0,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": "The user's shell is bash."},
            {"role": "user", "content": "say ok"},
        ],
        "thinking": {"type": "adaptive"},
        "metadata": {"user_id": "u"},
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "stream": false,
    });
    let (status, r) = s.post("/v1/messages?beta=true", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["model"], MODEL_ID, "the served model is reported");
    assert_eq!(r["type"], "message");
    // The llama family does not reason: adaptive thinking is reported.
    assert!(r["warnings"].to_string().contains("thinking"), "{r}");

    // A system message renders in place: the prompt is longer than
    // without it, and a system message alone is a valid conversation.
    let count = |messages: Value| {
        let s = &s;
        async move {
            let (status, r) = s
                .post(
                    "/v1/messages/count_tokens",
                    &json!({"model": "claude-haiku-4-5", "messages": messages}),
                )
                .await;
            assert_eq!(status, 200, "{r}");
            r["input_tokens"].as_u64().unwrap()
        }
    };
    let without = count(json!([
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "say ok"},
    ]))
    .await;
    let with = count(json!([
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "Be terse."}]},
        {"role": "user", "content": "say ok"},
    ]))
    .await;
    assert!(with > without, "{with} > {without}");

    // Background work under haiku names, a budget below 1024 with a small
    // output limit (the family cannot use it: a warning, not a 400),
    // streamed.
    let small = json!({
        "model": "claude-haiku-4-5-20251001", "max_tokens": 3, "temperature": 0,
        "messages": user("hi"), "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 2},
    });
    let (status, events) = s.post_sse("/v1/messages?beta=true", &small).await;
    assert_eq!(status, 200);
    let start: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(start["message"]["model"], MODEL_ID);
    assert!(
        start["message"]["warnings"]
            .to_string()
            .contains("thinking.budget_tokens = 2 was not applied"),
        "{start}"
    );
    assert_eq!(events.last().unwrap().0.as_deref(), Some("message_stop"));

    // `enabled` still needs its budget; an unknown type names the choices.
    for (thinking, needle) in [
        (json!({"type": "enabled"}), "thinking.budget_tokens"),
        (json!({"type": "sometimes"}), "\"adaptive\""),
    ] {
        let body = json!({"max_tokens": 5, "messages": user("hi"), "thinking": thinking});
        let (status, r) = s.post("/v1/messages", &body).await;
        assert_eq!(status, 400, "{r}");
        assert!(message(&r).contains(needle), "{r}");
    }

    // /v1/models lists the served model; any name is served.
    let (status, m) = s.get("/v1/models/claude-sonnet-4-5").await;
    assert_eq!((status, m["id"].clone()), (200, json!(MODEL_ID)));
}

/// Context overflow as each API words it, with both numbers: OpenAI's
/// sentence (litellm, aider) on chat, responses and completions,
/// Anthropic's (Claude Code, litellm) on messages; the code stays
/// `context_length_exceeded`.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_context_overflow_is_worded_per_api() {
    let s = start_with(|c| c.ctx = Some(64)).await;
    let long = "many words ".repeat(60);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "messages": user(&long)}),
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-4o-mini", "input": long}),
        ),
        ("/v1/completions", json!({"prompt": long})),
    ] {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 400, "{path}: {r}");
        let m = message(&r);
        assert!(
            m.starts_with("This model's maximum context length is 64 tokens. However, your messages resulted in "),
            "{path}: {m}"
        );
        let n: usize = m
            .split("resulted in ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{path}: no token count in {m}"));
        assert!(n > 64, "{m}");
        assert_eq!(r["error"]["code"], "context_length_exceeded", "{path}");
        assert_eq!(r["error"]["type"], "invalid_request_error", "{path}");
    }
    let (status, r) = s
        .post(
            "/v1/messages",
            &json!({"model": "claude-opus-4-8", "max_tokens": 32000, "messages": user(&long)}),
        )
        .await;
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["type"], "error");
    assert_eq!(r["error"]["type"], "invalid_request_error");
    let m = r["error"]["message"].as_str().unwrap();
    let rest = m.strip_prefix("prompt is too long: ").expect(m);
    let (n, tail) = rest.split_once(" tokens > ").expect(m);
    assert!(n.parse::<usize>().unwrap() > 64, "{m}");
    assert_eq!(tail, "64 maximum");
    // A prompt that fits gets what is left of the context, whatever it
    // asked for (Claude Code asks for 32000).
    let (status, r) = s
        .post(
            "/v1/messages",
            &json!({"max_tokens": 32000, "messages": user("hi"), "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
}

/// Codex's Responses shapes: a `function_call_output` whose output is an
/// array of content items, built-in tools beside function tools, no
/// `max_output_tokens` (the server's default limit applies).
#[tokio::test(flavor = "multi_thread")]
async fn default_model_codex_request_shapes() {
    let s = start_with(|c| c.default_max_tokens = Some(3)).await;
    let body = json!({
        "model": "gpt-5.1-codex",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: none"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
            {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "a.txt\nb.txt"}]},
            {"type": "function_call", "call_id": "call_2", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_2", "output": "done"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "description": "run", "parameters": {"type": "object", "properties": {}}},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "grammar"}},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": null,
        "store": false,
        "stream": false,
        "include": [],
        "prompt_cache_key": "abc",
        "temperature": 0,
    });
    let (status, r) = s.post("/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["model"], MODEL_ID);
    // No limit sent: the server's default (3 here) applies.
    assert!(r["usage"]["output_tokens"].as_u64().unwrap() <= 3, "{r}");
    let warnings = r["warnings"].to_string();
    for needle in [
        "tools[1] (type \\\"web_search\\\")",
        "tools[2] (type \\\"custom\\\" \\\"apply_patch\\\")",
    ] {
        assert!(warnings.contains(needle), "{needle} in {warnings}");
    }

    // The same with the array output carrying an image: refused as images
    // are everywhere; an unknown item type is named.
    let mut with_image = body.clone();
    with_image["input"][3]["output"] =
        json!([{"type": "input_image", "image_url": "data:image/png;base64,AA"}]);
    let (status, r) = s.post("/v1/responses", &with_image).await;
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["param"], "input[3].output[0]");
    assert!(
        message(&r).contains("images are not supported by this model"),
        "{r}"
    );
    let mut odd = body.clone();
    odd["input"][3]["output"] = json!(7);
    let (status, r) = s.post("/v1/responses", &odd).await;
    assert_eq!(status, 400, "{r}");
    assert_eq!(r["error"]["param"], "input[3].output");
    let mut file = body;
    file["input"][1]["content"] = json!([{"type": "input_file", "file_id": "f"}]);
    let (status, r) = s.post("/v1/responses", &file).await;
    assert_eq!(status, 400, "{r}");
    assert!(
        message(&r).contains("\"input_file\" is not supported"),
        "{r}"
    );

    // An explicit limit is the client's, above the default.
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": user("Count to twenty."), "max_tokens": 6, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() > 3, "{r}");
}

/// Images and non-function tools get the same answer on the three APIs:
/// images a 400 naming the part, other tools a `warnings` entry.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_images_and_tools_consistent_across_apis() {
    let s = start().await;
    let image_cases = [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]}),
            "messages[0].content[1]",
        ),
        (
            "/v1/responses",
            json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": "what is this"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]}),
            "input[0].content[1]",
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}]}),
            "messages[0].content[1]",
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 5, "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": {}}]}]}]}),
            "messages[1].content[0].content",
        ),
    ];
    for (path, body, field) in image_cases {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 400, "{path}: {r}");
        let m = r["error"]["message"].as_str().unwrap();
        assert!(
            m.contains("images are not supported by this model"),
            "{path}: {m}"
        );
        assert!(m.starts_with(field), "{path}: {m}");
        if path != "/v1/messages" {
            assert_eq!(r["error"]["param"], field);
        } else {
            assert_eq!(r["error"]["type"], "invalid_request_error");
        }
    }

    let tool_cases = [
        (
            "/v1/chat/completions",
            json!({"max_tokens": 2, "messages": user("hi"), "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                {"type": "custom", "custom": {"name": "patch"}}]}),
        ),
        (
            "/v1/responses",
            json!({"max_output_tokens": 2, "input": "hi", "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "web_search_preview"}]}),
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 2, "messages": user("hi"), "tools": [
                {"name": "f", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]}),
        ),
    ];
    for (path, body) in tool_cases {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 200, "{path}: {r}");
        let w = r["warnings"].to_string();
        assert!(
            w.contains("tools[1] (type") && w.contains("was not offered to the model"),
            "{path}: {w}"
        );
    }

    // A type error names the field in plain words, on every API.
    for (path, body, field, needle) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": {"text": "hi"}}]}),
            "messages[0].content",
            "a string or an array of content parts",
        ),
        (
            "/v1/responses",
            json!({"input": 5}),
            "input",
            "a string or an array of input items",
        ),
        (
            "/v1/messages",
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": 5}]}),
            "messages[0].content",
            "a string or an array of content blocks",
        ),
        (
            "/v1/completions",
            json!({"prompt": {"text": 1}}),
            "prompt",
            "a string, an array of token ids",
        ),
    ] {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 400, "{path}: {r}");
        let m = r["error"]["message"].as_str().unwrap();
        assert!(m.starts_with(field) && m.contains(needle), "{path}: {m}");
        assert!(!m.contains("untagged") && !m.contains("variant"), "{m}");
    }
}

/// Model names: any name is served by default; `--model-alias` names are
/// listed; `--strict-model-names` refuses the rest with 404.
#[tokio::test(flavor = "multi_thread")]
async fn default_model_model_names_aliases_and_strict_mode() {
    let s = start_with(|c| {
        c.model_aliases = vec!["gpt-4o".into(), "claude-sonnet-4-5".into()];
        c.strict_model_names = true;
    })
    .await;
    let (status, models) = s.get("/v1/models").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [MODEL_ID, "gpt-4o", "claude-sonnet-4-5"]);
    let (status, m) = s.get("/v1/models/gpt-4o").await;
    assert_eq!((status, m["id"].clone()), (200, json!("gpt-4o")));
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "gpt-4o", "messages": user("hi"), "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["model"], MODEL_ID);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "gpt-4o-mini", "messages": user("hi")}),
        ),
        (
            "/v1/messages",
            json!({"model": "claude-haiku-4-5", "max_tokens": 2, "messages": user("hi")}),
        ),
    ] {
        let (status, r) = s.post(path, &body).await;
        assert_eq!(status, 404, "{path}: {r}");
    }
    let (status, _) = s.get("/v1/models/gpt-9").await;
    assert_eq!(status, 404);
}
