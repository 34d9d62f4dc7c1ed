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
/// `[T, Hv, dv]`; `beta`: `[T, Hv]`; `g`: `[T, Hv]` (one log-decay per
/// head, Gated DeltaNet) or `[T, Hv, dk]` (per key channel, Kimi delta
/// attention); `s`: `[Hv, dk, dv]`; returns `o: [T, Hv, dv]`.
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
    let t_len = beta.len() / d.hv;
    // `g` holds one log-decay per head (GDN) or per key channel (KDA).
    let per_channel = g.len() == t_len * d.hv * d.dk && d.dk != 1;
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
            let b = beta[t * d.hv + j];
            if per_channel {
                // KDA: `S ← diag(exp(g)) S`, one decay per key channel.
                let gj = &g[(t * d.hv + j) * d.dk..][..d.dk];
                for (row, &ga) in sj.chunks_exact_mut(d.dv).zip(gj) {
                    let decay = ga.exp();
                    for x in row {
                        *x *= decay;
                    }
                }
            } else {
                let decay = g[t * d.hv + j].exp();
                for x in sj.iter_mut() {
                    *x *= decay;
                }
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

    fn f(i: usize) -> f32 {
        ((i as f32) * 0.37).sin()
    }

    /// A per-channel decay equal across channels is the per-head decay, bit
    /// for bit; a varying one matches an f64 recurrence.
    #[test]
    fn per_channel_decay_matches_per_head_and_f64() {
        let d = ScanDims {
            hk: 1,
            hv: 2,
            dk: 3,
            dv: 2,
        };
        let t = 6;
        let q: Vec<f32> = (0..t * 3).map(f).collect();
        let k: Vec<f32> = (0..t * 3).map(|i| f(i + 100)).collect();
        let v: Vec<f32> = (0..t * 4).map(|i| f(i + 200)).collect();
        let b: Vec<f32> = (0..t * 2).map(|i| 0.5 + 0.4 * f(i + 400)).collect();
        let gh: Vec<f32> = (0..t * 2).map(|i| -0.1 - 0.05 * f(i + 300).abs()).collect();
        let gc: Vec<f32> = gh.iter().flat_map(|&x| [x; 3]).collect();
        let (mut s1, mut s2) = (vec![0f32; 12], vec![0f32; 12]);
        let o1 = scan(d, &q, &k, &v, &gh, &b, &mut s1);
        let o2 = scan(d, &q, &k, &v, &gc, &b, &mut s2);
        assert_eq!(o1, o2);
        assert_eq!(s1, s2);
        // Varying per-channel decay against the recurrence in f64.
        let gv: Vec<f32> = (0..t * 2 * 3)
            .map(|i| -0.05 - 0.3 * f(i + 500).abs())
            .collect();
        let mut s3 = vec![0f32; 12];
        let o3 = scan(d, &q, &k, &v, &gv, &b, &mut s3);
        let mut st = [[[0f64; 2]; 3]; 2];
        for tt in 0..t {
            for j in 0..2 {
                let kk: Vec<f64> = (0..3).map(|a| k[tt * 3 + a] as f64).collect();
                let qq: Vec<f64> = (0..3).map(|a| q[tt * 3 + a] as f64).collect();
                for (a, row) in st[j].iter_mut().enumerate() {
                    let e = (gv[(tt * 2 + j) * 3 + a] as f64).exp();
                    row.iter_mut().for_each(|x| *x *= e);
                }
                let bb = b[tt * 2 + j] as f64;
                for c in 0..2 {
                    let mem: f64 = (0..3).map(|a| st[j][a][c] * kk[a]).sum();
                    let delta = (v[(tt * 2 + j) * 2 + c] as f64 - mem) * bb;
                    for a in 0..3 {
                        st[j][a][c] += kk[a] * delta;
                    }
                    let o: f64 = (0..3).map(|a| st[j][a][c] * qq[a]).sum();
                    let got = o3[(tt * 2 + j) * 2 + c] as f64;
                    assert!((got - o).abs() < 1e-5, "t {tt} head {j}: {got} vs {o}");
                }
            }
        }
    }

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
