//! `ds4server bench --nll FILE [--nll-window N] [--nll-max-tokens N]`:
//! the teacher-forced negative log-likelihood of the loaded model over a
//! text, the measure two kernel sets (or two builds, two quantizations) of
//! one model are compared by.
//!
//! The text is tokenized without a chat template (special-token text is
//! not parsed) and cut into non-overlapping windows of `--nll-window`
//! tokens; when the tokenizer puts BOS before a raw prompt, every window
//! starts with BOS and holds `N - 1` text tokens. Each window is prefilled
//! from an empty state (in `--chunk` pieces, every logits row kept), and
//! every position but its first is scored: the NLL of the next token is
//! `logsumexp(logits) - logit[next]`, in f64. A last window too short to
//! score anything is left out. Reported: the tokens scored, the mean NLL
//! (nats per token), the perplexity `exp(mean)`, the backend id and the
//! kernel set, and the wall time.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ds4_engine::{LogitsRows, Model};
use ds4_text::Tokenizer;

use crate::args::BenchArgs;

/// One `--nll` run's result.
#[derive(Debug, Clone, PartialEq)]
pub struct NllReport {
    /// Tokens per window (`--nll-window`).
    pub window: usize,
    pub windows: usize,
    /// Text tokens read from the file (after `--nll-max-tokens`).
    pub text_tokens: usize,
    pub tokens_scored: usize,
    /// Sum of the scored tokens' NLL (nats).
    pub nll_sum: f64,
    /// The backend id (`cpu-avx512-fast`, ...) and the kernel set.
    pub backend: String,
    pub kernels: &'static str,
    pub wall_secs: f64,
}

impl NllReport {
    /// Mean NLL in nats per scored token.
    pub fn mean_nll(&self) -> f64 {
        self.nll_sum / self.tokens_scored.max(1) as f64
    }

    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }
}

/// `ln(sum(exp(row)))` in f64, shifted by the row's maximum so no term
/// overflows. An empty row, a NaN or a +inf is an error (a diverged
/// forward, not a distribution); `-inf` entries are allowed (masked).
pub fn logsumexp(row: &[f32]) -> anyhow::Result<f64> {
    if let Some(i) = row.iter().position(|v| v.is_nan() || *v == f32::INFINITY) {
        anyhow::bail!("logit {i} is {}: the forward diverged", row[i]);
    }
    let max = row
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    if max == f64::NEG_INFINITY {
        anyhow::bail!("a logits row with no finite value ({} entries)", row.len());
    }
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    Ok(max + sum.ln())
}

/// The NLL of `target` under the distribution of `row`:
/// `logsumexp(row) - row[target]` (nats; `+inf` when the row gives the
/// target no probability at all).
pub fn token_nll(row: &[f32], target: u32) -> anyhow::Result<f64> {
    let Some(&logit) = row.get(target as usize) else {
        anyhow::bail!(
            "token {target} is outside the model's vocabulary of {} (the tokenizer does not \
             match the model)",
            row.len()
        );
    };
    Ok(logsumexp(row)? - f64::from(logit))
}

/// The windows of `text`: `window` tokens each, the last one shorter; with
/// `bos`, each window is BOS and `window - 1` text tokens. Windows that
/// score nothing (fewer than two tokens) are left out.
pub fn windows(text: &[u32], window: usize, bos: Option<u32>) -> anyhow::Result<Vec<Vec<u32>>> {
    if window < 2 {
        anyhow::bail!(
            "--nll-window {window}: a window needs at least 2 tokens (its first is never scored)"
        );
    }
    let per = window - usize::from(bos.is_some());
    Ok(text
        .chunks(per)
        .map(|piece| {
            bos.into_iter()
                .chain(piece.iter().copied())
                .collect::<Vec<u32>>()
        })
        .filter(|w| w.len() >= 2)
        .collect())
}

