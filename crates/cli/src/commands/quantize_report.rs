//! `ds4server quantize-report SRC Q.gguf... [--text FILE]`: how far each
//! quantized file is from its source, teacher-forced over one token
//! sequence: the largest |logit difference|, the mean KL(source ‖
//! quantized) and the top-1 agreement over every position, and, with
//! `--text`, each model's NLL of the text (as `bench --nll` scores it:
//! the same windows, BOS and `logsumexp − logit`).
//!
//! A separate command rather than a `quantize --report` flag: it compares
//! any GGUF with the source (llama.cpp's `llama-quantize` output as well
//! as ours, or two of ours), and loading models is no part of streaming
//! a quantization.
//!
//! Every model is loaded at once (the source and each file), and each
//! window's logits rows are compared as they come, so memory is the
//! models plus one window of logits per model.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ds4_engine::LogitsRows;
use ds4_engine::Model;
use ds4_engine::families::LoadedModel;

use super::bench_nll::{logsumexp, token_nll, windows};

#[derive(Debug, clap::Args)]
pub struct QuantizeReportArgs {
    /// The reference: the unquantized model (a Hugging Face directory or a
    /// GGUF) the files were made from.
    pub source: PathBuf,
    /// The quantized GGUFs to compare with it.
    #[arg(required = true)]
    pub quantized: Vec<PathBuf>,
    /// Score this text (tokenized with the source's tokenizer, no chat
    /// template). Without it: a fixed pseudo-random token sequence.
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Tokens per window (BOS included when the tokenizer adds one).
    /// Default: 512, or the source's context if shorter.
    #[arg(long, value_name = "N")]
    pub window: Option<usize>,
    /// Use at most this many tokens (of the text, or of the sequence).
    /// Default: the whole text; 64 without --text.
    #[arg(long, value_name = "N")]
    pub tokens: Option<usize>,
    /// Forward pieces of at most this many tokens.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub chunk: usize,
    /// The CPU kernel set every model runs with (as for `bench --nll`;
    /// `reference` measures the weights alone, `fast` adds its int8
    /// activations to every model alike).
    #[command(flatten)]
    pub kernels: crate::args::KernelsArg,
}

/// One file's distance from the source.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Distance {
    /// Positions compared (every row of every window).
    pub positions: usize,
    pub max_abs_diff: f64,
    /// Σ KL(source ‖ quantized) over the positions (nats).
    pub kl_sum: f64,
    /// Positions whose argmax is the source's.
    pub top1_same: usize,
    /// Σ NLL of the next token over the scored positions, and their count.
    pub nll_sum: f64,
    pub scored: usize,
}

impl Distance {
    pub fn mean_kl(&self) -> f64 {
        self.kl_sum / self.positions.max(1) as f64
    }

    pub fn top1(&self) -> f64 {
        self.top1_same as f64 / self.positions.max(1) as f64
    }

    pub fn mean_nll(&self) -> f64 {
        self.nll_sum / self.scored.max(1) as f64
    }
}

/// The first index of the largest value (NaN never wins).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// KL(p ‖ q) of the softmaxes of two logits rows, in f64 (nats).
pub fn kl(p_logits: &[f32], q_logits: &[f32]) -> Result<f64> {
    let (zp, zq) = (logsumexp(p_logits)?, logsumexp(q_logits)?);
    let mut sum = 0.0;
    for (&a, &b) in p_logits.iter().zip(q_logits) {
        let lp = f64::from(a) - zp;
        if lp == f64::NEG_INFINITY {
            continue;
        }
        let lq = f64::from(b) - zq;
        sum += lp.exp() * (lp - lq);
    }
    // Rounding can leave a tiny negative for identical rows.
    Ok(sum.max(0.0))
}

/// Adds one window's rows (`rows × vocab`, source and quantized) to `d`;
/// `next[r]` is the token that follows row `r`, if any (scored for NLL).
pub fn compare_rows(
    d: &mut Distance,
    src: &[f32],
    q: &[f32],
    vocab: usize,
    next: &[Option<u32>],
) -> Result<()> {
    if src.len() != q.len() || vocab == 0 || !src.len().is_multiple_of(vocab) {
        bail!(
            "logits of {} and {} values over a vocabulary of {vocab}",
            src.len(),
            q.len()
        );
    }
    for (r, (a, b)) in src
        .chunks_exact(vocab)
        .zip(q.chunks_exact(vocab))
        .enumerate()
    {
        if let Some(i) = b.iter().position(|v| !v.is_finite()) {
            bail!("position {r}: logit {i} is {}", b[i]);
        }
        d.positions += 1;
        for (&x, &y) in a.iter().zip(b) {
            d.max_abs_diff = d.max_abs_diff.max((f64::from(x) - f64::from(y)).abs());
        }
        d.kl_sum += kl(a, b).with_context(|| format!("position {r}"))?;
        d.top1_same += usize::from(argmax(a) == argmax(b));
        if let Some(Some(t)) = next.get(r) {
            d.nll_sum += token_nll(b, *t).with_context(|| format!("position {r}"))?;
            d.scored += 1;
        }
    }
    Ok(())
}

