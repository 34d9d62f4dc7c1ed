//! The nucleus law (spec section 2; reference: the MTPLX host sampler).
//!
//! All arithmetic is f64. The order of every floating-point operation below
//! is part of the law (the oracle in `tools/oracle/sampling/nucleus_ref.py`
//! performs the same operations in the same order), because a one-ulp change
//! in a probability can move a categorical draw across a boundary:
//!
//! - penalised logit: `l[j] - (frequency * count + presence)`;
//! - scaled logit `l/T`, shift `m = max(l/T)`, weights `e = exp(l/T - m)`;
//! - normaliser `Z` = sequential sum of `e` in ascending id order, `p = e/Z`;
//! - nucleus mass accumulated sequentially in rank order;
//! - support mass `S` summed sequentially in ascending id order, `p/S`;
//! - draw: sequential cumsum, divided by its last entry, first entry `> u`.
//!
//! Tokens whose probability is exactly 0 (masked by -inf, or underflowed)
//! are dropped from the support: they add nothing to any sum and
//! `searchsorted(side='right')` can never select them, so dropping them does
//! not change any draw, and it keeps a full-vocabulary support sparse.

use crate::counts::TokenCounts;
use crate::error::SampleError;
use crate::params::SamplingParams;

/// Above this top_k a partial selection over the whole row beats the
/// streaming insertion used for small k (k = 20 by default).
const STREAMING_TOP_K_MAX: usize = 256;

/// Reusable buffers, so a draw over a 248k-entry row does not allocate.
#[derive(Debug, Default, Clone)]
pub(crate) struct Scratch {
    /// Penalised logits, then reused for the full-vocabulary probabilities.
    probs: Vec<f64>,
    /// Index buffer for partial selection / full ranking.
    order: Vec<u32>,
    /// Streaming top-k: (probability, id), best first.
    top: Vec<(f64, u32)>,
    /// The support in ascending id order and its renormalised probabilities.
    pub(crate) ids: Vec<u32>,
    pub(crate) weights: Vec<f64>,
}

/// What the law decided before any draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// temperature <= 0: this token, no draw.
    Greedy(u32),
    /// Draw from `scratch.ids` / `scratch.weights`.
    Draw,
}

/// Step 1: reject rows with NaN, +inf, or nothing above -inf.
pub(crate) fn validate(row: &[f32]) -> Result<(), SampleError> {
    if row.is_empty() {
        return Err(SampleError::EmptyRow);
    }
    let (mut nan, mut pos_inf, mut neg_inf) = (0usize, 0usize, 0usize);
    for &v in row {
        if !v.is_finite() {
            if v.is_nan() {
                nan += 1;
            } else if v > 0.0 {
                pos_inf += 1;
            } else {
                neg_inf += 1;
            }
        }
    }
    if nan > 0 || pos_inf > 0 || neg_inf == row.len() {
        return Err(SampleError::NonFiniteLogits { nan, pos_inf, neg_inf, len: row.len() });
    }
    Ok(())
}

/// Clamp a penalty to [-2, 2] (spec section 2, step 2).
fn clamp_penalty(x: f64) -> f64 {
    x.clamp(-2.0, 2.0)
}

