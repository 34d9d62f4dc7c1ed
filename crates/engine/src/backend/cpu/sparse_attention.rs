//! Softmax attention of each query over its own selected keys (QSA), on the
//! CPU. Only the selected rows of the cache are read: a dense masked score
//! tensor is never built.

/// `q: [T, Hq·d]` (normalised and rotated, not scaled), `k`, `v`: `[P,
/// Hkv·d]`, `keep[i]`: the key indices query `i` attends to. Query head `h`
/// reads kv head `h / (Hq/Hkv)`. Returns `[T, Hq·d]`.
///
/// Per (query, head): `s_j = (Σ_e q_e·k_je)·(1/√d)` summed in order, the max,
/// `p_j = exp(s_j − max)` with `Σ p` in key order, and `o = Σ_j (p_j/Σ)·v_j`
/// accumulated in key order from zero. With `sinks` (one logit per query
/// head, DeepSeek's attention sink) the sink joins the max and adds
/// `exp(sink − max)` to `Σ` after the keys, and contributes no value (rows of
/// `p` sum to less than one).
#[allow(clippy::too_many_arguments)]
pub fn attention_gathered(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keep: &[Vec<u32>],
    hq: usize,
    hkv: usize,
    d: usize,
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let kvw = hkv * d;
    let scale = 1.0 / (d as f32).sqrt();
    let group = hq / hkv;
    let mut out = vec![0f32; keep.len() * hq * d];
    let mut w = Vec::new();
    for (i, keep) in keep.iter().enumerate() {
        for h in 0..hq {
            let qh = &q[(i * hq + h) * d..][..d];
            let kvh = h / group;
            w.clear();
            let mut max = f32::NEG_INFINITY;
            for &j in keep {
                let kj = &k[j as usize * kvw + kvh * d..][..d];
                let s = qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                max = max.max(s);
                w.push(s);
            }
            let sink = sinks.map(|s| s[h]);
            if let Some(sk) = sink {
                max = max.max(sk);
            }
            let mut sum = 0f32;
            for s in w.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            if let Some(sk) = sink {
                sum += (sk - max).exp();
            }
            let o = &mut out[(i * hq + h) * d..][..d];
            for (&j, &p) in keep.iter().zip(&w) {
                let vj = &v[j as usize * kvw + kvh * d..][..d];
                for (a, b) in o.iter_mut().zip(vj) {
                    *a += p / sum * b;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink takes probability mass and gives no value: the output equals
    /// `Σ p_j v_j / (Σ p_j + exp(sink))` in f64; without a sink the rows
    /// are a convex combination.
    #[test]
    fn sinks_take_mass_and_match_f64() {
        let (hq, hkv, d) = (2, 1, 4);
        let f = |i: usize| ((i as f32) * 0.61).sin();
        let k: Vec<f32> = (0..5 * d).map(f).collect();
        let v: Vec<f32> = (0..5 * d).map(|i| f(i + 50)).collect();
        let q: Vec<f32> = (0..hq * d).map(|i| f(i + 90) * 2.0).collect();
        let keep = vec![vec![0u32, 2, 3]];
        let sinks = [0.7f32, -1.3];
        let with = attention_gathered(&q, &k, &v, &keep, hq, hkv, d, Some(&sinks));
        let without = attention_gathered(&q, &k, &v, &keep, hq, hkv, d, None);
        for h in 0..hq {
            let s: Vec<f64> = keep[0]
                .iter()
                .map(|&j| {
                    (0..d)
                        .map(|e| q[h * d + e] as f64 * k[j as usize * d + e] as f64)
                        .sum::<f64>()
                        / (d as f64).sqrt()
                })
                .collect();
            let z: f64 = s.iter().map(|x| x.exp()).sum::<f64>();
            for e in 0..d {
                let num: f64 = keep[0]
                    .iter()
                    .zip(&s)
                    .map(|(&j, x)| x.exp() * v[j as usize * d + e] as f64)
                    .sum();
                let want_sink = num / (z + (sinks[h] as f64).exp());
                let want = num / z;
                assert!((with[h * d + e] as f64 - want_sink).abs() < 1e-5);
                assert!((without[h * d + e] as f64 - want).abs() < 1e-5);
                assert!((with[h * d + e] - without[h * d + e]).abs() > 1e-4);
            }
        }
    }
}
