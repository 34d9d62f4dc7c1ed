//! Speculative-decoding primitives shared by every law (spec section 5).
//!
//! Given the target law's distribution `p` and the drafter's `q` (both
//! produced by the same law, in f64), a drafted token `d` is accepted with
//! probability `min(1, p(d)/q(d))`; on rejection the correction is drawn
//! from the residual `(p - q)+`. Together they make the emitted token
//! distributed exactly as `p` (tests/speculative.rs checks this exactly).

use crate::distribution::Distribution;

/// `a = min(1, p/q)`; when `q <= 0` (the drafter could not have proposed
/// it under its own law), `a = 1` if `p > 0` else 0.
pub fn acceptance_probability(p_d: f64, q_d: f64) -> f64 {
    if q_d <= 0.0 {
        return if p_d > 0.0 { 1.0 } else { 0.0 };
    }
    (p_d / q_d).min(1.0)
}

/// The residual `(p - q)+` over the union of both supports in ascending id
/// order, normalised (sequential sum in id order); `p` itself when the
/// residual has no mass (p == q, where a rejection is impossible anyway, or
/// rounding). Zero entries are dropped, as the laws drop them.
pub fn residual(p: &Distribution, q: &Distribution) -> Distribution {
    let (pi, pp) = (p.ids(), p.probs());
    let (qi, qp) = (q.ids(), q.probs());
    let mut ids = Vec::with_capacity(pi.len());
    let mut mass = Vec::with_capacity(pi.len());
    let (mut a, mut b) = (0usize, 0usize);
    // Merge walk over two ascending id lists.
    while a < pi.len() || b < qi.len() {
        let (id, pv, qv) = match (pi.get(a), qi.get(b)) {
            (Some(&x), Some(&y)) if x == y => {
                a += 1;
                b += 1;
                (x, pp[a - 1], qp[b - 1])
            }
            (Some(&x), Some(&y)) if x < y => {
                a += 1;
                (x, pp[a - 1], 0.0)
            }
            (Some(&x), None) => {
                a += 1;
                (x, pp[a - 1], 0.0)
            }
            (_, Some(&y)) => {
                b += 1;
                (y, 0.0, qp[b - 1])
            }
            (None, None) => break,
        };
        let r = pv - qv;
        if r > 0.0 {
            ids.push(id);
            mass.push(r);
        }
    }
    let total: f64 = mass.iter().fold(0.0, |acc, &m| acc + m);
    if ids.is_empty() || total <= 0.0 || !total.is_finite() {
        return p.clone();
    }
    for m in &mut mass {
        *m /= total;
    }
    Distribution::from_parts(ids, mass, false)
}
