//! `deepseek_v4` serving without a model (the family's engine side lands
//! separately): the real routes' request handling up to admission, on the
//! real DeepSeek-V4 tokenizer, against fixtures from ds4's own code
//! (`tools/oracle/deepseek_v4/`); the output side through the real parser and
//! tool memory; the worker's per-token structure decision.

use std::sync::{Arc, OnceLock};

use ds4_engine::families::FamilyDescriptor;
use ds4_sampling::{Law, SamplingParams};
use ds4_text::Tokenizer;
use serde_json::{Value, json};

use crate::admission;
use crate::output::{Collected, OutputParser, TurnStream};
use crate::request::scripted;
use crate::routes::{chat, messages};
use crate::state::{SharedState, testing};

/// What the engine's `deepseek_v4` family registers: the ds4 law and its
/// defaults (the serving rules are keyed by the name alone).
pub static DEEPSEEK_V4: FamilyDescriptor = FamilyDescriptor {
    name: "deepseek_v4",
    model_types: &["deepseek_v4"],
    gguf_architectures: &["deepseek4"],
    law: Law::Ds4,
    sampling_defaults: Law::Ds4.default_params(),
};

pub const MODEL_ID: &str = "deepseek-v4-flash";

pub fn tokenizer() -> Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let dir = ds4_models::deepseek_v4_tokenizer_dir().expect("the DeepSeek-V4 tokenizer");
        Arc::new(Tokenizer::from_hf_dir(dir).expect("loads"))
    })
    .clone()
}

pub fn state(ctx: usize) -> SharedState {
    testing::state(&DEEPSEEK_V4, tokenizer(), None, MODEL_ID, ctx)
}

fn fixture(name: &str) -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/deepseek_v4/"
    );
    let text = std::fs::read_to_string(format!("{path}{name}")).expect("fixture");
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

fn text_of(tokens: &[u32]) -> String {
    tokenizer().decode(tokens, false).expect("decodes")
}

/// Prompt tokens and whether the reply starts thinking, for an OpenAI chat
/// body, through the chat route.
fn chat_prompt(state: &SharedState, body: Value) -> (Vec<u32>, admission::Generation) {
    let req = serde_json::from_value(body).expect("a chat request");
    let (checked, _) = chat::prepare(state, req).expect("prepared");
    (checked.generation.prompt.clone(), checked.generation)
}

#[test]
fn every_ds4_prompt_fixture_renders_identically_through_the_routes() {
    let rows = fixture("prompts.jsonl");
    assert!(rows.len() >= 20);
    for row in rows {
        let name = row["name"].as_str().unwrap();
        let want = row["prompt"].as_str().unwrap();
        let state = state(row["ctx"].as_u64().unwrap() as usize);
        for pair in row["memory"].as_array().unwrap() {
            let id = pair[0].as_str().unwrap().to_string();
            state.tool_memory.remember(&[id], pair[1].as_str().unwrap());
        }
        let (tokens, thinks) = match row["api"].as_str().unwrap() {
            "chat" => {
                let (tokens, g) = chat_prompt(&state, row["body"].clone());
                (tokens, g.thinks)
            }
            _ => {
                let req: crate::types::anthropic::MessagesRequest =
                    serde_json::from_value(row["body"].clone()).expect("a messages request");
                let mut warnings = Vec::new();
                let (turn, _) =
                    messages::conversation(&state, &req, req.max_tokens, &mut warnings).unwrap();
                let r = crate::prompt::render(&state, turn).unwrap();
                (r.tokens, r.reasoning_open)
            }
        };
        assert_eq!(text_of(&tokens), want, "{name}: prompt text");
        assert_eq!(
            tokens,
            tokenizer().encode(want, true).unwrap(),
            "{name}: tokens"
        );
        assert_eq!(thinks, row["think"] != "none", "{name}: thinking");
    }
}

fn sampled(g: &admission::Generation, state: &SharedState) -> (SamplingParams, Vec<String>) {
    let mut g = admission::Generation {
        sampling: g.sampling,
        thinks: g.thinks,
        ..admission::Generation::default()
    };
    let params = admission::sampling(state, &mut g).unwrap();
    (params, g.warnings)
}

