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
use crate::exp_lanes;
use crate::params::SamplingParams;
use crate::row_scan;

/// Above this top_k a partial selection over the whole row beats the
/// streaming insertion used for small k (k = 20 by default).
const STREAMING_TOP_K_MAX: usize = 256;

/// Reusable buffers, so a draw over a 248k-entry row does not allocate.
#[derive(Debug, Default, Clone)]
pub(crate) struct Scratch {
    /// Penalised logits (only when a penalty applies).
    penalised: Vec<f64>,
    /// Unnormalised weights `e = exp(l/T - m)`; `p = e/Z`.
    weights_e: Vec<f64>,
    /// Compaction buffers for rows that are mostly -inf.
    sparse: exp_lanes::Sparse,
    /// Index buffer for partial selection.
    order: Vec<u32>,
    /// Ranked (probability, id) pairs, then the support in id order.
    ranked: Vec<(f64, u32)>,
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
    row_scan::validate(row)?;
    // Step 2: penalties, in f64. Without them the f32 row is read directly
    // (f32 -> f64 is exact), sparing a copy of the whole row.
    let presence = clamp_penalty(params.presence_penalty);
    let frequency = clamp_penalty(params.frequency_penalty);
    let penalised = (presence != 0.0 || frequency != 0.0) && !counts.is_empty();
    if penalised {
        let l = &mut scratch.penalised;
        l.clear();
        l.extend(row.iter().map(|&x| f64::from(x)));
        for (token, count) in counts.iter() {
            // Counts for ids outside the row cannot be penalised (there is
            // no such logit); they are skipped, not an error.
            if let Some(x) = l.get_mut(token as usize) {
                *x -= frequency * f64::from(count) + presence;
            }
        }
    }
    // Step 3: greedy. The first maximum wins (lowest id on ties); validity
    // guarantees a finite entry and penalties keep finite values finite.
    let (argmax, l_max) = if penalised {
        first_max(scratch.penalised.iter().copied())
    } else {
        row_scan::first_max(row)
    };
    if params.temperature <= 0.0 {
        return Ok(Plan::Greedy(argmax));
    }
    // Step 4: softmax over the full vocabulary, normaliser in one pass.
    let t = params.temperature;
    let (e, sparse) = (&mut scratch.weights_e, &mut scratch.sparse);
    let z = if penalised {
        exp_weights(&scratch.penalised, t, l_max, e, sparse)
    } else {
        exp_weights(row, t, l_max, e, sparse)
    };
    let e = &scratch.weights_e;
    let v = e.len();

    // Steps 5-6: rank, top-k, nucleus.
    let top_k = usize::try_from(params.top_k).unwrap_or(0);
    let top_k_active = top_k > 0 && top_k < v;
    let top_p = params.top_p;
    let nucleus_active = top_p > 0.0 && top_p < 1.0;
    let ranked = &mut scratch.ranked;
    ranked.clear();
    if top_k_active {
        top_k_ranked(e, z, top_k, &mut scratch.order, ranked);
    } else {
        ranked.extend(
            e.iter()
                .enumerate()
                .filter(|(_, x)| **x > 0.0)
                .map(|(i, x)| (x / z, i as u32)),
        );
        if nucleus_active {
            ranked.sort_unstable_by(rank_cmp);
        }
    }
    if nucleus_active {
        // Keep a token iff the full-vocabulary mass accumulated before it
        // is < top_p (so the first is always kept).
        let mut before = 0.0f64;
        let keep = ranked
            .iter()
            .take_while(|(p, _)| {
                let keep = before < top_p;
                before += p;
                keep
            })
            .count();
        ranked.truncate(keep);
    }
    // Step 7: support in ascending id order, renormalised.
    ranked.retain(|(p, _)| *p > 0.0);
    ranked.sort_unstable_by_key(|&(_, id)| id);
    let mut mass = 0.0f64;
    for (p, _) in ranked.iter() {
        mass += p;
    }
    scratch.ids.clear();
    scratch.weights.clear();
    if ranked.is_empty() || mass <= 0.0 || !mass.is_finite() {
        // Unreachable for a valid row (the argmax has probability 1/Z > 0
        // and is always ranked first); kept so the law is total.
        scratch.ids.push(argmax);
        scratch.weights.push(1.0);
    } else {
        scratch.ids.extend(ranked.iter().map(|&(_, id)| id));
        scratch
            .weights
            .extend(ranked.iter().map(|&(p, _)| p / mass));
    }
    Ok(Plan::Draw)
}

/// Index and value of the first maximum of penalised logits (NaN-free by
/// validation); an unpenalised row takes [`row_scan::first_max`].
fn first_max(l: impl Iterator<Item = f64>) -> (u32, f64) {
    let (mut best, mut best_v) = (0u32, f64::NEG_INFINITY);
    for (i, x) in l.enumerate() {
        if x > best_v || i == 0 {
            best = i as u32;
            best_v = x;
        }
    }
    (best, best_v)
}

