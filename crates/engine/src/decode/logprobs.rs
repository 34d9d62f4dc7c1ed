//! Log-probabilities for the API's `logprobs` / `top_logprobs` / `echo`.
//!
//! They describe the model's own distribution: a log-softmax of the raw
//! logits row, before the sampling law applies temperature, penalties or
//! truncation (as the OpenAI API reports them). Computing them is opt-in
//! (`TurnConfig::logprobs`), so a turn that does not ask does no extra work.

use crate::error::Result;
use crate::model::{LogitsRows, Model};

/// The log-probability of one token and the most likely alternatives at its
/// position (most likely first).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Log-softmax of `row` at `token`, plus the `top_n` best entries. The sum
/// runs in f64 so a 150k-entry vocabulary does not lose the small terms.
pub fn token_logprobs(row: &[f32], token: u32, top_n: usize) -> TokenLogprobs {
    let max = row
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| f64::from(x - max).exp())
        .sum();
    let log_z = f64::from(max) + sum.ln();
    let lp = |x: f32| (f64::from(x) - log_z) as f32;
    let logprob = row
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&x| lp(x));
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(top_n + 1);
    if top_n > 0 {
        for (i, &x) in row.iter().enumerate() {
            if !x.is_finite() || (top.len() == top_n && x <= top[top_n - 1].1) {
                continue;
            }
            let at = top.partition_point(|&(_, y)| y >= x);
            top.insert(at, (i as u32, x));
            top.truncate(top_n);
        }
    }
    TokenLogprobs {
        token,
        logprob,
        top: top.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    }
}

/// Log-probabilities of every prompt token given the tokens before it (the
/// first token has none: nothing predicts it). Runs on a fresh state, in
/// chunks of `chunk` rows so the all-rows logits stay bounded in memory.
pub fn prompt_logprobs<M: Model>(
    model: &M,
    prompt: &[u32],
    top_n: usize,
    chunk: usize,
) -> Result<Vec<Option<TokenLogprobs>>> {
    let mut state = model.new_state();
    let mut out = Vec::with_capacity(prompt.len());
    if !prompt.is_empty() {
        out.push(None);
    }
    for (c, piece) in prompt.chunks(chunk.max(1)).enumerate() {
        let logits = model.forward(piece, &mut state, LogitsRows::All)?;
        for row in 0..logits.rows {
            // Row r of this chunk predicts prompt position c*chunk + r + 1.
            let next = c * chunk.max(1) + row + 1;
            if let Some(&token) = prompt.get(next) {
                out.push(Some(token_logprobs(logits.row(row), token, top_n)));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_sorted_alternatives() {
        let row = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY];
        let lp = token_logprobs(&row, 2, 2);
        let z: f64 = [1.0f64, 3.0, 2.0].iter().map(|x| x.exp()).sum();
        assert!((f64::from(lp.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((f64::from(lp.top[0].1) - (3.0 - z.ln())).abs() < 1e-6);
        assert_eq!(token_logprobs(&row, 3, 0).logprob, f32::NEG_INFINITY);
        assert!(token_logprobs(&row, 0, 0).top.is_empty());
    }
}
