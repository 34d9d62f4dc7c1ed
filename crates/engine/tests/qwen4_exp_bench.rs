//! Prefill and decode speed of a qwen4_exp checkpoint (ignored by default;
//! nothing to assert beyond finite logits):
//!
//! ```text
//! cargo nextest run --release -p ds4-engine --run-ignored only -E 'test(/qwen4_bench/)' --no-capture
//! QWEN4_BENCH_DIR=/tmp/qwen4_bench QWEN4_BENCH_PREFILL=512 cargo nextest run ...   # a bigger model
//! ```
//!
//! `tools/oracle/qwen4_exp/bench_model.py DIR` writes a medium random
//! checkpoint (hidden 512, 16 experts) for kernel measurements; the default
//! is the tiny `tiny_a` fixture.

use std::path::PathBuf;
use std::time::Instant;

use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::{LogitsRows, Model};

#[test]
#[ignore = "speed measurement; run explicitly in release"]
fn qwen4_bench_prefill_decode() {
    let dir = std::env::var_os("QWEN4_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp/tiny_a")
        });
    let model = Qwen4ExpModel::from_hf_dir(&dir).unwrap();
    let vocab = model.vocab_size() as u32;
    let steps = 64usize;
    let prefill: usize = std::env::var("QWEN4_BENCH_PREFILL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(model.context_length() - steps)
        .min(model.context_length() - steps);
    // A deterministic token stream with an EOS every 50 tokens.
    let eos = model.config().eos_token_id.unwrap_or(0);
    let tokens: Vec<u32> = (0..prefill + steps)
        .map(|i| {
            if i % 50 == 49 {
                eos
            } else {
                3 + (i as u32 * 2_654_435_761u32) % (vocab - 3)
            }
        })
        .collect();
    for round in 0..2 {
        let mut st = model.new_state();
        let t0 = Instant::now();
        let out = model
            .forward(&tokens[..prefill], &mut st, LogitsRows::Last)
            .unwrap();
        let pre = t0.elapsed().as_secs_f64();
        assert!(out.logits.iter().all(|v| v.is_finite()));
        let t1 = Instant::now();
        for t in prefill..prefill + steps {
            model
                .forward(&tokens[t..t + 1], &mut st, LogitsRows::Last)
                .unwrap();
        }
        let dec = t1.elapsed().as_secs_f64();
        eprintln!(
            "{} round {round}: prefill {prefill} tokens {:.1} tok/s, decode {steps} steps {:.1} tok/s",
            dir.display(),
            prefill as f64 / pre,
            steps as f64 / dec
        );
    }
}