/// The summed NLL and count of the scored positions of one window,
/// prefilled from an empty state in pieces of `chunk` tokens.
pub fn score_window<M: Model>(
    model: &M,
    window: &[u32],
    chunk: usize,
) -> anyhow::Result<(f64, usize)> {
    let mut state = model.new_state();
    let (mut sum, mut scored) = (0.0, 0);
    let mut done = 0;
    for piece in window.chunks(chunk.max(1)) {
        let out = model.forward(piece, &mut state, LogitsRows::All)?;
        if out.rows != piece.len() {
            anyhow::bail!(
                "the model returned {} logits rows for a piece of {} tokens",
                out.rows,
                piece.len()
            );
        }
        for r in 0..out.rows {
            let Some(&next) = window.get(done + r + 1) else {
                break;
            };
            sum += token_nll(out.row(r), next)
                .with_context(|| format!("position {} of a window", done + r))?;
            scored += 1;
        }
        done += piece.len();
    }
    Ok((sum, scored))
}

/// Score the text of `args.nll` with `model`.
pub fn bench_nll<M: Model>(
    model: &M,
    tokenizer: &Tokenizer,
    args: &BenchArgs,
    path: &Path,
    kernels: &'static str,
) -> anyhow::Result<NllReport> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut tokens = tokenizer
        .encode(&text, false)
        .with_context(|| format!("tokenizing {}", path.display()))?;
    if let Some(max) = args.nll_max_tokens {
        tokens.truncate(max);
    }
    let bos = if tokenizer.add_bos() {
        tokenizer.bos_token().map(|t| t.id)
    } else {
        None
    };
    if args.nll_window > model.context_length() {
        anyhow::bail!(
            "--nll-window {} exceeds the model's context of {} tokens",
            args.nll_window,
            model.context_length()
        );
    }
    let windows = windows(&tokens, args.nll_window, bos)?;
    if windows.is_empty() {
        anyhow::bail!(
            "{}: {} tokens, nothing to score (a window needs at least 2)",
            path.display(),
            tokens.len()
        );
    }
    let start = Instant::now();
    let (mut nll_sum, mut tokens_scored) = (0.0, 0);
    for (i, w) in windows.iter().enumerate() {
        let (sum, n) = score_window(model, w, args.chunk).with_context(|| format!("window {i}"))?;
        nll_sum += sum;
        tokens_scored += n;
        eprintln!(
            "window {:>4}/{}: {n} tokens, mean NLL {:.4} (so far {:.4})",
            i + 1,
            windows.len(),
            sum / n.max(1) as f64,
            nll_sum / tokens_scored.max(1) as f64
        );
    }
    let report = NllReport {
        window: args.nll_window,
        windows: windows.len(),
        text_tokens: tokens.len(),
        tokens_scored,
        nll_sum,
        backend: model.backend().to_string(),
        kernels,
        wall_secs: start.elapsed().as_secs_f64(),
    };
    eprintln!(
        "{}: {} tokens scored in {} windows of {}: mean NLL {:.6} nats/token, perplexity {:.4} \
         ({} backend, {} kernels, {:.1} s)",
        path.display(),
        report.tokens_scored,
        report.windows,
        report.window,
        report.mean_nll(),
        report.perplexity(),
        report.backend,
        report.kernels,
        report.wall_secs
    );
    Ok(report)
}