/// `e = exp(l/T - m)` with `m = max(l/T)`, into `out`; returns `Z`, the
/// sequential sum in id order. Division by T > 0 is monotone, so
/// `max(l/T)` is exactly `l_max/T`.
fn exp_weights<L: Copy + Into<f64>>(
    l: &[L],
    t: f64,
    l_max: f64,
    out: &mut Vec<f64>,
    sparse: &mut exp_lanes::Sparse,
) -> f64 {
    let m = l_max / t;
    if m.is_finite() {
        // A -inf logit's weight is exp(-inf) = +0 and adds nothing to `z`
        // (which is >= +0), so its division and `exp` are skipped: an MTP
        // head's draft row is -inf outside its vocabulary subset. The
        // weights are computed many lanes at a time with the same bits as
        // `(x / t - m).exp()`, and Z as the same sequential sum (see
        // `exp_lanes`).
        exp_lanes::scaled_exp(l, t, m, out, sparse)
    } else {
        // T so small that l_max/T overflows f64: the softmax is (and, for
        // every T small enough to overflow, stays) its T -> 0+ limit, uniform
        // over the tied maxima. `l/T - max(l/T)` would be inf - inf = NaN.
        out.clear();
        out.extend(l.iter().map(|&x| if x.into() == l_max { 1.0 } else { 0.0 }));
        out.iter().fold(0.0f64, |z, &w| z + w)
    }
}

/// Rank order: probability descending, lowest id first on exact ties.
/// Probabilities are finite and >= +0, so `total_cmp` is the numeric order.
fn rank_cmp(a: &(f64, u32), b: &(f64, u32)) -> std::cmp::Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

/// The first `k` entries of the rank order (`0 < k < V`), as (p, id) with
/// `p = e/z`, in rank order.
fn top_k_ranked(e: &[f64], z: f64, k: usize, order: &mut Vec<u32>, top: &mut Vec<(f64, u32)>) {
    top.clear();
    if k <= STREAMING_TOP_K_MAX {
        // One pass keeping the best k sorted. Ids arrive in ascending order,
        // so a later token with an equal probability ranks after every kept
        // one: it is inserted after them, and displaces nothing when full.
        //
        // Most tokens are rejected on `e` alone: p = fl(e/z) is monotone in
        // e, and an e more than 1e-12 (relative) below the k-th kept e
        // cannot round to a p >= the k-th p, so the division is skipped.
        // Anything closer is decided on the exact p.
        //
        // Eight at a time, a run that is all below the floor is skipped in
        // one vector comparison (each of them would be skipped alone, and
        // the floor only moves on an entry that is not).
        let mut e_floor = f64::NEG_INFINITY;
        for (r, run) in e.chunks(8).enumerate() {
            if run.len() == 8 && run.iter().fold(true, |below, &y| below & (y < e_floor)) {
                continue;
            }
            for (j, &x) in run.iter().enumerate() {
                if x < e_floor {
                    continue;
                }
                let i = r * 8 + j;
                let p = x / z;
                if top.len() == k && p <= top[k - 1].0 {
                    continue;
                }
                let at = top.partition_point(|&(q, _)| q >= p);
                if top.len() == k {
                    top.pop();
                }
                top.insert(at, (p, i as u32));
                if top.len() == k {
                    e_floor = e[top[k - 1].1 as usize] * (1.0 - 1e-12);
                }
            }
        }
    } else {
        order.clear();
        order.extend(0..e.len() as u32);
        let key = |i: u32| (e[i as usize] / z, i);
        order.select_nth_unstable_by(k - 1, |&a, &b| rank_cmp(&key(a), &key(b)));
        top.extend(order[..k].iter().map(|&i| key(i)));
        top.sort_unstable_by(rank_cmp);
    }
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

    /// The streaming top-k (with its e-prefilter) and the partial selection
    /// must both equal a full sort by the rank order.
    #[test]
    fn top_k_paths_agree_with_full_sort() {
        let mut rng = crate::stream::NumpyPcg64::from_seed(7);
        for case in 0..120 {
            let n = 50 + case * 3;
            // Coarse values force many exact ties; a non-trivial z makes
            // distinct e's collide after division now and then.
            let e: Vec<f64> = (0..n)
                .map(|_| (rng.random() * 8.0).floor() / 8.0 + 1e-17)
                .collect();
            let z = 3.0 + rng.random();
            let mut full: Vec<(f64, u32)> = e
                .iter()
                .enumerate()
                .map(|(i, x)| (x / z, i as u32))
                .collect();
            full.sort_by(rank_cmp);
            for k in [1, 5, 20, n / 2, n - 1, 257.min(n - 1), 300.min(n - 1)] {
                let (mut order, mut top) = (Vec::new(), Vec::new());
                top_k_ranked(&e, z, k, &mut order, &mut top);
                assert_eq!(top, full[..k], "n={n} k={k}");
            }
        }
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
