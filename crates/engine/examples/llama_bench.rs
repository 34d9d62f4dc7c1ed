//! Prefill and decode speed of a llama-family model.
//!
//! `cargo run --release -p ds4-engine --example llama_bench -- [MODEL] [PROMPT_TOKENS] [DECODE_TOKENS]`
//! (MODEL defaults to the default SmolLM2 GGUF in the user cache).

use std::path::PathBuf;
use std::time::Instant;

use ds4_engine::families::llama::load_llama;
use ds4_engine::{LogitsRows, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = match args.next() {
        Some(p) => PathBuf::from(p),
        None => dirs_default()?,
    };
    let prompt_len: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(42);
    let decode_len: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(128);
    let t0 = Instant::now();
    let model = load_llama(&path)?;
    eprintln!(
        "loaded {} in {:.2}s",
        path.display(),
        t0.elapsed().as_secs_f64()
    );
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    for round in 0..3 {
        let mut state = model.new_state();
        let t = Instant::now();
        let mut out = model.forward(&prompt, &mut state, LogitsRows::Last)?;
        let prefill = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..decode_len {
            let row = out.last_row();
            let next = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32;
            out = model.forward(&[next], &mut state, LogitsRows::Last)?;
        }
        let decode = t.elapsed().as_secs_f64();
        println!(
            "round {round}: prefill {prompt_len} tokens {:.1} tok/s, decode {decode_len} tokens {:.1} tok/s",
            prompt_len as f64 / prefill,
            decode_len as f64 / decode
        );
    }
    Ok(())
}

fn dirs_default() -> Result<PathBuf, Box<dyn std::error::Error>> {
    Ok(ds4_models::default_model_path()?)
}
