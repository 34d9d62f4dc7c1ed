//! Chat templates against transformers' `apply_chat_template(tokenize=False)`: the GGUF's own
//! template and small templates exercising tojson, raise_exception, trim/lstrip blocks and
//! pycompat methods (fixtures from tools/oracle/text/generate.py).

mod common;

use common::{read_jsonl, tokenizer};
use ds4_text::{ChatTemplate, RenderOptions, TextError};

#[test]
fn renderings_are_byte_identical_to_transformers() {
    let tok = tokenizer();
    let bos = tok.bos_token().map(|t| t.text.as_str()).unwrap_or_default();
    let eos = tok.eos_token().map(|t| t.text.as_str()).unwrap_or_default();
    let cases = read_jsonl("smollm_chat_template.jsonl");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let source = case["template"]
            .as_str()
            .or(tok.chat_template())
            .expect("a template");
        let template =
            ChatTemplate::new(source, bos, eos).unwrap_or_else(|e| panic!("{name}: {e}"));
        let messages = case["messages"].as_array().expect("messages");
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().expect("flag"),
            tools: case["tools"].as_array().cloned(),
            // transformers passes every named special token.
            extra: [("unk_token", "<|endoftext|>"), ("pad_token", "<|im_end|>")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
                .collect(),
        };
        let ours = template.render(messages, &opts);
        match (
            &ours,
            case.get("expected").and_then(|v| v.as_str()),
            case.get("error"),
        ) {
            (Ok(out), Some(want), _) if out == want => {}
            (Err(TextError::TemplateRaised(msg)), None, Some(want))
                if Some(msg.as_str()) == want.as_str() => {}
            _ => failures.push(format!(
                "{name}: ours {ours:?}\nwant {:?}",
                case.get("expected").or(case.get("error"))
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[test]
fn rendered_chat_encodes_control_tokens_as_ids() {
    let tok = tokenizer();
    let template = ChatTemplate::new(
        tok.chat_template().expect("template"),
        "<|im_start|>",
        "<|im_end|>",
    )
    .expect("compiles");
    let messages = [serde_json::json!({"role": "user", "content": "Hi"})];
    let text = template
        .render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .expect("renders");
    let ids = tok.encode(&text, true).expect("encode");
    assert_eq!(ids.first(), Some(&1), "<|im_start|> is id 1");
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2, "two <|im_end|>");
    assert_eq!(tok.decode(&ids, false).expect("decode"), text);
}
