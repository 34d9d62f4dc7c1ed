//! `ds4server imatrix MODEL --text FILE`: an importance matrix for
//! `quantize --imatrix`, collected with our own forward, as llama.cpp's
//! `llama-imatrix` collects one (`tools/imatrix/imatrix.cpp`
//! `compute_imatrix`):
//!
//! * the text is tokenized with BOS in front when the tokenizer adds one,
//!   cut into chunks of `--chunk-size` tokens (its `-c`, default 512; at
//!   least two chunks' worth of tokens are needed), each chunk's first
//!   token replaced by BOS, and each chunk is evaluated from an empty
//!   state in one forward: every token of it feeds the matrix;
//! * the perplexity is computed as llama-imatrix prints it: over the
//!   second half of each chunk (its `first = n_ctx / 2`), `Final estimate:
//!   PPL = … +/- …`;
//! * the sums come from a product observer installed before the model
//!   loads (`ds4_engine::observe`, `imatrix_collect`), are renamed to the
//!   tensors `quantize` writes (`imatrix_names`) and written in llama.cpp's
//!   GGUF form (`imatrix_write`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ds4_engine::families::{Device, LoadedModel};
use ds4_engine::{LogitsRows, Model};

use super::bench_nll::token_nll;
use super::imatrix_collect::{Collector, MIN_DENSE_ROWS};
use super::imatrix_write::Provenance;