/// Steps 1-7: validate, penalise, and either answer greedily or leave the
/// renormalised support in `scratch.ids` / `scratch.weights`.
pub(crate) fn plan(
    row: &[f32],
    params: &SamplingParams,
    counts: &TokenCounts,
    scratch: &mut Scratch,
) -> Result<Plan, SampleError> {
    validate(row)?;
    let v = row.len();
    // Step 2: penalised row in f64.
    let l = &mut scratch.probs;
    l.clear();
    l.extend(row.iter().map(|&x| f64::from(x)));
    let presence = clamp_penalty(params.presence_penalty);
    let frequency = clamp_penalty(params.frequency_penalty);
    if (presence != 0.0 || frequency != 0.0) && !counts.is_empty() {
        for (token, count) in counts.iter() {
            // Counts for ids outside the row cannot be penalised (there is
            // no such logit); they are skipped, not an error.
            if let Some(x) = l.get_mut(token as usize) {
                *x -= frequency * f64::from(count) + presence;
            }
        }
    }
    // Step 3: greedy. The first maximum wins (lowest id on ties); validity
    // guarantees some entry is finite, and penalties keep finite values
    // finite, so the max is a real logit.
    let (argmax, l_max) = first_max(l);
    if params.temperature <= 0.0 {
        return Ok(Plan::Greedy(argmax));
    }
    // Step 4: softmax over the full vocabulary. Division by T > 0 is
    // monotone, so max(l/T) is exactly l_max/T.
    let t = params.temperature;
    let m = l_max / t;
    let mut z = 0.0f64;
    if m.is_finite() {
        for x in l.iter_mut() {
            *x = (*x / t - m).exp();
            z += *x;
        }
    } else {
        // T so small that l_max/T overflows f64: the softmax is (and, for
        // every T small enough to overflow, stays) its T -> 0+ limit, uniform
        // over the tied maxima. `l/T - max(l/T)` would be inf - inf = NaN.
        for x in l.iter_mut() {
            *x = if *x == l_max { 1.0 } else { 0.0 };
            z += *x;
        }
    }
    for x in l.iter_mut() {
        *x /= z;
    }
    let probs = &scratch.probs;

    // Steps 5-6: rank, top-k, nucleus.
    let top_k = usize::try_from(params.top_k).unwrap_or(0);
    let top_k_active = top_k > 0 && top_k < v;
    let top_p = params.top_p;
    let nucleus_active = top_p > 0.0 && top_p < 1.0;
    scratch.ids.clear();
    if top_k_active {
        let ranked = top_k_order(probs, top_k, &mut scratch.order, &mut scratch.top);
        scratch.ids.extend(nucleus_prefix(probs, ranked, nucleus_active.then_some(top_p)));
    } else if nucleus_active {
        let order = &mut scratch.order;
        order.clear();
        order.extend((0..v as u32).filter(|&i| probs[i as usize] > 0.0));
        order.sort_unstable_by(|&a, &b| rank_cmp(probs, a, b));
        scratch.ids.extend(nucleus_prefix(probs, order, Some(top_p)));
    } else {
        scratch.ids.extend((0..v as u32).filter(|&i| probs[i as usize] > 0.0));
    }
    // Step 7: support in ascending id order, renormalised.
    scratch.ids.retain(|&i| probs[i as usize] > 0.0);
    scratch.ids.sort_unstable();
    let mut mass = 0.0f64;
    for &i in &scratch.ids {
        mass += probs[i as usize];
    }
    scratch.weights.clear();
    if scratch.ids.is_empty() || mass <= 0.0 || !mass.is_finite() {
        // Unreachable for a valid row (the argmax has probability 1/Z > 0
        // and is always ranked first); kept so the law is total.
        scratch.ids.clear();
        scratch.ids.push(argmax);
        scratch.weights.push(1.0);
    } else {
        scratch.weights.extend(scratch.ids.iter().map(|&i| probs[i as usize] / mass));
    }
    Ok(Plan::Draw)
}

/// Index and value of the first maximum of a row (NaN-free by validation).
fn first_max(l: &[f64]) -> (u32, f64) {
    let mut best = 0usize;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    (best as u32, l[best])
}

/// Rank order: probability descending, lowest id first on exact ties.
/// Probabilities are finite and >= +0, so `total_cmp` is the numeric order.
fn rank_cmp(probs: &[f64], a: u32, b: u32) -> std::cmp::Ordering {
    probs[b as usize].total_cmp(&probs[a as usize]).then(a.cmp(&b))
}

