//! Families do not reach each other: what the server decides for a request
//! (law, sampling, thinking, prompt, text profile, serving rules) is bound
//! by the family descriptor's name, so changing a Qwen-side parameter (its
//! descriptor's defaults, its template) changes Qwen's outcome and leaves
//! DeepSeek-V4's exactly as it was, and the reverse.

use ds4_engine::families::FamilyDescriptor;
use ds4_sampling::{Law, SamplingParams};
use ds4_text::{ChatTemplate, TextProfile};
use serde_json::{Value, json};

use crate::admission;
use crate::deepseek_tests::{self, DEEPSEEK_V4};
use crate::family::Serving;
use crate::routes::chat;
use crate::state::{SharedState, testing};

fn qwen_descriptor() -> &'static FamilyDescriptor {
    &ds4_engine::families::qwen4_exp::DESCRIPTOR
}

/// Qwen with other defaults (the change on the Qwen side).
static QWEN_CHANGED: FamilyDescriptor = FamilyDescriptor {
    name: "qwen4_exp",
    model_types: &["qwen4_exp"],
    gguf_architectures: &[],
    law: Law::Nucleus,
    sampling_defaults: SamplingParams {
        temperature: 0.3,
        top_p: 0.7,
        top_k: 5,
        min_p: 0.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.0,
    },
};

/// DeepSeek-V4 with other defaults (the change on the DeepSeek side).
static DEEPSEEK_CHANGED: FamilyDescriptor = FamilyDescriptor {
    name: "deepseek_v4",
    model_types: &["deepseek_v4"],
    gguf_architectures: &[],
    law: Law::Ds4,
    sampling_defaults: SamplingParams {
        temperature: 0.9,
        top_p: 0.8,
        top_k: 40,
        min_p: 0.2,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    },
};

/// A Qwen-style template with `enable_thinking`.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}\
<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}";

/// A Qwen state. Its tokenizer only carries the prompt text (a byte-level
/// one, so the prompt decodes back exactly); the family's decisions do not
/// depend on it.
fn qwen(descriptor: &'static FamilyDescriptor, template: &str) -> SharedState {
    let template = ChatTemplate::new(template, "", "").expect("template");
    testing::state(
        descriptor,
        deepseek_tests::tokenizer(),
        Some(template),
        "m",
        4096,
    )
}

/// Everything a request can observe of the server's decisions.
#[derive(Debug, PartialEq)]
struct Outcome {
    law: Law,
    profile: TextProfile,
    serving: Serving,
    /// (sampling, warnings, reply starts thinking, prompt text) of a
    /// thinking request and of a non-thinking one.
    thinking: (SamplingParams, Vec<String>, bool, String),
    plain: (SamplingParams, Vec<String>, bool, String),
}

fn turn(state: &SharedState, body: Value) -> (SamplingParams, Vec<String>, bool, String) {
    let req = serde_json::from_value(body).expect("chat request");
    let (mut checked, _) = chat::prepare(state, req).expect("prepared");
    let g = &mut checked.generation;
    let params = admission::sampling(state, g).expect("sampling");
    let text = state.tokenizer.decode(&g.prompt, false).expect("decodes");
    (params, g.warnings.clone(), g.thinks, text)
}

fn outcome(state: &SharedState) -> Outcome {
    let body = |effort: &str| {
        json!({
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
            "temperature": 0.4,
            "reasoning_effort": effort,
        })
    };
    Outcome {
        law: state.descriptor.law,
        profile: state.profile,
        serving: state.serving,
        thinking: turn(state, body("high")),
        plain: turn(state, body("none")),
    }
}

fn deepseek(descriptor: &'static FamilyDescriptor) -> SharedState {
    testing::state(descriptor, deepseek_tests::tokenizer(), None, "m", 4096)
}

