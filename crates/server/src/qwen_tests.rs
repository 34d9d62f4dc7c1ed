//! `qwen4_exp` serving without a model: the real routes' request handling up
//! to admission on the real Qwen3.5/3.6 tokenizer and the family's chat
//! template; images in each API's shape (the model side is not merged, so
//! the server is told here that the model reads images); tool calls in
//! Qwen3.5's XML format read back through the real output parser.

use std::sync::{Arc, OnceLock};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ds4_engine::families::qwen4_exp::DESCRIPTOR;
use ds4_text::{ChatTemplate, Tokenizer};
use serde_json::{Value, json};

use crate::output::Collected;
use crate::prompt;
use crate::request::scripted;
use crate::routes::{chat, messages, responses};
use crate::state::{SharedState, testing};

const VISION_START: u32 = 248053;
const IMAGE_PAD: u32 = 248056;
const VISION_END: u32 = 248054;
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR and the rest";

fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = ds4_models::qwen3_5_tokenizer_dir().expect("the Qwen3.5 tokenizer");
        Arc::new(Tokenizer::from_hf_dir(dir).expect("loads"))
    })
    .clone()
}

fn state(images: bool) -> SharedState {
    let tok = tokenizer();
    let template = ChatTemplate::for_tokenizer(&tok).expect("compiles");
    let mut state = testing::state(&DESCRIPTOR, tok, template, "qwen", 4096);
    Arc::get_mut(&mut state).unwrap().serving.accepts_images = images;
    state
}

fn data_url() -> String {
    format!("data:image/png;base64,{}", STANDARD.encode(PNG))
}

/// The prompt has one `<|vision_start|><|image_pad|><|vision_end|>` per
/// image, between the text that surrounded the image part.
fn assert_one_image_between(prompt: &[u32], before: &str, after: &str) {
    let text = tokenizer().decode(prompt, false).unwrap();
    let at = prompt
        .windows(3)
        .position(|w| w == [VISION_START, IMAGE_PAD, VISION_END])
        .unwrap_or_else(|| panic!("no image placeholder in {text:?}"));
    assert_eq!(
        prompt.iter().filter(|&&t| t == IMAGE_PAD).count(),
        1,
        "{text:?}"
    );
    let head = tokenizer().decode(&prompt[..at], false).unwrap();
    let tail = tokenizer().decode(&prompt[at + 3..], false).unwrap();
    assert!(head.ends_with(before), "{head:?}");
    assert!(tail.starts_with(after), "{tail:?}");
}

fn chat_body(url: &str) -> Value {
    json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look: "},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": " what is it?"},
    ]}]})
}

#[test]
fn chat_image_url_parts_take_their_place_in_the_prompt() {
    let req = serde_json::from_value(chat_body(&data_url())).unwrap();
    let (checked, _) = chat::prepare(&state(true), req).expect("prepared");
    let g = &checked.generation;
    assert_one_image_between(&g.prompt, "Look: ", " what is it?");
    assert_eq!(g.images.len(), 1);
    assert_eq!(g.images[0].media_type, "image/png");
    assert_eq!(&*g.images[0].bytes, PNG);
}

#[test]
fn chat_images_are_refused_with_a_reason() {
    let err = |state: &SharedState, url: &str| {
        let req = serde_json::from_value(chat_body(url)).unwrap();
        let Err(e) = chat::prepare(state, req) else {
            panic!("accepted {url:?}");
        };
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.param.as_deref(), Some("messages[0].content[1]"));
        e.message
    };
    let m = err(&state(true), "https://example.com/cat.png");
    assert!(m.contains("no outbound requests"), "{m}");
    let m = err(&state(true), "data:image/png;base64,R0lGODlhAQ==");
    assert!(m.contains("not a image/png image"), "{m}");
    // Until the model reads images: today's refusal, whatever the image.
    for url in [data_url().as_str(), "https://example.com/cat.png"] {
        let m = err(&state(false), url);
        assert!(m.contains("images are not supported by this model"), "{m}");
    }
}

#[test]
fn responses_input_image_parts_take_their_place_in_the_prompt() {
    let state = state(true);
    let input = serde_json::from_value(json!([{"role": "user", "content": [
        {"type": "input_text", "text": "Look: "},
        {"type": "input_image", "image_url": data_url()},
        {"type": "input_text", "text": " what is it?"},
    ]}]))
    .unwrap();
    let mut images = crate::images::Images::new(state.config.images, true);
    let mut messages = Vec::new();
    responses::input_messages(input, &mut messages, &mut images).unwrap();
    assert_eq!(images.fields, ["input[0].content[1]"]);
    let turn = prompt::ChatTurn {
        messages,
        images: images.list,
        ..Default::default()
    };
    let rendered = prompt::render(&state, turn).unwrap();
    assert_one_image_between(&rendered.tokens, "Look: ", " what is it?");
    assert_eq!(rendered.images.len(), 1);
}

#[test]
fn anthropic_image_blocks_take_their_place_in_the_prompt() {
    let req = json!({"model": "qwen", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look: "},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": STANDARD.encode(PNG)}},
        {"type": "text", "text": " what is it?"},
    ]}]});
    let req = serde_json::from_value(req).unwrap();
    let state = state(true);
    let (turn, _) = messages::conversation(&state, &req, Some(10), &mut Vec::new()).unwrap();
    assert_eq!(turn.images.len(), 1);
    let rendered = prompt::render(&state, turn).unwrap();
    assert_one_image_between(&rendered.tokens, "Look: ", " what is it?");

    let remote = json!({"model": "qwen", "max_tokens": 10, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
    ]}]});
    let req = serde_json::from_value(remote).unwrap();
    let Err(e) = messages::conversation(&state, &req, Some(10), &mut Vec::new()) else {
        panic!("a url source was accepted");
    };
    assert!(e.message.contains("no outbound requests"), "{}", e.message);
    assert_eq!(e.param.as_deref(), Some("messages[0].content[0].source"));
}

#[test]
fn thinking_switches_render_the_templates_block() {
    let prompt_of = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "Hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let req = serde_json::from_value(body).unwrap();
        let (checked, output) = chat::prepare(&state(false), req).expect("prepared");
        let text = tokenizer()
            .decode(&checked.generation.prompt, false)
            .unwrap();
        (text, output.reasoning_open)
    };
    let (on, open) = prompt_of(json!({}));
    assert!(
        on.ends_with("<|im_start|>assistant\n<think>\n") && open,
        "{on:?}"
    );
    let (off, open) = prompt_of(json!({"reasoning_effort": "none"}));
    assert!(off.ends_with("<think>\n\n</think>\n\n") && !open, "{off:?}");
}

#[tokio::test]
async fn xml_tool_calls_come_back_as_json_calls() {
    let out = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
               </function>\n</tool_call>";
    let c = Collected::run(scripted::stream("qwen4_exp", true, false, out))
        .await
        .unwrap();
    assert_eq!(c.text.trim(), "", "{:?}", c.text);
    assert_eq!(c.tool_calls.len(), 1, "{:?}", c.tool_calls);
    assert_eq!(c.tool_calls[0].name, "get_weather");
    let args: Value = serde_json::from_str(&c.tool_calls[0].arguments).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
}