/// The first `k` tokens of the rank order, in rank order (`0 < k < V`).
fn top_k_order<'a>(
    probs: &[f64],
    k: usize,
    order: &'a mut Vec<u32>,
    top: &mut Vec<(f64, u32)>,
) -> &'a [u32] {
    order.clear();
    if k <= STREAMING_TOP_K_MAX {
        // One pass keeping the best k sorted. Ids arrive in ascending order,
        // so a later token with an equal probability ranks after every kept
        // one: it is inserted after them, and displaces nothing when full.
        top.clear();
        for (i, &p) in probs.iter().enumerate() {
            if top.len() == k && p <= top[k - 1].0 {
                continue;
            }
            let at = top.partition_point(|&(q, _)| q >= p);
            if top.len() == k {
                top.pop();
            }
            top.insert(at, (p, i as u32));
        }
        order.extend(top.iter().map(|&(_, i)| i));
    } else {
        order.extend(0..probs.len() as u32);
        order.select_nth_unstable_by(k - 1, |&a, &b| rank_cmp(probs, a, b));
        order.truncate(k);
        order.sort_unstable_by(|&a, &b| rank_cmp(probs, a, b));
    }
    order
}

/// Step 6 over a ranked list: keep a token iff the full-vocabulary mass
/// accumulated before it is `< top_p` (so the first is always kept).
fn nucleus_prefix<'a>(
    probs: &'a [f64],
    ranked: &'a [u32],
    top_p: Option<f64>,
) -> impl Iterator<Item = u32> + 'a {
    let mut before = 0.0f64;
    ranked.iter().copied().take_while(move |&i| {
        let keep = top_p.is_none_or(|tp| before < tp);
        before += probs[i as usize];
        keep
    })
}

/// Step 8 / section 1: `Generator.choice(ids, p=weights)` given `u = random()`:
/// `cdf = cumsum(p); cdf /= cdf[-1]; searchsorted(cdf, u, side='right')`.
pub(crate) fn categorical_index(weights: &[f64], u: f64) -> usize {
    let total: f64 = weights.iter().fold(0.0, |acc, &w| acc + w);
    let mut cdf = 0.0f64;
    for (i, &w) in weights.iter().enumerate() {
        cdf += w;
        if cdf / total > u {
            return i;
        }
    }
    // cdf[last]/total == 1 > u for any u in [0, 1); reached only for an
    // empty slice, which callers never pass.
    weights.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The streaming and the partial-selection top-k must give the same
    /// order (they are two implementations of one rank order).
    #[test]
    fn streaming_and_select_top_k_agree() {
        let mut rng = crate::stream::NumpyPcg64::from_seed(7);
        for case in 0..200 {
            let n = 50 + case;
            // Coarse values force many exact ties.
            let probs: Vec<f64> = (0..n).map(|_| (rng.random() * 8.0).floor() / 8.0).collect();
            for k in [1, 5, 20, n / 2, n - 1] {
                let (mut o1, mut o2, mut top) = (Vec::new(), Vec::new(), Vec::new());
                let a = top_k_order(&probs, k, &mut o1, &mut top).to_vec();
                // Force the selection path with a full sort reference.
                o2.extend(0..n as u32);
                o2.sort_by(|&x, &y| rank_cmp(&probs, x, y));
                o2.truncate(k);
                assert_eq!(a, o2, "n={n} k={k}");
            }
        }
        let probs: Vec<f64> = (0..1000).map(|i| f64::from((i * 37) % 11)).collect();
        let (mut o1, mut top) = (Vec::new(), Vec::new());
        let sel = top_k_order(&probs, 300, &mut o1, &mut top).to_vec();
        let mut full: Vec<u32> = (0..1000).collect();
        full.sort_by(|&x, &y| rank_cmp(&probs, x, y));
        assert_eq!(sel, full[..300]);
    }

    #[test]
    fn categorical_matches_searchsorted_right() {
        let w = [0.25, 0.25, 0.5];
        assert_eq!(categorical_index(&w, 0.0), 0);
        assert_eq!(categorical_index(&w, 0.2499), 0);
        // side='right': a u equal to a cdf entry moves past it.
        assert_eq!(categorical_index(&w, 0.25), 1);
        assert_eq!(categorical_index(&w, 0.5), 2);
        assert_eq!(categorical_index(&w, 0.999), 2);
    }
}
