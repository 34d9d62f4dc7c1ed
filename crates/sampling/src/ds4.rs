//! The ds4 law (spec section 4; reference: antirez/ds4 `ds4.c`
//! `sample_top_p_min_p`, `sample_full_vocab`, `sample_argmax`).
//!
//! Everything is f32, parameters included: the temperature, top_p and min_p
//! are rounded to f32 first, as ds4's `float` parameters are, so a positive
//! temperature that rounds to 0 in f32 is greedy. Expressions keep ds4's
//! exact shapes (`p/sum >= (p0/sum)*min_p`, `kept/sum >= top_p`,
//! `r = u*kept; r -= p; r <= 0`).
//!
//! Rows without a finite logit are answered by ds4's argmax scan. That token
//! is not a sample (for an all-NaN row it is id 0), so it is reported with
//! `argmax_fallback = true` and the engine surfaces it; the law itself keeps
//! ds4's answer so the token stream stays exact. The same flag marks the
//! defensive "non-finite or zero sum" returns.
//!
//! Decision (spec silent; ds4 uses `qsort`, whose tie order C leaves
//! unspecified): the full-vocabulary sort for `top_p < 1` orders by logit
//! descending, then id ascending, which is what glibc's (stable merge) qsort
//! does today and the same tie rule as the top-k insertion.

use crate::params::SamplingParams;

/// ds4's `DS4_NEG_INF`, the start of the argmax scan.
const NEG_INF: f32 = -1e30;
/// ds4 caps top-k at 1024 (fixed-size arrays in the reference).
const TOP_K_CAP: usize = 1024;

/// Reusable buffers for the candidate lists.
#[derive(Debug, Default, Clone)]
pub(crate) struct Scratch {
    /// Kept candidates in draw order and their unnormalised weights.
    pub(crate) ids: Vec<u32>,
    pub(crate) weights: Vec<f32>,
    cand: Vec<(f32, u32)>,
}

/// What the law decided before any draw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Plan {
    /// No draw: `token` (greedy, or a fallback when `fallback` is set).
    Fixed { token: u32, fallback: bool },
    /// Draw over `scratch.ids/weights` (in that order) with `sum`; when the
    /// subtraction never reaches `<= 0` the answer is `exhausted`.
    Draw { sum: f32, exhausted: u32 },
}

/// `sample_argmax`: running `v > best` from -1e30. NaN never wins, +inf
/// does, lowest id on ties; `fallback` when nothing beat -1e30 (id 0 then
/// is not the row's answer but the scan's initial value).
pub(crate) fn argmax(row: &[f32]) -> (u32, bool) {
    let mut best = 0u32;
    let mut best_v = NEG_INF;
    let mut found = false;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i as u32;
            found = true;
        }
    }
    (best, !found)
}

/// The law's parameters in f32 after ds4's clamps.
struct F32Params {
    temperature: f32,
    top_p: f32,
    min_p: f32,
    top_k: i64,
}

fn f32_params(params: &SamplingParams) -> F32Params {
    let mut top_p = params.top_p as f32;
    if top_p <= 0.0 || top_p > 1.0 || top_p.is_nan() {
        top_p = 1.0;
    }
    let mut min_p = params.min_p as f32;
    if min_p < 0.0 || min_p.is_nan() {
        min_p = 0.0;
    }
    F32Params {
        temperature: params.temperature as f32,
        top_p,
        min_p,
        top_k: params.top_k,
    }
}

/// True when the law answers by argmax without drawing.
pub(crate) fn is_greedy(params: &SamplingParams) -> bool {
    // ds4's `temperature <= 0.0f` on the f32 value.
    params.temperature as f32 <= 0.0
}

/// Everything up to the draw.
pub(crate) fn plan(row: &[f32], params: &SamplingParams, scratch: &mut Scratch) -> Plan {
    let p = f32_params(params);
    scratch.ids.clear();
    scratch.weights.clear();
    if p.temperature <= 0.0 {
        let (token, fallback) = argmax(row);
        return Plan::Fixed { token, fallback };
    }
    if p.top_k <= 0 {
        return full_vocab(row, &p, scratch);
    }
    let k = usize::try_from(p.top_k)
        .unwrap_or(TOP_K_CAP)
        .min(TOP_K_CAP)
        .min(row.len());
    top_k(row, &p, k, scratch)
}

fn fallback(row: &[f32]) -> Plan {
    let (token, _) = argmax(row);
    Plan::Fixed {
        token,
        fallback: true,
    }
}

/// Descending logit, ascending id (the insertion sort's order).
fn desc(a: &(f32, u32), b: &(f32, u32)) -> std::cmp::Ordering {
    // Finite values only, so partial_cmp never fails; -0.0 == +0.0 ties as in C.
    b.0.partial_cmp(&a.0)
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// `top_k > 0`: the top k finite logits, descending, earlier ids first on
/// ties (ds4's insertion sort never lets an equal value displace an earlier
/// id; a stable order by (logit desc, id asc) is the same list).
fn top_k(row: &[f32], p: &F32Params, k: usize, s: &mut Scratch) -> Plan {
    s.cand.clear();
    s.cand.extend(
        row.iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, &v)| (v, i as u32)),
    );
    if s.cand.is_empty() {
        return fallback(row);
    }
    if k < s.cand.len() {
        s.cand.select_nth_unstable_by(k - 1, desc);
        s.cand.truncate(k);
    }
    s.cand.sort_unstable_by(desc);
    let max_logit = s.cand[0].0;
    let mut sum = 0.0f32;
    for &(v, _) in &s.cand {
        let w = ((v - max_logit) / p.temperature).exp();
        s.weights.push(w);
        sum += w;
    }
    if sum <= 0.0 || !sum.is_finite() {
        return Plan::Fixed {
            token: s.cand[0].1,
            fallback: true,
        };
    }
    walk(s, sum, p)
}