#[derive(Debug, clap::Args)]
pub struct ImatrixArgs {
    /// The model whose products are observed: a GGUF or a Hugging Face
    /// directory (the same one `quantize` will read).
    pub model: PathBuf,
    /// The calibration text (tokenized with the model's tokenizer, no chat
    /// template). llama-imatrix's `-f`.
    #[arg(long, short = 'f', value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Without --text: this many tokens of a fixed pseudo-random sequence
    /// (for models without a tokenizer, such as test fixtures).
    #[arg(long, value_name = "N", conflicts_with = "text")]
    pub tokens: Option<usize>,
    /// Where to write the matrix (llama.cpp's GGUF imatrix form).
    #[arg(long, short = 'o', value_name = "FILE", default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// Tokens per chunk, each evaluated from an empty state
    /// (llama-imatrix's `-c`).
    #[arg(long, short = 'c', value_name = "N", default_value_t = 512)]
    pub chunk_size: usize,
    /// Process at most this many chunks (default: all).
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Skip the perplexity (only the last logits row of each chunk is
    /// computed).
    #[arg(long)]
    pub no_ppl: bool,
    #[command(flatten)]
    pub kernels: crate::args::KernelsArg,
}

/// llama-imatrix's chunks: `tokens` (BOS already in front when the
/// tokenizer adds one) cut into `n`-token chunks, each one's first token
/// replaced by BOS; at most `max` chunks.
pub fn chunks(tokens: &[u32], n: usize, bos: Option<u32>, max: Option<usize>) -> Vec<Vec<u32>> {
    let count = (tokens.len() / n.max(1)).min(max.unwrap_or(usize::MAX));
    (0..count)
        .map(|i| {
            let mut c = tokens[i * n..(i + 1) * n].to_vec();
            if let Some(b) = bos {
                c[0] = b;
            }
            c
        })
        .collect()
}

/// The token sequence, its BOS, and what to record as the dataset.
fn tokens(
    args: &ImatrixArgs,
    text: Option<&str>,
    vocab: usize,
) -> Result<(Vec<u32>, Option<u32>, String)> {
    let (Some(path), Some(text)) = (&args.text, text) else {
        let n = args.tokens.unwrap_or(0);
        return Ok((
            super::quantize_report::synthetic(vocab, n),
            None,
            format!("{n} pseudo-random tokens"),
        ));
    };
    let tok = crate::model_source::load_tokenizer(&args.model)
        .with_context(|| format!("the tokenizer of {}", args.model.display()))?;
    let bos = if tok.add_bos() {
        tok.bos_token().map(|t| t.id)
    } else {
        None
    };
    // llama-imatrix tokenizes with `add_special`: BOS first when added.
    let mut t: Vec<u32> = bos.into_iter().collect();
    t.extend(
        tok.encode(text, false)
            .with_context(|| format!("tokenizing {}", path.display()))?,
    );
    Ok((t, bos, path.display().to_string()))
}

pub fn imatrix(args: ImatrixArgs) -> Result<()> {
    let started = Instant::now();
    let n = args.chunk_size;
    if args.text.is_none() && args.tokens.is_none() {
        bail!(
            "give the calibration text with --text FILE (or --tokens N for a model without a tokenizer)"
        );
    }
    if n < MIN_DENSE_ROWS {
        bail!(
            "--chunk-size {n}: llama-imatrix leaves out products of fewer than {MIN_DENSE_ROWS} rows, so a chunk needs at least {MIN_DENSE_ROWS} tokens"
        );
    }
    // Read before the (longer) model load, so a wrong path fails at once.
    let text = match &args.text {
        Some(p) => {
            Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?)
        }
        None => None,
    };
    let set = crate::model_source::kernels_for(Device::Cpu, args.kernels.kernels)?;
    ds4_engine::backend::kernel_set::choose(set)
        .map_err(|e| anyhow::anyhow!("--kernels {set}: {e}"))?;
    // Installed before the load: weights placed from now on are observed.
    let collector = Arc::new(Collector::default());
    ds4_engine::observe::install(collector.clone())?;
    let (family, _) = ds4_engine::families::detect(&args.model)
        .with_context(|| format!("{}: which family", args.model.display()))?;
    let model = LoadedModel::load(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let (vocab, ctx) = ds4_engine::with_model!(&model, x => (x.vocab_size(), x.context_length()));
    if n > ctx {
        bail!("--chunk-size {n} exceeds the model's context of {ctx} tokens");
    }
    let (tokens, bos, dataset) = tokens(&args, text.as_deref(), vocab)?;
    if tokens.len() < 2 * n {
        bail!(
            "{dataset}: {} tokens; llama-imatrix needs at least 2 × --chunk-size = {} tokens",
            tokens.len(),
            2 * n
        );
    }
    let chunks = chunks(&tokens, n, bos, args.chunks);
    eprintln!(
        "{}: {} tokens, {} chunks of {n}, {set} kernels",
        dataset,
        tokens.len(),
        chunks.len()
    );
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    for (i, chunk) in chunks.iter().enumerate() {
        let rows = if args.no_ppl {
            LogitsRows::Last
        } else {
            LogitsRows::All
        };
        let out = ds4_engine::with_model!(&model, x => {
            let mut state = x.new_state();
            x.forward(chunk, &mut state, rows)
        })
        .with_context(|| format!("{}: chunk {i}", args.model.display()))?;
        if let Some(w) = collector.non_finite(&ds4_engine::observe::placements()) {
            bail!("chunk {i}: non-finite activations entering `{w}`");
        }
        if !args.no_ppl {
            // llama-imatrix's `process_logits` from `first = n / 2`.
            for r in n / 2..n - 1 {
                let v = token_nll(out.row(r), chunk[r + 1])
                    .with_context(|| format!("chunk {i}, position {r}"))?;
                nll += v;
                nll2 += v * v;
                count += 1;
            }
            eprint!("[{}]{:.4},", i + 1, (nll / count as f64).exp());
        } else {
            eprint!("[{}]", i + 1);
        }
    }
    eprintln!();
    let placements = ds4_engine::observe::placements();
    let by_source = collector.entries(&placements)?;
    let entries =
        super::imatrix_names::output_entries(&args.model, family.descriptor.name, &by_source)?;
    let provenance = Provenance {
        datasets: vec![dataset],
        chunk_count: chunks.len() as u32,
        chunk_size: n as u32,
    };
    super::imatrix_write::write(&args.output, &entries, &provenance)?;
    if count > 1 {
        let mean = nll / count as f64;
        let var = nll2 / count as f64 - mean * mean;
        let ppl = mean.exp();
        println!(
            "Final estimate: PPL = {ppl:.4} +/- {:.5} (NLL {mean:.6} nats/token over {count} tokens)",
            (var.max(0.0) / (count - 1) as f64).sqrt() * ppl
        );
    }
    println!(
        "wrote {} ({} entries from {} chunks of {n} tokens) in {:.1} s",
        args.output.display(),
        entries.len(),
        chunks.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_llama_imatrix_s() {
        // BOS 9 in front, chunks of 4: each chunk's first token is BOS.
        let t = [9, 1, 2, 3, 4, 5, 6, 7, 8, 10];
        let c = chunks(&t, 4, Some(9), None);
        assert_eq!(c, [vec![9, 1, 2, 3], vec![9, 5, 6, 7]]);
        assert_eq!(chunks(&t, 4, None, Some(1)), [vec![9, 1, 2, 3]]);
        assert_eq!(chunks(&t, 3, None, None).len(), 3);
    }
}
