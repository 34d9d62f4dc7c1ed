//! MTP vs AR decode speed and acceptance on a qwen4_exp checkpoint (ignored
//! by default; run in release):
//!
//! ```text
//! cargo nextest run --release -p ds4-engine --run-ignored only -E 'test(/mtp_bench/)' --no-capture
//! QWEN4_BENCH_DIR=/tmp/qwen4_bench cargo nextest run ...   # another checkpoint
//! ```
//!
//! Asserts only what must hold at any speed: greedy MTP emits the AR tokens.

use std::path::PathBuf;

use ds4_engine::decode::{self, LiveSession, TurnConfig, TurnRequest};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_sampling::{Law, Sampler, SamplingParams};

#[test]
#[ignore = "speed measurement; run explicitly in release"]
fn mtp_bench_vs_ar() {
    let dir = std::env::var_os("QWEN4_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp/tiny_a")
        });
    let model = Qwen4ExpModel::from_hf_dir(&dir).unwrap();
    let cfg = TurnConfig {
        max_tokens: 96,
        stop_token_ids: vec![],
        prefill_chunk: 2048,
        logprobs: None,
        cancel: Default::default(),
    };
    for temperature in [0.0, 0.6] {
        let mut ar_tokens = Vec::new();
        for depth in 0..=3usize {
            let (mut emitted, mut secs) = (0usize, 0f64);
            let (mut drafted, mut accepted, mut cycles) = (0, 0, 0);
            let mut outs = Vec::new();
            for p in 0..8u32 {
                let prompt: Vec<u32> = (0..12).map(|i| (p * 31 + i * 17) % 120 + 3).collect();
                let params = SamplingParams {
                    temperature,
                    ..Law::Nucleus.default_params()
                };
                let mut s = Sampler::new(Law::Nucleus, params, u64::from(p)).unwrap();
                let mut session = LiveSession::new(&model);
                let r = decode::generate(
                    &model,
                    &mut session,
                    TurnRequest {
                        prompt: &prompt,
                        sampler: &mut s,
                        config: cfg.clone(),
                        mtp_depth: Some(depth),
                    },
                    &mut (),
                )
                .unwrap();
                emitted += r.tokens.len();
                secs += r.timings.decode.as_secs_f64();
                if let Some(m) = &r.mtp {
                    drafted += m.drafted_total();
                    accepted += m.accepted_total();
                    cycles += m.cycles;
                }
                outs.push(r.tokens);
            }
            if depth == 0 {
                ar_tokens = outs;
            } else if temperature == 0.0 {
                assert_eq!(outs, ar_tokens, "greedy MTP depth {depth} differs from AR");
            }
            eprintln!(
                "T={temperature} depth {depth}: {:.1} tok/s, accepted {accepted}/{drafted} ({:.1}%), mean accepted length {:.2}",
                emitted as f64 / secs,
                if drafted > 0 {
                    100.0 * accepted as f64 / drafted as f64
                } else {
                    0.0
                },
                if cycles > 0 {
                    accepted as f64 / cycles as f64
                } else {
                    0.0
                }
            );
        }
    }
}