/// The min_p / top_p walk over `s.cand` / `s.weights` (sorted, with the
/// pre-filter `sum`): keeps a prefix, leaves it in `s.ids` / `s.weights`.
fn walk(s: &mut Scratch, sum: f32, p: &F32Params) -> Plan {
    let min_prob = (s.weights[0] / sum) * p.min_p;
    let mut kept_sum = 0.0f32;
    let mut kept = 0usize;
    for (i, &w) in s.weights.iter().enumerate() {
        if i > 0 && w / sum < min_prob {
            break;
        }
        kept_sum += w;
        kept += 1;
        if kept_sum / sum >= p.top_p {
            break;
        }
    }
    // kept >= 1: the first candidate is always kept.
    s.weights.truncate(kept);
    s.ids.extend(s.cand[..kept].iter().map(|&(_, id)| id));
    Plan::Draw {
        sum: kept_sum,
        exhausted: s.ids[kept - 1],
    }
}

/// `top_k <= 0`: the full vocabulary, non-finite logits skipped.
fn full_vocab(row: &[f32], p: &F32Params, s: &mut Scratch) -> Plan {
    let mut max_logit = NEG_INF;
    let mut best = 0u32;
    let mut finite = 0usize;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() {
            continue;
        }
        finite += 1;
        if v > max_logit {
            max_logit = v;
            best = i as u32;
        }
    }
    if finite == 0 {
        return fallback(row);
    }
    if p.top_p >= 1.0 {
        // One pass in id order; ds4 recomputes the same expf in a second
        // pass, storing the kept weights gives identical values.
        let min_rel = if p.min_p > 0.0 { p.min_p } else { 0.0 };
        let mut sum = 0.0f32;
        for (i, &v) in row.iter().enumerate() {
            if !v.is_finite() {
                continue;
            }
            let w = ((v - max_logit) / p.temperature).exp();
            if w < min_rel {
                continue;
            }
            s.ids.push(i as u32);
            s.weights.push(w);
            sum += w;
        }
        if sum <= 0.0 || !sum.is_finite() {
            s.ids.clear();
            s.weights.clear();
            return Plan::Fixed {
                token: best,
                fallback: true,
            };
        }
        return Plan::Draw {
            sum,
            exhausted: best,
        };
    }
    // top_p < 1: the sum is accumulated in id order *before* the sort.
    s.cand.clear();
    let mut sum = 0.0f32;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() {
            continue;
        }
        sum += ((v - max_logit) / p.temperature).exp();
        s.cand.push((v, i as u32));
    }
    if sum <= 0.0 || !sum.is_finite() {
        return Plan::Fixed {
            token: best,
            fallback: true,
        };
    }
    s.cand.sort_unstable_by(desc);
    // Same expression on the same inputs: the same weights ds4 sorted along.
    s.weights.extend(
        s.cand
            .iter()
            .map(|&(v, _)| ((v - max_logit) / p.temperature).exp()),
    );
    walk(s, sum, p)
}

/// The one-uniform inverse CDF: `r = u*sum`, subtract in order, first
/// `r <= 0`, else `exhausted`.
pub(crate) fn draw(ids: &[u32], weights: &[f32], sum: f32, exhausted: u32, u: f32) -> u32 {
    let mut r = u * sum;
    for (&id, &w) in ids.iter().zip(weights) {
        r -= w;
        if r <= 0.0 {
            return id;
        }
    }
    exhausted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_returns_first_id_where_remainder_reaches_zero() {
        // u*sum equal to the first weight leaves r == 0 exactly: `r <= 0`
        // selects the first id (a `< 0` test would move to the second).
        assert_eq!(draw(&[4, 9], &[1.0, 1.0], 2.0, 9, 0.5), 4);
        assert_eq!(draw(&[4, 9], &[1.0, 1.0], 2.0, 9, 0.500_001), 9);
        // Rounding can leave r > 0 after the last weight: the exhausted id.
        assert_eq!(draw(&[4, 9], &[0.5, 0.5], 2.0, 7, 0.75), 7);
    }

    #[test]
    fn argmax_scan_matches_ds4() {
        assert_eq!(argmax(&[f32::NAN, 1.0, 1.0]), (1, false));
        assert_eq!(argmax(&[0.0, f32::INFINITY, f32::NAN]), (1, false));
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), (0, true));
        assert_eq!(argmax(&[-2e30, f32::NEG_INFINITY]), (0, true));
    }

    #[test]
    fn tiny_f32_temperature_is_greedy() {
        let mut p = crate::Law::Ds4.default_params();
        p.temperature = 1e-60; // positive in f64, 0 in f32
        assert!(is_greedy(&p));
        let mut s = Scratch::default();
        assert_eq!(
            plan(&[0.0, 3.0, 1.0], &p, &mut s),
            Plan::Fixed {
                token: 1,
                fallback: false
            }
        );
    }
}