#[test]
fn a_qwen_change_leaves_deepseek_unchanged_and_the_reverse() {
    let d0 = outcome(&deepseek(&DEEPSEEK_V4));
    // DeepSeek-V4 as ds4: its law, its forced thinking sampling (the
    // request's temperature reported ignored), its request temperature
    // over the ds4 defaults otherwise, its own prompt.
    assert_eq!(d0.law, Law::Ds4);
    let ds4 = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        min_p: 0.05,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    };
    assert_eq!(d0.thinking.0, ds4);
    assert!(
        d0.thinking.1[0].starts_with("temperature ignored"),
        "{:?}",
        d0.thinking.1
    );
    assert_eq!(
        d0.plain.0,
        SamplingParams {
            temperature: 0.4,
            ..ds4
        }
    );
    assert_eq!(
        d0.thinking.3,
        "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜><think>"
    );
    assert_eq!(
        d0.plain.3,
        "<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜></think>"
    );

    let q0 = outcome(&qwen(qwen_descriptor(), CHATML));
    // Qwen as before: the nucleus law over its defaults, nothing forced
    // while thinking, the template's prompt.
    assert_eq!(q0.law, Law::Nucleus);
    let nucleus = SamplingParams {
        temperature: 0.4,
        ..Law::Nucleus.default_params()
    };
    assert_eq!((q0.thinking.0, q0.plain.0), (nucleus, nucleus));
    assert!(q0.thinking.1.is_empty() && q0.plain.1.is_empty());
    assert_eq!(
        q0.thinking.3,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    );
    assert!(q0.thinking.2 && !q0.plain.2);

    // The Qwen side changes: its outcome changes, DeepSeek's does not.
    let q1 = outcome(&qwen(
        &QWEN_CHANGED,
        &CHATML.replace("<|im_end|>", "<|end|>"),
    ));
    assert_ne!(q1.thinking.0, q0.thinking.0);
    assert_ne!(q1.thinking.3, q0.thinking.3);
    assert_eq!(outcome(&deepseek(&DEEPSEEK_V4)), d0);

    // The DeepSeek side changes: its defaults show where the request left a
    // knob to them, its ds4 thinking rules do not move, Qwen does not move.
    let d1 = outcome(&deepseek(&DEEPSEEK_CHANGED));
    assert_eq!(
        d1.thinking.0, ds4,
        "thinking sampling is ds4's, not the defaults'"
    );
    assert_eq!(
        d1.plain.0,
        SamplingParams {
            temperature: 0.4,
            ..DEEPSEEK_CHANGED.sampling_defaults
        }
    );
    assert_eq!(d1.plain.3, d0.plain.3);
    assert_eq!(outcome(&qwen(qwen_descriptor(), CHATML)), q0);
}

#[test]
fn ds4_request_rules_do_not_reach_qwen_and_qwens_do_not_reach_deepseek() {
    let msg = json!([{"role": "user", "content": "hi"}]);
    let (q, d) = (qwen(qwen_descriptor(), CHATML), deepseek(&DEEPSEEK_V4));
    let prepare = |state: &SharedState, body: Value| {
        chat::prepare(state, serde_json::from_value(body).unwrap()).map(|(c, _)| c.generation)
    };
    // ds4's effort names and model aliases are DeepSeek's only.
    assert!(prepare(&q, json!({"messages": msg, "reasoning_effort": "max"})).is_err());
    assert!(prepare(&d, json!({"messages": msg, "reasoning_effort": "max"})).is_ok());
    // Any name is served on Qwen, but ds4's alias selects nothing there.
    assert_eq!(
        prepare(&q, json!({"messages": msg, "model": "deepseek-chat"}))
            .unwrap()
            .thinks,
        prepare(&q, json!({"messages": msg})).unwrap().thinks
    );
    assert!(
        !prepare(&d, json!({"messages": msg, "model": "deepseek-chat"}))
            .unwrap()
            .thinks
    );
    // `minimal` turns Qwen's thinking off but is ds4's High.
    assert!(
        !prepare(&q, json!({"messages": msg, "reasoning_effort": "minimal"}))
            .unwrap()
            .thinks
    );
    assert!(
        prepare(&d, json!({"messages": msg, "reasoning_effort": "minimal"}))
            .unwrap()
            .thinks
    );
    // ds4's `think` switch means nothing to Qwen.
    let plain = prepare(&q, json!({"messages": msg})).unwrap();
    let think_false = prepare(&q, json!({"messages": msg, "think": false})).unwrap();
    assert_eq!(plain.prompt, think_false.prompt);
    assert!(
        !prepare(&d, json!({"messages": msg, "think": false}))
            .unwrap()
            .thinks
    );
    // Tools: DSML structure is greedy on DeepSeek only.
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    assert!(
        !prepare(&q, json!({"messages": msg, "tools": tools}))
            .unwrap()
            .structural
    );
    assert!(
        prepare(&d, json!({"messages": msg, "tools": tools}))
            .unwrap()
            .structural
    );
}
