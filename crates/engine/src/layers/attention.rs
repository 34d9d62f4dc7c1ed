//! Grouped-query causal self-attention with RoPE and a KV cache.
//!
//! `x: [t, hidden]` are `t` new positions starting at `offset` (the cache
//! length). Queries `[heads, t, d]` are regrouped as `[kv_heads, group * t,
//! d]` (query head `h` reads kv head `h / group`, as transformers'
//! `repeat_kv` does) so one batched matmul per kv head serves the whole
//! group: no copy of the cache per query head, and no broadcast matmul
//! (slow in candle on CPU). Scores and softmax are in f32.
//!
//! On the CPU, scores, softmax and the weighted sum run in
//! [`crate::backend::cpu::attention`], whose per-query result does not
//! depend on the window size (warm == cold bit for bit). Elsewhere the
//! batched candle path below is used; there the causal mask is built only
//! for multi-token windows: query `i` sees
//! keys `0 ..= offset + i`. It is `[t, offset + t]` and broadcast over heads;
//! the scores themselves are `[heads, t, offset + t]`, which bounds the
//! useful prefill chunk size on long contexts.

use candle_core::{Device, Result, Tensor};

use super::linear::Linear;
use super::rope::Rope;
use crate::backend::cpu::attention::CausalAttention;
use crate::state::kv_cache::KvCache;

#[derive(Debug, Clone)]
pub struct Attention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl Attention {
    /// `x: [t, hidden]` → `[t, hidden]`; writes this window's keys and
    /// values into `cache` layer `layer` at positions `cache.len() ..`.
    /// `cos`/`sin` are the RoPE tables for those positions.
    pub fn forward(
        &self,
        x: &Tensor,
        rope: &Rope,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
        layer: usize,
    ) -> crate::error::Result<Tensor> {
        let t = x.dim(0)?;
        let offset = cache.len();
        let (h, kvh, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let group = h / kvh;

        let heads = |y: Tensor, n: usize| -> Result<Tensor> {
            // [t, n * d] → [n, t, d]
            y.reshape((t, n, d))?.transpose(0, 1)?.contiguous()
        };
        let q = heads(self.q.forward(x)?, h)?;
        let k = heads(self.k.forward(x)?, kvh)?;
        let v = heads(self.v.forward(x)?, kvh)?;
        let q = rope.apply(&q, cos, sin)?;
        let k = rope.apply(&k, cos, sin)?;

        let (k_all, v_all) = cache.write(layer, &k, &v)?;
        let total = offset + t;

        // Scale q (t·d values) rather than the scores (t·total values).
        let q = (q * (1.0 / (d as f64).sqrt()))?.reshape((kvh, group * t, d))?;
        let y = if x.device().is_cpu() {
            // Row-independent kernel: a query's output does not depend on
            // how the sequence was chunked, so warm turns equal cold ones
            // bit for bit (see backend::cpu::attention).
            q.apply_op3_no_bwd(&k_all, &v_all, &CausalAttention { offset, t })?
        } else {
            let scores = q.matmul(&k_all.t()?)?; // [kvh, group * t, total]
            let scores = if t > 1 {
                let mask = causal_mask(t, offset, x.device())?; // [t, total]
                scores
                    .reshape((kvh, group, t, total))?
                    .broadcast_add(&mask)?
                    .reshape((kvh, group * t, total))?
            } else {
                scores
            };
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            probs.matmul(&v_all)? // [kvh, group * t, d]
        };
        let y = y
            .reshape((h, t, d))?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((t, h * d))?;
        Ok(self.o.forward(&y)?)
    }
}

/// `[t, offset + t]`: 0 where query `i` may attend key `j` (`j <= offset + i`),
/// −∞ elsewhere.
fn causal_mask(t: usize, offset: usize, device: &Device) -> Result<Tensor> {
    let total = offset + t;
    let mut m = vec![0f32; t * total];
    for i in 0..t {
        for v in &mut m[i * total + offset + i + 1..(i + 1) * total] {
            *v = f32::NEG_INFINITY;
        }
    }
    Tensor::from_vec(m, (t, total), device)
}