#[test]
fn thinking_replies_sample_as_ds4_and_structure_is_greedy_only_with_tools() {
    let state = state(32768);
    let knobs = json!({"temperature": 0.2, "top_p": 0.5, "top_k": 5, "min_p": 0.1});
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in knobs
            .as_object()
            .unwrap()
            .iter()
            .chain(extra.as_object().unwrap())
        {
            b[k] = v.clone();
        }
        b
    };
    let tool =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);

    // Thinking (the default): ds4 ignores the knobs.
    let (_, g) = chat_prompt(&state, body(json!({"tools": tool})));
    assert!(g.thinks && g.structural);
    let (params, warnings) = sampled(&g, &state);
    assert_eq!(
        (params.temperature, params.top_p, params.top_k, params.min_p),
        (1.0, 1.0, 0, 0.05)
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("temperature, top_p, top_k, min_p ignored")),
        "{warnings:?}"
    );

    // Not thinking: the request's sampling under the ds4 law.
    let (_, g) = chat_prompt(&state, body(json!({"think": false})));
    assert!(!g.thinks && !g.structural, "no tools: nothing structural");
    let (params, warnings) = sampled(&g, &state);
    assert_eq!(
        (params.temperature, params.top_p, params.top_k, params.min_p),
        (0.2, 0.5, 5, 0.1)
    );
    assert!(warnings.is_empty(), "{warnings:?}");

    // tool_choice none offers no tools.
    let (_, g) = chat_prompt(&state, body(json!({"tools": tool, "tool_choice": "none"})));
    assert!(!g.structural);
}

#[test]
fn model_aliases_select_the_mode_and_other_names_are_served() {
    let state = state(32768);
    let msg = json!([{"role": "user", "content": "hi"}]);
    let (_, g) = chat_prompt(&state, json!({"model": "deepseek-chat", "messages": msg}));
    assert!(!g.thinks);
    let (_, g) = chat_prompt(
        &state,
        json!({"model": "deepseek-reasoner", "messages": msg}),
    );
    assert!(g.thinks);
    // Any other name is served (by default) without selecting a mode.
    let (_, g) = chat_prompt(&state, json!({"model": "gpt-4o", "messages": msg}));
    assert!(g.thinks);
    let req = serde_json::from_value(json!({"reasoning_effort": "huge", "messages": msg})).unwrap();
    let e = chat::prepare(&state, req).err().unwrap();
    assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
}

/// Not what canonical DSML of its arguments would be (the blank line after
/// the invoke tag): replay is visible.
const SAMPLED: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n\n\
    <｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n\
    <｜DSML｜parameter name=\"command\" string=\"true\">ls  -la</｜DSML｜parameter>\n\
    </｜DSML｜invoke>\n</｜DSML｜tool_calls>";

/// The reply `generated` to `first` as a client would send it back, then a
/// tool result.
async fn round_trip(state: &SharedState, generated: &str) -> (String, Value) {
    let first = json!({"messages": [{"role": "user", "content": "list"}], "tools": [
        {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]});
    let parser =
        OutputParser::new(&state.profile, true, true).with_memory(Some(state.tool_memory.clone()));
    let stream = TurnStream::new(
        scripted::events(generated, ds4_engine::decode::FinishReason::StopToken),
        parser,
    );
    let c = Collected::run(stream).await.unwrap();
    let (p1, _) = chat_prompt(state, first.clone());
    let calls: Vec<Value> = c
        .tool_calls
        .iter()
        .map(|t| json!({"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}))
        .collect();
    let mut next = first;
    next["messages"] = json!([
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": c.text, "reasoning_content": c.reasoning, "tool_calls": calls},
        {"role": "tool", "tool_call_id": c.tool_calls[0].id, "content": "a.txt"},
    ]);
    (text_of(&p1), next)
}

#[tokio::test]
async fn a_sampled_block_is_replayed_exactly_when_its_ids_come_back() {
    let state = state(32768);
    let generated = format!("Need a listing.</think>Listing.{SAMPLED}");
    let (p1, next) = round_trip(&state, &generated).await;
    let p2 = text_of(&chat_prompt(&state, next.clone()).0);
    // The next prompt extends what the model saw and wrote, byte for byte:
    // the live session is an exact prefix of it.
    let lived = format!("{p1}{generated}<｜end▁of▁sentence｜>");
    assert!(p2.starts_with(&lived), "{p2}");
    // A client that invents its own id gets canonical DSML instead.
    let mut other = next;
    other["messages"][1]["tool_calls"][0]["id"] = json!("call_unknown");
    let p3 = text_of(&chat_prompt(&state, other).0);
    assert!(!p3.contains(SAMPLED) && p3.contains("name=\"command\" string=\"true\">ls  -la<"));
}

#[tokio::test]
async fn replay_memory_is_only_written_for_families_that_replay() {
    let state = state(32768);
    let generated = format!("x</think>{SAMPLED}");
    let parser = OutputParser::new(&state.profile, true, true);
    let stream = TurnStream::new(
        scripted::events(&generated, ds4_engine::decode::FinishReason::StopToken),
        parser,
    );
    let c = Collected::run(stream).await.unwrap();
    assert_eq!(c.tool_calls.len(), 1);
    assert!(
        state.tool_memory.is_empty(),
        "no memory given, none written"
    );
    round_trip(&state, &generated).await;
    assert_eq!(state.tool_memory.len(), 1);
}