/// All logits rows of `window` from an empty state.
fn window_logits(m: &LoadedModel, window: &[u32], chunk: usize) -> Result<(Vec<f32>, usize)> {
    ds4_engine::with_model!(m, x => {
        let mut state = x.new_state();
        let mut out = Vec::new();
        for piece in window.chunks(chunk.max(1)) {
            let o = x.forward(piece, &mut state, LogitsRows::All)?;
            if o.rows != piece.len() {
                bail!("{} logits rows for a piece of {} tokens", o.rows, piece.len());
            }
            out.extend_from_slice(&o.logits);
        }
        Ok((out, x.vocab_size()))
    })
}

/// A file's size; a directory's: its files' (the safetensors and config).
fn file_size(p: &Path) -> u64 {
    if p.is_dir() {
        std::fs::read_dir(p)
            .map(|d| {
                d.filter_map(|e| e.ok()?.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    } else {
        std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
    }
}

/// `len` tokens of a fixed pseudo-random sequence over `vocab` (a 64-bit
/// LCG, the same for every run; `imatrix --tokens` uses it too).
pub(crate) fn synthetic(vocab: usize, len: usize) -> Vec<u32> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % vocab.max(1) as u64) as u32
        })
        .collect()
}

pub fn quantize_report(args: QuantizeReportArgs) -> Result<()> {
    let set =
        crate::model_source::kernels_for(ds4_engine::families::Device::Cpu, args.kernels.kernels)?;
    ds4_engine::backend::kernel_set::choose(set)
        .map_err(|e| anyhow::anyhow!("--kernels {set}: {e}"))?;
    let load = |p: &Path| LoadedModel::load(p).with_context(|| format!("loading {}", p.display()));
    let source = load(&args.source)?;
    let models = args
        .quantized
        .iter()
        .map(|p| load(p))
        .collect::<Result<Vec<_>>>()?;
    let vocab = ds4_engine::with_model!(&source, x => x.vocab_size());
    let ctx = ds4_engine::with_model!(&source, x => x.context_length());
    for (p, m) in args.quantized.iter().zip(&models) {
        let v = ds4_engine::with_model!(m, x => x.vocab_size());
        if v != vocab {
            bail!(
                "{}: a vocabulary of {v}, the source's is {vocab}",
                p.display()
            );
        }
    }
    let window = args.window.unwrap_or(512.min(ctx));
    if window > ctx {
        bail!("--window {window} exceeds the source's context of {ctx} tokens");
    }
    let (tokens, bos, what) = match &args.text {
        Some(path) => {
            let tok = crate::model_source::load_tokenizer(&args.source)
                .with_context(|| format!("the tokenizer of {}", args.source.display()))?;
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mut t = tok
                .encode(&text, false)
                .with_context(|| format!("tokenizing {}", path.display()))?;
            if let Some(n) = args.tokens {
                t.truncate(n);
            }
            let bos = if tok.add_bos() {
                tok.bos_token().map(|t| t.id)
            } else {
                None
            };
            (t, bos, path.display().to_string())
        }
        None => {
            let n = args.tokens.unwrap_or(64);
            (
                synthetic(vocab, n),
                None,
                format!("{n} pseudo-random tokens"),
            )
        }
    };
    let windows = windows(&tokens, window, bos)?;
    if windows.is_empty() {
        bail!("{what}: {} tokens, nothing to compare", tokens.len());
    }
    let mut src_nll = Distance::default();
    let mut dist = vec![Distance::default(); models.len()];
    for (wi, w) in windows.iter().enumerate() {
        let next: Vec<Option<u32>> = (0..w.len()).map(|r| w.get(r + 1).copied()).collect();
        let (a, _) = window_logits(&source, w, args.chunk)
            .with_context(|| format!("{}: window {wi}", args.source.display()))?;
        compare_rows(&mut src_nll, &a, &a, vocab, &next)
            .with_context(|| format!("{}: window {wi}", args.source.display()))?;
        for ((p, m), d) in args.quantized.iter().zip(&models).zip(&mut dist) {
            let (b, _) = window_logits(m, w, args.chunk)
                .with_context(|| format!("{}: window {wi}", p.display()))?;
            compare_rows(d, &a, &b, vocab, &next)
                .with_context(|| format!("{}: window {wi}", p.display()))?;
        }
        eprintln!("window {}/{} ({} tokens)", wi + 1, windows.len(), w.len());
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "reference {} ({} bytes), {set} kernels; {what}: {} positions in {} windows of {}{}",
        args.source.display(),
        file_size(&args.source),
        src_nll.positions,
        windows.len(),
        window,
        if args.text.is_some() {
            format!(
                "; source NLL {:.4} nats/token over {} scored tokens",
                src_nll.mean_nll(),
                src_nll.scored
            )
        } else {
            String::new()
        }
    );
    let _ = writeln!(
        out,
        "| file | bytes | max abs logit diff | mean KL (nats) | top-1 agreement |{}",
        if args.text.is_some() {
            " NLL | ΔNLL |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "| --- | ---: | ---: | ---: | ---: |{}",
        if args.text.is_some() {
            " ---: | ---: |"
        } else {
            ""
        }
    );
    for (p, d) in args.quantized.iter().zip(&dist) {
        let _ = write!(
            out,
            "| {} | {} | {:.4} | {:.6} | {:.4} |",
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned()
            ),
            file_size(p),
            d.max_abs_diff,
            d.mean_kl(),
            d.top1()
        );
        if args.text.is_some() {
            let _ = write!(
                out,
                " {:.4} | {:+.4} |",
                d.mean_nll(),
                d.mean_nll() - src_nll.mean_nll()
            );
        }
        out.push('\n');
    }
    print!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_is_zero_for_equal_rows_and_matches_the_definition() {
        let p = [1.0f32, 2.0, 0.5, -1.0];
        assert_eq!(kl(&p, &p).unwrap(), 0.0);
        // A shift of every logit is the same distribution.
        let shifted: Vec<f32> = p.iter().map(|x| x + 3.0).collect();
        assert!(kl(&p, &shifted).unwrap() < 1e-12);
        let q = [0.0f32, 0.0, 0.0, 0.0];
        let sp: Vec<f64> = p.iter().map(|&x| f64::from(x).exp()).collect();
        let z: f64 = sp.iter().sum();
        let want: f64 = sp.iter().map(|e| (e / z) * ((e / z) / 0.25).ln()).sum();
        assert!((kl(&p, &q).unwrap() - want).abs() < 1e-12);
        assert!(kl(&q, &p).unwrap() > 0.0);
    }

    #[test]
    fn rows_accumulate_diff_kl_top1_and_nll() {
        let mut d = Distance::default();
        // Two positions, vocabulary 3: the first agrees on the argmax, the
        // second does not.
        let src = [3.0f32, 1.0, 0.0, 0.0, 2.0, 1.0];
        let q = [2.5f32, 1.0, 0.0, 0.0, 1.0, 1.5];
        compare_rows(&mut d, &src, &q, 3, &[Some(1), None]).unwrap();
        assert_eq!(d.positions, 2);
        assert_eq!(d.top1_same, 1);
        assert!((d.max_abs_diff - 1.0).abs() < 1e-12);
        assert_eq!(d.scored, 1);
        assert!((d.nll_sum - token_nll(&q[..3], 1).unwrap()).abs() < 1e-12);
        let want = kl(&src[..3], &q[..3]).unwrap() + kl(&src[3..], &q[3..]).unwrap();
        assert!((d.kl_sum - want).abs() < 1e-12);
        // A diverged quantized forward is an error, not a number.
        let bad = [0.0f32, f32::NAN, 0.0];
        assert!(compare_rows(&mut d, &src[..3], &bad, 3, &[None]).is_err());
        assert!(compare_rows(&mut d, &src, &q[..3], 3, &[None]).is_err());
    }

    #[test]
    fn the_synthetic_sequence_is_fixed_and_in_range() {
        let a = synthetic(100, 50);
        assert_eq!(a, synthetic(100, 50));
        assert!(a.iter().all(|&t| t < 100));
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 20);
    }
}
