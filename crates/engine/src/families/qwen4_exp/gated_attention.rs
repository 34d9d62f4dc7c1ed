//! Gated attention with the QSA indexer (every Qwen4-Exp attention layer),
//! batch 1, and its partial, interleaved M-RoPE.
//!
//! ```text
//! [q_h | gate_h] = (q_proj·x)[h]          q_proj [Hq·2D, H]: per head, first D query, next D gate
//! q = RoPE_R(N1(q; q_norm)) ; k = RoPE_R(N1(k_proj·x; k_norm)) ; v = v_proj·x
//! keep = causal ∧ QSA-selected                          (see `qsa`)
//! a_h  = softmax_{j∈keep}( q_h·k_j / √D ) · V            q-head h reads kv-head ⌊h·Hkv/Hq⌋
//! y    = o_proj( a ⊙ sigmoid(gate) )
//! ```
//!
//! Attention runs only over the selected tokens (≤ budget + ratio − 1 per
//! query), on the host: that is the point of QSA and avoids materialising a
//! dense masked `[Hq, T, P+T]` score tensor.
//!
//! RoPE: `R = int(D·partial_rotary_factor)`, `inv_freq_i = θ^(−2i/R)`,
//! half-split rotation of the first `R` dims. M-RoPE: frequency `i` takes the
//! h position when `i ≡ 1 (mod 3)` and `i < 3·section[1]`, the w position when
//! `i ≡ 2 (mod 3)` and `i < 3·section[2]`, else t (the interleaved layout;
//! transformers ignores `mrope_interleaved`). Text tokens have t = h = w.

use candle_core::Tensor;

use super::kernels::Dense;
use super::norms::{ZcNorm, load, sigmoid, to_vec};
use super::qsa::Indexer;
use super::state::AttnCache;
use crate::error::Result;
use crate::load::safetensors::SafetensorsDir;

/// Partial interleaved M-RoPE over the first `rotary_dim` dims.
#[derive(Debug, Clone)]
pub struct MRope {
    inv_freq: Vec<f32>,
    /// Which of (t, h, w) drives each frequency.
    axis: Vec<usize>,
    pub rotary_dim: usize,
}

impl MRope {
    pub fn new(theta: f64, rotary_dim: usize, section: [usize; 3]) -> Self {
        let half = rotary_dim / 2;
        // transformers: 1 / base^(arange(0, R, 2) / R) in f32.
        let inv_freq = (0..half)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / rotary_dim as f64)) as f32)
            .collect();
        let axis = (0..half)
            .map(|i| {
                if i % 3 == 1 && i < 3 * section[1] {
                    1
                } else if i % 3 == 2 && i < 3 * section[2] {
                    2
                } else {
                    0
                }
            })
            .collect();
        Self {
            inv_freq,
            axis,
            rotary_dim,
        }
    }

    /// Rotate the first `rotary_dim` values of `x` in place for position
    /// `pos = (t, h, w)`.
    pub fn apply(&self, x: &mut [f32], pos: [u32; 3]) {
        let half = self.rotary_dim / 2;
        for i in 0..half {
            let f = pos[self.axis[i]] as f32 * self.inv_freq[i];
            let (sin, cos) = f.sin_cos();
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos - b * sin;
            x[i + half] = b * cos + a * sin;
        }
    }
}

#[derive(Debug, Clone)]
pub struct GatedAttention {
    q_proj: Dense,
    k_proj: Dense,
    v_proj: Dense,
    o_proj: Dense,
    q_norm: ZcNorm,
    k_norm: ZcNorm,
    pub indexer: Indexer,
    hq: usize,
    hkv: usize,
    d: usize,
}

impl GatedAttention {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        st: &mut SafetensorsDir,
        prefix: &str,
        h: usize,
        hq: usize,
        hkv: usize,
        d: usize,
        indexer: (usize, usize, usize, usize),
        eps: f64,
    ) -> Result<Self> {
        let (n_heads, dim, budget, ratio) = indexer;
        Ok(Self {
            q_proj: Dense::new(load(st, prefix, "q_proj.weight", &[hq * 2 * d, h])?)?,
            k_proj: Dense::new(load(st, prefix, "k_proj.weight", &[hkv * d, h])?)?,
            v_proj: Dense::new(load(st, prefix, "v_proj.weight", &[hkv * d, h])?)?,
            o_proj: Dense::new(load(st, prefix, "o_proj.weight", &[h, hq * d])?)?,
            q_norm: ZcNorm::load(st, prefix, "q_norm.weight", d, d, eps)?,
            k_norm: ZcNorm::load(st, prefix, "k_norm.weight", d, d, eps)?,
            indexer: Indexer::load(
                st,
                &format!("{prefix}indexer."),
                h,
                n_heads,
                dim,
                budget,
                ratio,
                eps,
            )?,
            hq,
            hkv,
            d,
        })
    }

    pub fn kv_width(&self) -> usize {
        self.hkv * self.d
    }

    /// `x: [T, H]` → `[T, H]`. `positions` covers every cached token plus the
    /// `T` new ones. Returns the QSA selection of every new query too.
    pub fn forward(
        &self,
        x: &Tensor,
        cache: &mut AttnCache,
        positions: &[[u32; 3]],
        rope: &MRope,
    ) -> Result<(Tensor, Vec<Vec<u32>>)> {
        let t_len = x.dim(0)?;
        let (hq, hkv, d) = (self.hq, self.hkv, self.d);
        let kvw = hkv * d;
        let base = cache.k.len() / kvw;
        let selected = self.indexer.forward(x, cache, positions, rope)?;

        let qg = to_vec(&self.q_proj.forward(x)?)?;
        let mut k = to_vec(&self.k_proj.forward(x)?)?;
        let v = to_vec(&self.v_proj.forward(x)?)?;
        for (i, row) in k.chunks_exact_mut(kvw).enumerate() {
            for head in row.chunks_exact_mut(d) {
                self.k_norm.apply_host(head);
                rope.apply(head, positions[base + i]);
            }
        }
        cache.k.extend_from_slice(&k);
        cache.v.extend_from_slice(&v);

        let scale = 1.0 / (d as f32).sqrt();
        let group = hq / hkv;
        let mut out = vec![0f32; t_len * hq * d];
        let mut q = vec![0f32; d];
        let mut w = Vec::new();
        for (i, keep) in selected.iter().enumerate() {
            for h in 0..hq {
                let src = &qg[(i * hq + h) * 2 * d..];
                q.copy_from_slice(&src[..d]);
                self.q_norm.apply_host(&mut q);
                rope.apply(&mut q, positions[base + i]);
                let kvh = h / group;
                w.clear();
                let mut max = f32::NEG_INFINITY;
                for &j in keep {
                    let kj = &cache.k[j as usize * kvw + kvh * d..][..d];
                    let s = q.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
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
                    let vj = &cache.v[j as usize * kvw + kvh * d..][..d];
                    for (a, b) in o.iter_mut().zip(vj) {
                        *a += p / sum * b;
                    }
                }
                let gate = &src[d..2 * d];
                for (a, g) in o.iter_mut().zip(gate) {
                    *a *= sigmoid(*g);
                }
            }
        }
        let y = Tensor::from_vec(out, (t_len, hq * d), x.device())?;
        Ok((self.o_proj.forward(&y)?, selected))
    }
}
