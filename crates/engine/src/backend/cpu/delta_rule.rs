//! The delta rule and its causal conv on the CPU: the per-row recurrence,
//! token by token, in prefill, decode and verify alike (never a chunked
//! WY/UT form, which reorders sums).

use crate::backend::ScanDims;

fn silu(x: f32) -> f32 {
    x * (1.0 / (1.0 + (-x).exp()))
}

/// The gated delta rule over `T` tokens, updating `s` in place.
///
/// `q`, `k`: `[T, Hk, dk]` (already L2-normalised, `q` scaled); `v`:
/// `[T, Hv, dv]`; `g`, `beta`: `[T, Hv]`; `s`: `[Hv, dk, dv]`; returns
/// `o: [T, Hv, dv]`.
#[allow(clippy::too_many_arguments)] // a kernel over flat slices
pub fn scan(
    d: ScanDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    s: &mut [f32],
) -> Vec<f32> {
    let t_len = g.len() / d.hv;
    let r = d.hv / d.hk;
    let mut o = vec![0f32; t_len * d.hv * d.dv];
    let mut kv_mem = vec![0f32; d.dv];
    for t in 0..t_len {
        for j in 0..d.hv {
            let kh = j / r;
            let qv = &q[(t * d.hk + kh) * d.dk..][..d.dk];
            let kvec = &k[(t * d.hk + kh) * d.dk..][..d.dk];
            let vv = &v[(t * d.hv + j) * d.dv..][..d.dv];
            let sj = &mut s[j * d.dk * d.dv..][..d.dk * d.dv];
            let decay = g[t * d.hv + j].exp();
            let b = beta[t * d.hv + j];
            for x in sj.iter_mut() {
                *x *= decay;
            }
            kv_mem.fill(0.0);
            for (a, row) in sj.chunks_exact(d.dv).enumerate() {
                let ka = kvec[a];
                for (m, x) in kv_mem.iter_mut().zip(row) {
                    *m += x * ka;
                }
            }
            for (m, vb) in kv_mem.iter_mut().zip(vv) {
                *m = (vb - *m) * b; // delta
            }
            let out = &mut o[(t * d.hv + j) * d.dv..][..d.dv];
            for (a, row) in sj.chunks_exact_mut(d.dv).enumerate() {
                let ka = kvec[a];
                let qa = qv[a];
                for ((x, dl), ov) in row.iter_mut().zip(&kv_mem).zip(out.iter_mut()) {
                    *x += ka * dl;
                    *ov += *x * qa;
                }
            }
        }
    }
    o
}

/// Depthwise causal conv + silu over `u: [T, C]` with a history window of
/// `(K−1)·dilation` rows (oldest first), `w: [C, K]` (tap `K−1` multiplies
/// the newest): tap `k` of token `t` reads row `t + k·dilation` of
/// `[window | u]`. Returns `[T, C]` and slides `window` to the last rows.
pub fn causal_conv(
    u: &[f32],
    window: &mut [f32],
    w: &[f32],
    channels: usize,
    kernel: usize,
    dilation: usize,
) -> Vec<f32> {
    let t_len = u.len() / channels;
    let hist = window.len() / channels.max(1);
    let mut all = Vec::with_capacity((hist + t_len) * channels);
    all.extend_from_slice(window);
    all.extend_from_slice(u);
    let mut out = vec![0f32; t_len * channels];
    for t in 0..t_len {
        for c in 0..channels {
            let mut acc = 0f32;
            for k in 0..kernel {
                acc += w[c * kernel + k] * all[(t + k * dilation) * channels + c];
            }
            out[t * channels + c] = silu(acc);
        }
    }
    let start = t_len * channels;
    window.copy_from_slice(&all[start..start + hist * channels]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splitting a sequence anywhere and carrying the state gives the same
    /// outputs and final state as one scan (the chunked-prefill property).
    #[test]
    fn scan_splits_exactly() {
        let d = ScanDims {
            hk: 1,
            hv: 2,
            dk: 3,
            dv: 2,
        };
        let t = 7;
        let f = |i: usize| ((i as f32) * 0.37).sin();
        let q: Vec<f32> = (0..t * 3).map(f).collect();
        let k: Vec<f32> = (0..t * 3).map(|i| f(i + 100)).collect();
        let v: Vec<f32> = (0..t * 4).map(|i| f(i + 200)).collect();
        let g: Vec<f32> = (0..t * 2).map(|i| -0.1 - 0.05 * f(i + 300).abs()).collect();
        let b: Vec<f32> = (0..t * 2).map(|i| 0.5 + 0.4 * f(i + 400)).collect();
        let mut s1 = vec![0f32; 12];
        let o1 = scan(d, &q, &k, &v, &g, &b, &mut s1);
        let mut s2 = vec![0f32; 12];
        let split = 3;
        let mut o2 = scan(
            d,
            &q[..split * 3],
            &k[..split * 3],
            &v[..split * 4],
            &g[..split * 2],
            &b[..split * 2],
            &mut s2,
        );
        o2.extend(scan(
            d,
            &q[split * 3..],
            &k[split * 3..],
            &v[split * 4..],
            &g[split * 2..],
            &b[split * 2..],
            &mut s2,
        ));
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
        assert!(s1.iter().any(|x| x.abs() > 1e-3));
    }
}
