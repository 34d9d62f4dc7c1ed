//! Prefill and decode speed of a glm5_next checkpoint (ignored by default;
//! nothing to assert beyond finite logits):
//!
//! ```text
//! cargo nextest run --release -p ds4-engine --run-ignored only -E 'test(/glm5_bench/)' --no-capture
//! GLM5_BENCH_DIR=/tmp/glm5_bench GLM5_BENCH_PREFILL=512 cargo nextest run ...   # a bigger model
//! ```
//!
//! `tools/oracle/glm5_next/bench_model.py DIR` writes a medium random
//! checkpoint (hidden 512, 16 experts); the default is the tiny `tiny_a`
//! fixture.

use std::path::PathBuf;
use std::time::Instant;

use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::{LogitsRows, Model};

#[test]
#[ignore = "speed measurement; run explicitly in release"]
fn glm5_bench_prefill_decode() {
    let dir = std::env::var_os("GLM5_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm5_next/tiny_a")
        });
    let model = Glm5NextModel::from_hf_dir(&dir).unwrap();
    let vocab = model.vocab_size() as u32;
    let steps = 64usize;
    let prefill: usize = std::env::var("GLM5_BENCH_PREFILL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(model.context_length() - steps)
        .min(model.context_length() - steps);
    let tokens: Vec<u32> = (0..prefill + steps)
        .map(|i| 2 + (i as u32).wrapping_mul(2_654_435_761u32) % (vocab - 2))
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
