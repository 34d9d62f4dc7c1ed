//! Grouped-query causal self-attention with RoPE and a KV cache (llama).
//!
//! `x: [t, hidden]` are `t` new positions starting at `offset` (the cache
//! length). Keys and values are written to the cache first, then every
//! query attends from the cache (query head `h` reads kv head `h / group`,
//! as transformers' `repeat_kv` does) through
//! [`crate::backend::Backend::attention_causal`] (or `attention_causal_half`
//! over an f16 cache), whose per-query result does not depend on the window
//! size (warm == cold bit for bit).

use crate::backend::{Backend, Epilogue, Heads};
use crate::error::Result;
use crate::layers::linear::Linear;
use crate::layers::rope::RopeRows;
use crate::state::kv_cache::{KvCache, KvRows};

#[derive(Debug)]
pub struct Attention<B: Backend> {
    pub q: Linear<B>,
    pub k: Linear<B>,
    pub v: Linear<B>,
    pub o: Linear<B>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl<B: Backend> Attention<B> {
    /// `x: [t, hidden]` → `[t, hidden]`; writes this window's keys and
    /// values into `cache` layer `layer` at positions `cache.len() ..`.
    /// `rope` holds the tables of those positions.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        t: usize,
        rope: &RopeRows<B>,
        cache: &mut KvCache<B>,
        layer: usize,
    ) -> Result<B::Buf> {
        self.forward_at(ops, x, t, rope, cache, layer, None)
    }

    /// [`Attention::forward`], or with `step` the same computation as a
    /// step (the cache prepared by [`KvCache::prepare_step`], positions
    /// from the step): the bits are the same.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_at(
        &self,
        ops: &B,
        x: &B::Buf,
        t: usize,
        rope: &RopeRows<B>,
        cache: &mut KvCache<B>,
        layer: usize,
        step: Option<&B::Step>,
    ) -> Result<B::Buf> {
        let offset = cache.len();
        let d = self.head_dim;
        // The three projections of `x` as one call (one launch for a
        // decode row or a verify window on a device; q, k, v in turn where
        // a backend runs the parts one by one, as the CPU does).
        let [mut q, mut k, v] = Linear::forward_many(
            ops,
            x,
            t,
            [
                (&self.q, Epilogue::Chain(&[])),
                (&self.k, Epilogue::Chain(&[])),
                (&self.v, Epilogue::Chain(&[])),
            ],
        )?;
        rope.apply(ops, &mut q, d)?;
        rope.apply(ops, &mut k, d)?;
        let rows = match step {
            None => cache.write(layer, &k, &v)?,
            Some(s) => cache.write_step(layer, &k, &v, s)?,
        };
        // Scale q (t·d values) rather than the scores (t·total values),
        // `q·(1/√d) + 0` as candle's affine computed it.
        let q = ops.affine(&q, (1.0 / (d as f64).sqrt()) as f32, 0.0)?;
        let kv = Heads {
            heads: self.num_kv_heads,
            dim: d,
        };
        let y = match (rows, step) {
            (KvRows::F32(k, v), None) => {
                ops.attention_causal(&q, &k, &v, offset, self.num_heads, kv)?
            }
            (KvRows::F32(k, v), Some(s)) => {
                ops.attention_causal_step(&q, &k, &v, s, self.num_heads, kv)?
            }
            // (An f16 cache refuses step mode in `write_step`.)
            (KvRows::F16(k, v), _) => {
                ops.attention_causal_half(&q, &k, &v, offset, self.num_heads, kv)?
            }
        };
        self.o.forward(ops, &y, t)
    }
}
