//! `/v1/completions`, `/v1/responses`, `/v1/messages` and count_tokens over
//! a real listening server with the default model.

mod common;

use common::{MODEL_ID, start, user};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn default_model_completions_text_tokens_echo_logprobs() {
    let s = start().await;
    let (status, r) = s
        .post("/v1/completions", &json!({"model": MODEL_ID, "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "text_completion");
    let text = r["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!text.is_empty());
    let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap();

    // The same prompt as token ids, echoed with prompt logprobs.
    let (_, ids) = s
        .post("/v1/completions", &json!({"prompt": [504, 3575, 282, 4649, 314], "max_tokens": 3, "temperature": 0, "echo": true, "logprobs": 2}))
        .await;
    let lp = &ids["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    let generated = ids["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert!(tokens.len() >= 5 && tokens.len() <= 5 + generated, "{lp}");
    assert_eq!(
        lp["token_logprobs"][0],
        Value::Null,
        "nothing predicts the first token"
    );
    assert!(lp["token_logprobs"][1].as_f64().unwrap() < 0.0);
    assert_eq!(lp["top_logprobs"][1].as_object().unwrap().len(), 2);
    let echoed = ids["choices"][0]["text"].as_str().unwrap();
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, echoed);
    assert_eq!(
        lp["text_offset"][1].as_u64().unwrap() as usize,
        tokens[0].as_str().unwrap().len()
    );

    // Streaming: chunks, a finish reason, usage, [DONE].
    let (status, events) = s
        .post_sse("/v1/completions", &json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let usage: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    assert!(prompt_tokens > 0);

    for (body, needle) in [
        (json!({"prompt": [1, 2, 99999999]}), "prompt[2]"),
        (json!({"prompt": ["a", "b"]}), "batches"),
        (json!({"prompt": "x", "logprobs": 9}), "logprobs"),
        (json!({"prompt": "x", "suffix": "y"}), "suffix"),
        (json!({"prompt": {"text": 1}}), "prompt"),
        (json!({"prompt": ""}), "empty"),
    ] {
        let (status, err) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 400, "{body}: {err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(needle),
            "{body}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_anthropic_messages_and_count_tokens() {
    let s = start().await;
    let body = json!({"model": MODEL_ID, "max_tokens": 10, "temperature": 0,
        "system": "You are terse.", "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]});
    let (status, count) = s.post("/v1/messages/count_tokens", &body).await;
    assert_eq!(status, 200, "{count}");
    let input_tokens = count["input_tokens"].as_u64().unwrap();
    let (status, m) = s.post("/v1/messages", &body).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["content"][0]["type"], "text");
    assert_eq!(m["usage"]["input_tokens"].as_u64().unwrap(), input_tokens);
    let stop = m["stop_reason"].as_str().unwrap();
    assert!(stop == "end_turn" || stop == "max_tokens");

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (status, events) = s.post_sse("/v1/messages", &streaming).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_deref().unwrap()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = events
        .iter()
        .filter(|(e, _)| e.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["delta"]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, m["content"][0]["text"].as_str().unwrap());
    let delta: Value = serde_json::from_str(&events[events.len() - 2].1).unwrap();
    assert_eq!(delta["usage"]["output_tokens"], m["usage"]["output_tokens"]);
    assert!(delta["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0);

    // Stop sequences report which one matched.
    let (_, greedy) = s.post("/v1/messages", &json!({"max_tokens": 20, "temperature": 0, "messages": user("Count from one to ten in words.")})).await;
    let said = greedy["content"][0]["text"].as_str().unwrap().to_string();
    if let Some(word) = said.split_whitespace().nth(2) {
        let (_, cut) = s
            .post("/v1/messages", &json!({"max_tokens": 20, "temperature": 0, "stop_sequences": [word], "messages": user("Count from one to ten in words.")}))
            .await;
        assert_eq!(cut["stop_reason"], "stop_sequence", "{cut}");
        assert_eq!(cut["stop_sequence"], word);
    }

    // Errors in Anthropic's shape.
    for (body, status, needle) in [
        (json!({"messages": user("hi")}), 400, "max_tokens"),
        (
            json!({"max_tokens": 5, "messages": user("hi"), "temperature": "warm"}),
            400,
            "temperature",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
            400,
            "image",
        ),
        // Anthropic's temperature is 0..1 (OpenAI's is 0..2).
        (
            json!({"max_tokens": 5, "messages": user("hi"), "temperature": 1.5}),
            400,
            "temperature = 1.5",
        ),
        (
            json!({"max_tokens": 5, "messages": user("hi"), "top_p": -1}),
            400,
            "top_p",
        ),
        (
            json!({"max_tokens": 5, "messages": user("hi"), "top_k": -7}),
            400,
            "top_k",
        ),
        (
            json!({"max_tokens": -5, "messages": user("hi")}),
            400,
            "max_tokens",
        ),
        (
            json!({"max_tokens": 5e40, "messages": user("hi")}),
            400,
            "max_tokens",
        ),
        (
            json!({"max_tokens": 5, "messages": user("hi"), "seed": -1}),
            400,
            "seed",
        ),
        (
            json!({"max_tokens": 5, "messages": user("hi"), "stop_sequences": [""]}),
            400,
            "stop_sequences",
        ),
        (
            json!({"max_tokens": 2000, "messages": user("hi"), "thinking": {"type": "enabled", "budget_tokens": -1}}),
            400,
            "thinking.budget_tokens",
        ),
        (
            json!({"max_tokens": 2000, "messages": user("hi"), "thinking": {"type": "enabled"}}),
            400,
            "thinking.budget_tokens",
        ),
        (
            json!({"max_tokens": 5, "messages": user("hi"), "thinking": {"type": "sometimes"}}),
            400,
            "thinking.type",
        ),
    ] {
        let (got, err) = s.post("/v1/messages", &body).await;
        assert_eq!(got, status, "{body}: {err}");
        assert_eq!(err["type"], "error");
        assert!(err["error"]["type"].is_string());
        assert!(
            err["error"]["message"].as_str().unwrap().contains(needle),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_anthropic_warnings_for_what_is_not_applied() {
    let s = start().await;
    // Temperature 1 is Anthropic's maximum, and valid.
    let (status, ok) = s
        .post(
            "/v1/messages",
            &json!({"max_tokens": 3, "temperature": 1.0, "seed": 5, "messages": user("hi")}),
        )
        .await;
    assert_eq!(status, 200, "{ok}");
    // The llama family has no reasoning markers: thinking and its budget
    // are reported as not applied, streamed or not.
    // (Stop sequences keep the reply short: the budget needs max_tokens > 1024.)
    let body = json!({"max_tokens": 1025, "messages": user("hi"), "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "min_p": 0.1,
        "stop_sequences": [".", "!", "?", "\n"]});
    let (status, m) = s.post("/v1/messages", &body).await;
    assert_eq!(status, 200, "{m}");
    let warnings = m["warnings"].to_string();
    assert!(warnings.contains("thinking was ignored"), "{warnings}");
    assert!(
        warnings.contains("budget_tokens = 1024 was not applied"),
        "{warnings}"
    );
    // min_p is not part of the llama family's nucleus law.
    assert!(warnings.contains("min_p"), "{warnings}");
    assert!(
        m["content"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] != "thinking")
    );
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (_, events) = s.post_sse("/v1/messages", &streaming).await;
    let start: Value = serde_json::from_str(&events[0].1).unwrap();
    assert!(
        start["message"]["warnings"]
            .to_string()
            .contains("budget_tokens"),
        "{start}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_responses_lifecycle() {
    let s = start().await;
    let body = json!({"model": MODEL_ID, "instructions": "Be brief.", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Name a fruit."}]}], "max_output_tokens": 8, "temperature": 0});
    let (status, r) = s.post("/v1/responses", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["status"] == "completed" || r["status"] == "incomplete");
    assert_eq!(r["output"][0]["type"], "message");
    let text = r["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        r["usage"]["total_tokens"].as_u64().unwrap(),
        r["usage"]["input_tokens"].as_u64().unwrap()
            + r["usage"]["output_tokens"].as_u64().unwrap()
    );

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (status, events) = s.post_sse("/v1/responses", &streaming).await;
    assert_eq!(status, 200);
    let parsed: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    for (i, (e, p)) in events.iter().zip(&parsed).enumerate() {
        assert_eq!(p["sequence_number"], i as u64);
        assert_eq!(e.0.as_deref(), p["type"].as_str());
    }
    let kinds: Vec<&str> = parsed.iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    let last = kinds.last().unwrap();
    assert!(*last == "response.completed" || *last == "response.incomplete");
    assert!(
        kinds.contains(&"response.output_text.done")
            && kinds.contains(&"response.output_item.done")
    );
    let streamed: String = parsed
        .iter()
        .filter(|p| p["type"] == "response.output_text.delta")
        .map(|p| p["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(
        parsed.last().unwrap()["response"]["output"][0]["content"][0]["text"],
        text.as_str()
    );

    for (body, needle) in [
        (
            json!({"input": "hi", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": "hi", "max_output_tokens": "many"}),
            "max_output_tokens",
        ),
        (json!({"input": [{"type": "mystery"}]}), "mystery"),
        (
            json!({"input": "hi", "reasoning": {"effort": "extreme"}}),
            "reasoning.effort",
        ),
    ] {
        let (status, err) = s.post("/v1/responses", &body).await;
        assert_eq!(status, 400, "{body}: {err}");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(needle),
            "{err}"
        );
    }
    // The llama family does not reason: asking for it is reported.
    let (_, w) = s
        .post(
            "/v1/responses",
            &json!({"input": "hi", "max_output_tokens": 2, "reasoning": {"effort": "high"}}),
        )
        .await;
    assert!(
        w["warnings"][0].as_str().unwrap().contains("reasoning"),
        "{w}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn default_model_tools_render_and_tool_results_round_trip() {
    let s = start().await;
    let tools = json!([{"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]);
    let messages = json!([
        {"role": "user", "content": "What time is it in Oslo?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"Europe/Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    ]);
    let (status, r) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "tools": tools, "max_tokens": 8, "temperature": 0}),
        )
        .await;
    assert_eq!(status, 200, "{r}");
    let with_tools = r["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, plain) = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 1, "temperature": 0}),
        )
        .await;
    // The tool description went into the prompt.
    assert!(with_tools > plain["usage"]["prompt_tokens"].as_u64().unwrap() + 20);
    let (status, count) = s
        .post("/v1/messages/count_tokens", &json!({"messages": [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_time", "input": {"tz": "UTC"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "12:00"}]},
        ], "tools": [{"name": "get_time", "input_schema": {"type": "object"}}]}))
        .await;
    assert_eq!(status, 200, "{count}");
    assert!(count["input_tokens"].as_u64().unwrap() > 30);
}
