//! Token compression on the CPU: gated softmax pooling of token groups
//! (DeepSeek-V4's compressors, GLM-5's pooled indexer keys) and the
//! lightning indexer's scores and top-k selection.

/// `kv, gate: [n·slots, dim]` → `[n, dim]`; see
/// [`crate::backend::Backend::softmax_pool`] for the order of every sum.
pub fn softmax_pool(kv: &[f32], gate: &[f32], slots: usize, dim: usize) -> Vec<f32> {
    let n = kv.len() / (slots * dim).max(1);
    let mut out = vec![0f32; n * dim];
    let mut e = vec![0f32; slots];
    for g in 0..n {
        let (kv, gate) = (&kv[g * slots * dim..], &gate[g * slots * dim..]);
        for c in 0..dim {
            let mut max = f32::NEG_INFINITY;
            for j in 0..slots {
                max = max.max(gate[j * dim + c]);
            }
            let mut sum = 0f32;
            for (j, ej) in e.iter_mut().enumerate() {
                *ej = (gate[j * dim + c] - max).exp();
                sum += *ej;
            }
            let mut acc = 0f32;
            for (j, ej) in e.iter().enumerate() {
                acc += kv[j * dim + c] * (ej / sum);
            }
            out[g * dim + c] = acc;
        }
    }
    out
}

/// One row of lightning-indexer scores: `q: [heads·dim]`, `w: [heads]`,
/// `keys: [E, dim]` → `out: [E]`.
pub fn index_scores_row(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    dim: usize,
    scale: f32,
    w_scale: f32,
    out: &mut [f32],
) {
    for (e, o) in out.iter_mut().enumerate() {
        let k = &keys[e * dim..(e + 1) * dim];
        let mut s = 0f32;
        for (h, qh) in q.chunks_exact(dim).enumerate() {
            let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
            s += (w[h] * w_scale) * (dot.max(0.0) * scale);
        }
        *o = s;
    }
}

/// The `min(k, limit)` best of `scores[..limit]` (ties: the lower index),
/// ascending. `scratch` is reused across rows.
pub fn select_topk_row(
    scores: &[f32],
    limit: usize,
    k: usize,
    scratch: &mut Vec<(f32, u32)>,
) -> Vec<u32> {
    scratch.clear();
    scratch.extend(
        scores[..limit]
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, i as u32)),
    );
    let k = k.min(limit);
    if k < limit && k > 0 {
        scratch.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    }
    scratch.truncate(k);
    let mut keep: Vec<u32> = scratch.iter().map(|&(_, i)| i).collect();
    keep.sort_unstable();
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pool equals an f64 softmax-weighted mean, and an empty (−∞) slot
    /// gets no weight.
    #[test]
    fn softmax_pool_matches_f64_and_skips_empty_slots() {
        let (slots, dim) = (3, 2);
        let kv = [1.0, 2.0, 3.0, -1.0, 5.0, 7.0];
        let gate = [0.5, f32::NEG_INFINITY, -0.25, 1.0, 0.0, 2.0];
        let out = softmax_pool(&kv, &gate, slots, dim);
        for c in 0..dim {
            let g: Vec<f64> = (0..slots).map(|j| gate[j * dim + c] as f64).collect();
            let m = g.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = g.iter().map(|x| (x - m).exp()).sum();
            let want: f64 = (0..slots)
                .map(|j| (g[j] - m).exp() / z * kv[j * dim + c] as f64)
                .sum();
            assert!(
                (out[c] as f64 - want).abs() < 1e-6,
                "{c}: {} vs {want}",
                out[c]
            );
        }
        // Channel 1 of slot 0 is empty: slots 1 and 2 alone.
        let only = softmax_pool(&kv[2..], &gate[2..], 2, dim);
        assert_eq!(out[1], only[1]);
    }

    #[test]
    fn topk_prefers_high_scores_then_low_index_within_the_limit() {
        let mut s = Vec::new();
        let scores = [0.5, 2.0, 2.0, -1.0, 9.0];
        assert_eq!(select_topk_row(&scores, 4, 2, &mut s), vec![1, 2]);
        assert_eq!(select_topk_row(&scores, 4, 1, &mut s), vec![1]);
        assert_eq!(select_topk_row(&scores, 5, 2, &mut s), vec![1, 4]);
        assert_eq!(select_topk_row(&scores, 2, 8, &mut s), vec![0, 1]);
        assert!(select_topk_row(&scores, 0, 8, &mut s).is_empty());
    }

    #[test]
    fn index_scores_weight_relu_dots_per_head() {
        // 2 heads of dim 2, 2 keys.
        let q = [1.0, 0.0, -1.0, 0.0];
        let w = [2.0, 3.0];
        let keys = [1.0, 1.0, -2.0, 0.0];
        let mut out = [0.0; 2];
        index_scores_row(&q, &w, &keys, 2, 0.5, 1.0, &mut out);
        // key 0: head 0 dot 1 → 2·0.5; head 1 dot −1 → 0.
        // key 1: head 0 dot −2 → 0; head 1 dot 2 → 3·1.
        assert_eq!(out, [1.0, 3.0]);
    }
}
