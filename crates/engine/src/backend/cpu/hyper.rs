//! mHC hyper-connections on the CPU (DeepSeek-V4 and GLM-5 share the
//! block): mixing weights with Sinkhorn normalisation, the block input and
//! the write-back, row by row in a fixed order.

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// One row of `[pre | post | C]` from `z` (see
/// [`crate::backend::Backend::hc_sinkhorn`]).
pub fn sinkhorn_row(
    z: &[f32],
    base: &[f32],
    scale: &[f32],
    n: usize,
    iters: usize,
    eps: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; (2 + n) * n];
    for i in 0..n {
        out[i] = sigmoid(z[i] * scale[0] + base[i]) + eps;
        out[n + i] = 2.0 * sigmoid(z[n + i] * scale[1] + base[n + i]);
    }
    let c = &mut out[2 * n..];
    for j in 0..n {
        let row = &mut c[j * n..(j + 1) * n];
        for (k, v) in row.iter_mut().enumerate() {
            *v = z[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        for v in row.iter_mut() {
            *v = *v / sum + eps;
        }
    }
    let cols = |c: &mut [f32]| {
        for k in 0..n {
            let mut s = 0f32;
            for j in 0..n {
                s += c[j * n + k];
            }
            for j in 0..n {
                c[j * n + k] /= s + eps;
            }
        }
    };
    cols(c);
    for _ in 1..iters {
        for j in 0..n {
            let row = &mut c[j * n..(j + 1) * n];
            let s = row.iter().fold(0f32, |a, &v| a + v);
            for v in row.iter_mut() {
                *v /= s + eps;
            }
        }
        cols(c);
    }
    out
}

/// `x[r] = Σ_s pre[r, s]·X[r, s]`, streams in order from 0.
pub fn pre(xs: &[f32], mix: &[f32], n: usize, d: usize) -> Vec<f32> {
    let width = (2 + n) * n;
    let mut out = Vec::with_capacity(xs.len() / n);
    for (xr, m) in xs.chunks_exact(n * d).zip(mix.chunks_exact(width)) {
        for e in 0..d {
            let mut acc = 0f32;
            for s in 0..n {
                acc += m[s] * xr[s * d + e];
            }
            out.push(acc);
        }
    }
    out
}

/// `X'[r, k] = post[r, k]·y[r] + Σ_j C[r, j, k]·X[r, j]`.
pub fn post(xs: &[f32], y: &[f32], mix: &[f32], n: usize, d: usize) -> Vec<f32> {
    let width = (2 + n) * n;
    let mut out = Vec::with_capacity(xs.len());
    for ((xr, yr), m) in xs
        .chunks_exact(n * d)
        .zip(y.chunks_exact(d))
        .zip(mix.chunks_exact(width))
    {
        let (post, c) = (&m[n..2 * n], &m[2 * n..]);
        for k in 0..n {
            for e in 0..d {
                let mut acc = 0f32;
                for j in 0..n {
                    acc += c[j * n + k] * xr[j * d + e];
                }
                out.push(post[k] * yr[e] + acc);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(i: usize) -> f32 {
        ((i as f32) * 0.413).sin()
    }

    /// Sinkhorn makes C doubly stochastic (up to eps), and pre/post/mixing
    /// match an f64 evaluation of the block's formulas.
    #[test]
    fn sinkhorn_and_mixing_match_f64() {
        let (n, d, iters, eps) = (4, 5, 20, 1e-6f32);
        let w = (2 + n) * n;
        let z: Vec<f32> = (0..w).map(|i| 2.0 * f(i)).collect();
        let base: Vec<f32> = (0..w).map(|i| 0.3 * f(i + 40)).collect();
        let scale = [0.9f32, 1.1, 1.7];
        let m = sinkhorn_row(&z, &base, &scale, n, iters, eps);
        let c = &m[2 * n..];
        for k in 0..n {
            let col: f32 = (0..n).map(|j| c[j * n + k]).sum();
            let row: f32 = (0..n).map(|j| c[k * n + j]).sum();
            assert!(
                (col - 1.0).abs() < 1e-4 && (row - 1.0).abs() < 1e-3,
                "{col} {row}"
            );
        }
        // f64 reference of the same algorithm.
        let sg = |x: f64| 1.0 / (1.0 + (-x).exp());
        let mut cr = vec![0f64; n * n];
        for j in 0..n {
            let l: Vec<f64> = (0..n)
                .map(|k| {
                    z[2 * n + j * n + k] as f64 * scale[2] as f64 + base[2 * n + j * n + k] as f64
                })
                .collect();
            let mx = l.iter().cloned().fold(f64::MIN, f64::max);
            let sum: f64 = l.iter().map(|x| (x - mx).exp()).sum();
            for k in 0..n {
                cr[j * n + k] = (l[k] - mx).exp() / sum + eps as f64;
            }
        }
        let e = eps as f64;
        let col_norm = |c: &mut Vec<f64>| {
            for k in 0..n {
                let s: f64 = (0..n).map(|j| c[j * n + k]).sum();
                (0..n).for_each(|j| c[j * n + k] /= s + e);
            }
        };
        col_norm(&mut cr);
        for _ in 1..iters {
            for j in 0..n {
                let s: f64 = cr[j * n..(j + 1) * n].iter().sum();
                cr[j * n..(j + 1) * n].iter_mut().for_each(|v| *v /= s + e);
            }
            col_norm(&mut cr);
        }
        for (a, b) in c.iter().zip(&cr) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
        for i in 0..n {
            let p = sg(z[i] as f64 * 0.9 + base[i] as f64) + e;
            assert!((m[i] as f64 - p).abs() < 1e-6);
            let q = 2.0 * sg(z[n + i] as f64 * 1.1 + base[n + i] as f64);
            assert!((m[n + i] as f64 - q).abs() < 1e-6);
        }
        // Block input and write-back.
        let xs: Vec<f32> = (0..n * d).map(|i| f(i + 80)).collect();
        let y: Vec<f32> = (0..d).map(|i| f(i + 120)).collect();
        let x = pre(&xs, &m, n, d);
        let out = post(&xs, &y, &m, n, d);
        for e in 0..d {
            let want: f64 = (0..n).map(|s| m[s] as f64 * xs[s * d + e] as f64).sum();
            assert!((x[e] as f64 - want).abs() < 1e-5);
            for k in 0..n {
                let mix: f64 = (0..n).map(|j| cr[j * n + k] * xs[j * d + e] as f64).sum();
                let want = m[n + k] as f64 * y[e] as f64 + mix;
                assert!((out[k * d + e] as f64 - want).abs() < 1e-5);
            }
        }
    }
}
