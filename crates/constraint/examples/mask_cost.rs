//! Per-token cost of constrained decoding on the default model: runs real
//! turns under a few grammars (AR, greedy and sampled) and reports the time
//! `llguidance` spent per mask (rollback, consumption and the mask itself;
//! median and p99) next to the turn's decode time per token.
//!
//! `cargo run --release -p ds4-constraint --example mask_cost [-- --turns N]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use ds4_constraint::{Constraint, ForcedTool, Grammar, Vocabulary, tool_call_grammar};
use ds4_engine::Model;
use ds4_engine::decode::{
    self, Flow, LiveSession, TokenEvent, TokenMask, TurnConfig, TurnObserver, TurnRequest,
};
use ds4_engine::families::llama::load_llama;
use ds4_sampling::{Sampler, SamplingParams};
use ds4_text::{Tokenizer, ToolCallFormat};
use serde_json::json;

struct Constrained(Constraint);

impl TurnObserver for Constrained {
    fn token(&mut self, event: TokenEvent) -> Flow {
        self.0.push(event.token);
        Flow::Continue
    }
    fn allowed_after(&mut self, pending: &[u32]) -> Option<TokenMask> {
        Some(self.0.allowed_after(pending))
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() -> anyhow::Result<()> {
    let turns: usize = std::env::args()
        .skip_while(|a| a != "--turns")
        .nth(1)
        .map_or(Ok(4), |n| n.parse())?;
    let path = ds4_models::default_model_path()?;
    let model = load_llama(&path)?;
    let tok = Arc::new(Tokenizer::load(&path)?);
    let start = Instant::now();
    let vocab = Vocabulary::new(tok.clone(), tok.stop_token_ids())?;
    println!(
        "vocabulary: {} tokens, built in {:.1} ms",
        vocab.len(),
        start.elapsed().as_secs_f64() * 1e3
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 4},
            "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
        },
        "required": ["name", "age", "tags", "address"]
    });
    let tool = tool_call_grammar(
        ToolCallFormat::Llama3Json,
        &[ForcedTool {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}),
        }],
    )?;
    let grammars = [
        ("json_schema", Grammar::JsonSchema(schema)),
        ("json_object", Grammar::JsonObject),
        (
            "regex",
            Grammar::Regex("[A-Z][a-z]+( [a-z]+){3,8}\\.".into()),
        ),
        ("tool_call", tool),
    ];
    // SmolLM2's chat format.
    let text = "<|im_start|>user\nDescribe a person as JSON.<|im_end|>\n<|im_start|>assistant\n";
    let prompt = tok.encode(text, true)?;
    let law = model.descriptor().law;
    println!("grammar      temp  masks  median_us  p99_us  max_us  decode_ms_per_token");
    for (name, grammar) in &grammars {
        for temperature in [0.0, 0.8] {
            let mut all = Vec::new();
            let (mut decode, mut tokens) = (Duration::ZERO, 0usize);
            for seed in 0..turns as u64 {
                let params = SamplingParams {
                    temperature,
                    ..model.descriptor().sampling_defaults
                };
                let mut sampler = Sampler::new(law, params, seed)?;
                let mut obs = Constrained(vocab.compile(grammar)?);
                let mut session = LiveSession::new(&model);
                let r = decode::generate(
                    &model,
                    &mut session,
                    TurnRequest {
                        prompt: &prompt,
                        sampler: &mut sampler,
                        config: TurnConfig {
                            max_tokens: 96,
                            stop_token_ids: tok.stop_token_ids().to_vec(),
                            prefill_chunk: 256,
                            logprobs: None,
                            cancel: Default::default(),
                        },
                        mtp_depth: Some(0),
                    },
                    &mut obs,
                )?;
                decode += r.timings.decode;
                tokens += r.timings.decode_tokens.max(1);
                all.extend_from_slice(&obs.0.timings().per_mask);
            }
            all.sort();
            println!(
                "{name:<12} {temperature:>4}  {:>5}  {:>9.1}  {:>6.1}  {:>6.1}  {:>8.2}",
                all.len(),
                percentile(&all, 0.5).as_secs_f64() * 1e6,
                percentile(&all, 0.99).as_secs_f64() * 1e6,
                all.last().copied().unwrap_or_default().as_secs_f64() * 1e6,
                decode.as_secs_f64() * 1e3 / tokens as f64
            );
        }
    }
    Ok(())
}
