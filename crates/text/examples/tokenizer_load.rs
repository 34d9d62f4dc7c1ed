//! Load time of a tokenizer folder (`Tokenizer::from_hf_dir`), e.g. the
//! pulled Qwen3.5 folder, whose BPE is built from a tiktoken rank file or
//! read from the cached build:
//!
//!     cargo run --release --example tokenizer_load -- ~/.cache/ds4server/tokenizers/qwen3.5 5
//!
//! Prints each load's wall time. Remove `*.tokenizer.json` from the folder
//! first to time a build from the ranks (the first load then writes the cache).

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: tokenizer_load DIR [RUNS]");
    let runs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(3);
    for run in 0..runs {
        let start = Instant::now();
        let tok = ds4_text::Tokenizer::from_hf_dir(&dir).expect("loads");
        let took = start.elapsed();
        println!(
            "load {run}: {:.3} s ({} ids)",
            took.as_secs_f64(),
            tok.vocab_size()
        );
    }
}
