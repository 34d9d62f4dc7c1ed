//! Softmax attention of each query over its own selected keys (QSA), on the
//! CPU. Only the selected rows of the cache are read: a dense masked score
//! tensor is never built.

/// `q: [T, Hq·d]` (normalised and rotated, not scaled), `k`, `v`: `[P,
/// Hkv·d]`, `keep[i]`: the key indices query `i` attends to. Query head `h`
/// reads kv head `h / (Hq/Hkv)`. Returns `[T, Hq·d]`.
///
/// Per (query, head): `s_j = (Σ_e q_e·k_je)·(1/√d)` summed in order, the max,
/// `p_j = exp(s_j − max)` with `Σ p` in key order, and `o = Σ_j (p_j/Σ)·v_j`
/// accumulated in key order from zero.
pub fn attention_gathered(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    keep: &[Vec<u32>],
    hq: usize,
    hkv: usize,
    d: usize,
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
            let mut sum = 0f32;
            for s in w.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
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