/// The report as CSV (header and one row).
pub fn to_csv(r: &NllReport) -> String {
    let mut out = String::from(
        "window,windows,text_tokens,tokens_scored,mean_nll,perplexity,backend,kernels,wall_s\n",
    );
    let _ = writeln!(
        out,
        "{},{},{},{},{:.6},{:.4},{},{},{:.2}",
        r.window,
        r.windows,
        r.text_tokens,
        r.tokens_scored,
        r.mean_nll(),
        r.perplexity(),
        r.backend,
        r.kernels,
        r.wall_secs
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn logsumexp_matches_the_definition_and_does_not_overflow() {
        // ln(e^1 + e^2 + e^3)
        let want = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!(close(logsumexp(&[1.0, 2.0, 3.0]).unwrap(), want));
        // Uniform over four: ln 4 above the common value.
        assert!(close(logsumexp(&[7.5; 4]).unwrap(), 7.5 + 4f64.ln()));
        // Large logits: a naive sum of exps would overflow f64.
        let big = logsumexp(&[1000.0, 1000.0]).unwrap();
        assert!(close(big, 1000.0 + 2f64.ln()), "{big}");
        // A masked entry contributes nothing.
        assert!(close(logsumexp(&[0.0, f32::NEG_INFINITY]).unwrap(), 0.0));
        assert!(logsumexp(&[]).is_err());
        assert!(logsumexp(&[f32::NEG_INFINITY; 3]).is_err());
        assert!(logsumexp(&[0.0, f32::NAN]).is_err());
        assert!(logsumexp(&[0.0, f32::INFINITY]).is_err());
    }

    #[test]
    fn token_nll_is_minus_the_log_softmax() {
        let row = [2.0f32, 0.0, -1.0, 0.5];
        let z: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        for (t, &v) in row.iter().enumerate() {
            let want = -(f64::from(v).exp() / z).ln();
            assert!(close(token_nll(&row, t as u32).unwrap(), want), "{t}");
        }
        // Uniform: ln V.
        assert!(close(token_nll(&[0.0; 8], 3).unwrap(), 8f64.ln()));
        // A certain token costs (about) nothing.
        assert!(token_nll(&[0.0, 100.0], 1).unwrap() < 1e-40);
        // The logits are f32, the sum is f64: no f32 rounding of the sum.
        let wide = [1e-3f32; 3];
        assert!(close(token_nll(&wide, 0).unwrap(), 3f64.ln()));
        assert!(token_nll(&row, 4).is_err(), "outside the vocabulary");
        assert_eq!(
            token_nll(&[0.0, f32::NEG_INFINITY], 1).unwrap(),
            f64::INFINITY
        );
    }

    #[test]
    fn windows_split_without_overlap_and_drop_unscorable_tails() {
        let text: Vec<u32> = (10..21).collect(); // 11 tokens
        let w = windows(&text, 4, None).unwrap();
        assert_eq!(
            w,
            vec![vec![10, 11, 12, 13], vec![14, 15, 16, 17], vec![18, 19, 20]]
        );
        // 12 tokens: the last window would be one token, scoring nothing.
        let text: Vec<u32> = (10..23).collect();
        assert_eq!(windows(&text, 4, None).unwrap().len(), 3);
        // With BOS (1): each window is BOS + 3 text tokens, every text
        // token scored exactly once.
        let text: Vec<u32> = (10..17).collect(); // 7 tokens
        let w = windows(&text, 4, Some(1)).unwrap();
        assert_eq!(
            w,
            vec![vec![1, 10, 11, 12], vec![1, 13, 14, 15], vec![1, 16]]
        );
        let scored: usize = w.iter().map(|w| w.len() - 1).sum();
        assert_eq!(scored, text.len());
        assert!(windows(&text, 1, None).is_err());
        assert!(windows(&text, 0, Some(1)).is_err());
        assert!(windows(&[], 4, None).unwrap().is_empty());
    }

    #[test]
    fn report_mean_perplexity_and_csv() {
        let r = NllReport {
            window: 4,
            windows: 2,
            text_tokens: 8,
            tokens_scored: 6,
            nll_sum: 6.0 * 2f64.ln(),
            backend: "cpu-avx2-fast".into(),
            kernels: "fast",
            wall_secs: 1.25,
        };
        assert!(close(r.mean_nll(), 2f64.ln()));
        assert!(close(r.perplexity(), 2.0));
        assert_eq!(
            to_csv(&r),
            "window,windows,text_tokens,tokens_scored,mean_nll,perplexity,backend,kernels,wall_s\n\
             4,2,8,6,0.693147,2.0000,cpu-avx2-fast,fast,1.25\n"
        );
    }
}
