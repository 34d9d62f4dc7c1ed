//! Gated DeltaNet (`linear_attn`), batch 1.
//!
//! Dimensions: `Kd = Hk·dk`, `Vd = Hv·dv`, `Cc = 2Kd + Vd`, `r = Hv/Hk`.
//!
//! ```text
//! u_t   = in_proj_qkv·x_t                          [Cc]   (the conv window stores raw u)
//! c_t   = silu( Σ_{k<K} w[:,k]·u_{t−K+1+k} )       depthwise causal conv, zero left pad
//! q,k,v = split(c_t)                               v-head j reads q/k head ⌊j/r⌋
//! q     = l2n(q)·dk^−½ ;  k = l2n(k)               l2n(x) = x·rsqrt(Σx² + 1e-6)
//! β     = sigmoid(in_proj_b·x) ;  g = −exp(A_log)·softplus(in_proj_a·x + dt_bias)
//! S     ← S·exp(g) ;  S ← S + k ⊗ β(v − kᵀS) ;  o = qᵀS         S [Hv, dk, dv] fp32
//! y     = out_proj · ( w·rms(o) ⊙ act(z) ),  z = in_proj_z·x
//! ```
//!
//! Prefill and decode share one host kernel, [`scan`], that applies the
//! recurrence token by token. transformers uses a chunked (UT-transform)
//! form for T > 1; it equals the recurrence up to fp32 summation order
//! (~1e-6), and on a CPU the sequential scan costs `O(T·Hv·dk·dv)` like the
//! chunked form while allocating nothing per token. The scan is a plain
//! function over slices: the seam where a CUDA/Metal kernel plugs in.

use candle_core::Tensor;

use super::config::GateAct;
use super::kernels::Dense;
use super::norms::{gated_norm, load, load_vec, sigmoid, silu, softplus, to_vec};
use super::state::{GdnCache, GdnReplay};
use crate::error::Result;
use crate::load::safetensors::SafetensorsDir;

#[derive(Debug, Clone)]
pub struct GatedDeltaNet {
    in_qkv: Dense,
    in_z: Dense,
    in_b: Dense,
    in_a: Dense,
    /// `[Cc, K]`.
    conv_w: Vec<f32>,
    /// `−exp(A_log)`, `[Hv]`.
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm_w: Vec<f32>,
    out: Dense,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    pub kernel: usize,
    act: GateAct,
    eps: f32,
}

/// Dimensions of one scan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScanDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
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

/// Depthwise causal conv + silu over `u: [T, C]` with a `[K−1, C]` history
/// window (oldest first), `w: [C, K]` (tap `K−1` multiplies the newest).
/// Returns `[T, C]` and updates `window` to the last `K−1` rows.
pub fn causal_conv(
    u: &[f32],
    window: &mut [f32],
    w: &[f32],
    channels: usize,
    kernel: usize,
) -> Vec<f32> {
    let t_len = u.len() / channels;
    let hist = kernel - 1;
    let mut all = Vec::with_capacity((hist + t_len) * channels);
    all.extend_from_slice(window);
    all.extend_from_slice(u);
    let mut out = vec![0f32; t_len * channels];
    for t in 0..t_len {
        for c in 0..channels {
            let mut acc = 0f32;
            for k in 0..kernel {
                // `all` is [hist + T, C]: token t's tap k reads row t + k.
                acc += w[c * kernel + k] * all[(t + k) * channels + c];
            }
            out[t * channels + c] = silu(acc);
        }
    }
    let start = t_len * channels;
    window.copy_from_slice(&all[start..start + hist * channels]);
    out
}

/// The GDN cache after the first `rows` rows of a recorded window: the
/// conv window slides over the recorded `u` rows and the same [`scan`]
/// replays the recorded inputs from the state before the window, so the
/// result is bit-identical to running only those rows.
pub fn replay(r: &GdnReplay, rows: usize) -> GdnCache {
    let d = r.dims;
    let cc = 2 * d.hk * d.dk + d.hv * d.dv;
    let hist = r.kernel - 1;
    let mut cache = r.before.clone();
    if rows == 0 {
        return cache;
    }
    let mut all = Vec::with_capacity((hist + rows) * cc);
    all.extend_from_slice(&r.before.conv);
    all.extend_from_slice(&r.u[..rows * cc]);
    cache.conv.copy_from_slice(&all[rows * cc..]);
    let (kq, kv, kg) = (rows * d.hk * d.dk, rows * d.hv * d.dv, rows * d.hv);
    scan(
        d,
        &r.q[..kq],
        &r.k[..kq],
        &r.v[..kv],
        &r.g[..kg],
        &r.beta[..kg],
        &mut cache.s,
    );
    cache
}

fn l2norm(x: &mut [f32], scale: f32) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    for v in x {
        *v *= inv * scale;
    }
}

impl GatedDeltaNet {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        st: &mut SafetensorsDir,
        prefix: &str,
        h: usize,
        hk: usize,
        hv: usize,
        dk: usize,
        dv: usize,
        kernel: usize,
        act: GateAct,
        eps: f64,
    ) -> Result<Self> {
        let cc = 2 * hk * dk + hv * dv;
        let a_log = load_vec(st, prefix, "A_log", &[hv])?;
        Ok(Self {
            in_qkv: Dense::new(load(st, prefix, "in_proj_qkv.weight", &[cc, h])?)?,
            in_z: Dense::new(load(st, prefix, "in_proj_z.weight", &[hv * dv, h])?)?,
            in_b: Dense::new(load(st, prefix, "in_proj_b.weight", &[hv, h])?)?,
            in_a: Dense::new(load(st, prefix, "in_proj_a.weight", &[hv, h])?)?,
            conv_w: load_vec(st, prefix, "conv1d.weight", &[cc, 1, kernel])?,
            neg_a: a_log.iter().map(|a| -a.exp()).collect(),
            dt_bias: load_vec(st, prefix, "dt_bias", &[hv])?,
            norm_w: load_vec(st, prefix, "norm.weight", &[dv])?,
            out: Dense::new(load(st, prefix, "out_proj.weight", &[h, hv * dv])?)?,
            hk,
            hv,
            dk,
            dv,
            kernel,
            act,
            eps: eps as f32,
        })
    }

    pub fn conv_channels(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }

    pub fn new_cache(&self) -> GdnCache {
        GdnCache {
            conv: vec![0.0; (self.kernel - 1) * self.conv_channels()],
            s: vec![0.0; self.hv * self.dk * self.dv],
        }
    }

    /// `x: [T, H]` → `[T, H]`, advancing `cache`. With `capture`, records
    /// what [`replay`] needs to rebuild the cache after any prefix of rows.
    pub fn forward(
        &self,
        x: &Tensor,
        cache: &mut GdnCache,
        capture: Option<&mut Option<GdnReplay>>,
    ) -> Result<Tensor> {
        let t_len = x.dim(0)?;
        let cc = self.conv_channels();
        let (kd, vd) = (self.hk * self.dk, self.hv * self.dv);
        let u = to_vec(&self.in_qkv.forward(x)?)?;
        let before = capture.is_some().then(|| cache.clone());
        let c = causal_conv(&u, &mut cache.conv, &self.conv_w, cc, self.kernel);
        let mut q = Vec::with_capacity(t_len * kd);
        let mut k = Vec::with_capacity(t_len * kd);
        let mut v = Vec::with_capacity(t_len * vd);
        let scale = (self.dk as f32).powf(-0.5);
        for row in c.chunks_exact(cc) {
            let (qr, rest) = row.split_at(kd);
            let (kr, vr) = rest.split_at(kd);
            let (q0, k0) = (q.len(), k.len());
            q.extend_from_slice(qr);
            k.extend_from_slice(kr);
            v.extend_from_slice(vr);
            for hh in 0..self.hk {
                l2norm(&mut q[q0 + hh * self.dk..q0 + (hh + 1) * self.dk], scale);
                l2norm(&mut k[k0 + hh * self.dk..k0 + (hh + 1) * self.dk], 1.0);
            }
        }
        let beta: Vec<f32> = to_vec(&self.in_b.forward(x)?)?
            .into_iter()
            .map(sigmoid)
            .collect();
        let a = to_vec(&self.in_a.forward(x)?)?;
        let g: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, &ai)| {
                let j = i % self.hv;
                self.neg_a[j] * softplus(ai + self.dt_bias[j])
            })
            .collect();
        let dims = ScanDims {
            hk: self.hk,
            hv: self.hv,
            dk: self.dk,
            dv: self.dv,
        };
        let o = scan(dims, &q, &k, &v, &g, &beta, &mut cache.s);
        if let (Some(cap), Some(before)) = (capture, before) {
            *cap = Some(GdnReplay {
                before,
                dims,
                kernel: self.kernel,
                u,
                q,
                k,
                v,
                g,
                beta,
            });
        }
        let z = to_vec(&self.in_z.forward(x)?)?;
        let y = gated_norm(&o, &z, &self.norm_w, self.eps, self.act);
        let y = Tensor::from_vec(y, (t_len, vd), x.device())?;
        self.out.forward(&y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splitting a sequence anywhere and carrying the state gives the same
    /// outputs and final state as one scan (the chunked-prefill property).
    #[test]
    fn qwen4_scan_splits_exactly() {
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
