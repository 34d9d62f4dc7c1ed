//! Grouped-query causal self-attention with RoPE and a KV cache (llama).
//!
//! `x: [t, hidden]` are `t` new positions starting at `offset` (the cache
//! length). Keys and values are written to the cache first, then every
//! query attends from the cache (query head `h` reads kv head `h / group`,
//! as transformers' `repeat_kv` does) through
//! [`crate::backend::Backend::attention_causal`] (or `attention_causal_half`
//! over an f16 cache), whose per-query result does not depend on the window
//! size (warm == cold bit for bit).

use crate::backend::{Backend, CausalPart, CausalRows, Epilogue, Heads};
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
        let [q, k, v] = self.project(ops, x, t)?;
        let y = self.attend(ops, [q, k, v], rope, cache, layer, step)?;
        self.o.forward(ops, &y, t)
    }

    /// Several sessions' rows at once (continuous batching): `x` holds each
    /// part's `t` rows one after another and `rope` their tables in the same
    /// order ([`crate::layers::rope::Rope::tables_runs`]); the projections, the rotation and the
    /// query scale run once over all of them, each part writes its cache and
    /// attends over it at its own positions, and the output projection runs
    /// once. Every op is row-independent, so each part's rows have the bits
    /// of [`Attention::forward`] alone.
    pub fn forward_batch(
        &self,
        ops: &B,
        x: &B::Buf,
        rope: &RopeRows<B>,
        parts: &mut [AttnPart<'_, B>],
        layer: usize,
    ) -> Result<B::Buf> {
        let total: usize = parts.iter().map(|p| p.t).sum();
        if parts.is_empty() {
            return ops.zeros(0);
        }
        let [mut q, mut k, v] = self.project(ops, x, total)?;
        let d = self.head_dim;
        rope.apply(ops, &mut q, d)?;
        rope.apply(ops, &mut k, d)?;
        let q = self.scale_queries(ops, &q)?;
        let (qd, kvd) = (self.num_heads * d, self.num_kv_heads * d);
        // f32 caches: every session's rows into its cache in one call, then
        // every attention over the queries in place in one more (a launch
        // each on CUDA, where the per-session copies, appends and
        // attentions below were ~15 launches a session and layer).
        let offsets: Vec<usize> = parts.iter().map(|p| p.cache.len()).collect();
        let ts: Vec<usize> = parts.iter().map(|p| p.t).collect();
        let mut caches: Vec<&mut KvCache<B>> = parts.iter_mut().map(|p| &mut *p.cache).collect();
        if KvCache::write_batch(ops, &mut caches, layer, &k, &v, &ts)? {
            let rows: Vec<KvRows<'_, B>> = caches
                .iter()
                .map(|c| c.written(layer))
                .collect::<Result<_>>()?;
            let sessions = rows
                .iter()
                .zip(ts.iter().zip(&offsets))
                .map(|(r, (&t, &offset))| match r {
                    KvRows::F32(k, v) => Ok(CausalRows { t, k, v, offset }),
                    KvRows::F16(..) => Err(crate::error::EngineError::State(
                        "a batch mixes f32 and f16 kv caches".into(),
                    )),
                })
                .collect::<Result<Vec<_>>>()?;
            let kv = Heads {
                heads: self.num_kv_heads,
                dim: d,
            };
            let y = ops.attention_causal_rows(&q, &sessions, self.num_heads, kv)?;
            return self.o.forward(ops, &y, total);
        }
        drop(caches);
        // f16 caches (the CPU): every session's rows into its cache first,
        // then all the attentions in one call (one dispatch on the CPU).
        let mut windows = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in parts.iter_mut() {
            let offset = p.cache.len();
            p.cache.write(
                layer,
                &ops.rows(&k, kvd, at, p.t)?,
                &ops.rows(&v, kvd, at, p.t)?,
            )?;
            windows.push((ops.rows(&q, qd, at, p.t)?, offset));
            at += p.t;
        }
        let rows: Vec<KvRows<'_, B>> = parts
            .iter()
            .map(|p| p.cache.written(layer))
            .collect::<Result<_>>()?;
        let y = self.attend_sessions(ops, &windows, &rows)?;
        self.o.forward(ops, &y, total)
    }

    /// [`Attention::forward_batch`]'s attentions: session `i`'s scaled
    /// queries and offset `windows[i]` over its cache rows `rows[i]`, the
    /// outputs one after another.
    fn attend_sessions(
        &self,
        ops: &B,
        windows: &[(B::Buf, usize)],
        rows: &[KvRows<'_, B>],
    ) -> Result<B::Buf> {
        let kv = Heads {
            heads: self.num_kv_heads,
            dim: self.head_dim,
        };
        let f32_parts = causal_parts(
            windows,
            rows.iter().map(|r| match r {
                KvRows::F32(k, v) => Some((k.as_slice(), v.as_slice())),
                KvRows::F16(..) => None,
            }),
        );
        if let Some(parts) = f32_parts {
            return ops.attention_causal_batch(&parts, self.num_heads, kv);
        }
        let f16_parts = causal_parts(
            windows,
            rows.iter().map(|r| match r {
                KvRows::F16(k, v) => Some((k.as_slice(), v.as_slice())),
                KvRows::F32(..) => None,
            }),
        );
        match f16_parts {
            Some(parts) => ops.attention_causal_half_batch(&parts, self.num_heads, kv),
            // One model's sessions share their cache type.
            None => Err(crate::error::EngineError::State(
                "a batch mixes f32 and f16 kv caches".into(),
            )),
        }
    }

    /// The three projections of `x` as one call (one launch for a decode
    /// row or a verify window on a device; q, k, v in turn where a backend
    /// runs the parts one by one, as the CPU does).
    fn project(&self, ops: &B, x: &B::Buf, t: usize) -> Result<[B::Buf; 3]> {
        Linear::forward_many(
            ops,
            x,
            t,
            [
                (&self.q, Epilogue::Chain(&[])),
                (&self.k, Epilogue::Chain(&[])),
                (&self.v, Epilogue::Chain(&[])),
            ],
        )
    }

    /// One session's attention over projected rows: rope, the cache write
    /// at `cache.len()`, the scaled query against every cached key. The
    /// output `[t, heads · head_dim]`, before the output projection.
    fn attend(
        &self,
        ops: &B,
        [mut q, mut k, v]: [B::Buf; 3],
        rope: &RopeRows<B>,
        cache: &mut KvCache<B>,
        layer: usize,
        step: Option<&B::Step>,
    ) -> Result<B::Buf> {
        let offset = cache.len();
        let d = self.head_dim;
        rope.apply(ops, &mut q, d)?;
        rope.apply(ops, &mut k, d)?;
        let rows = match step {
            None => cache.write(layer, &k, &v)?,
            Some(s) => cache.write_step(layer, &k, &v, s)?,
        };
        let q = self.scale_queries(ops, &q)?;
        self.attend_cached(ops, &q, rows, offset, step)
    }

    /// Scale q (t·d values) rather than the scores (t·total values),
    /// `q·(1/√d) + 0` as candle's affine computed it.
    fn scale_queries(&self, ops: &B, q: &B::Buf) -> Result<B::Buf> {
        ops.affine(q, (1.0 / (self.head_dim as f64).sqrt()) as f32, 0.0)
    }

    /// Scaled queries against the cached rows (`offset` positions before
    /// these queries).
    fn attend_cached(
        &self,
        ops: &B,
        q: &B::Buf,
        rows: KvRows<B>,
        offset: usize,
        step: Option<&B::Step>,
    ) -> Result<B::Buf> {
        let kv = Heads {
            heads: self.num_kv_heads,
            dim: self.head_dim,
        };
        match (rows, step) {
            (KvRows::F32(k, v), None) => {
                ops.attention_causal(q, &k, &v, offset, self.num_heads, kv)
            }
            (KvRows::F32(k, v), Some(s)) => {
                ops.attention_causal_step(q, &k, &v, s, self.num_heads, kv)
            }
            // (An f16 cache refuses step mode in `write_step`.)
            (KvRows::F16(k, v), _) => {
                ops.attention_causal_half(q, &k, &v, offset, self.num_heads, kv)
            }
        }
    }
}

/// Each session's window and its cache's keys and values of one element
/// type (`None` for a session whose cache holds the other: then `None`).
fn causal_parts<'a, Q, K>(
    windows: &'a [(Q, usize)],
    caches: impl Iterator<Item = Option<(&'a [&'a K], &'a [&'a K])>>,
) -> Option<Vec<CausalPart<'a, Q, K>>> {
    windows
        .iter()
        .zip(caches)
        .map(|((q, offset), kv)| {
            kv.map(|(k, v)| CausalPart {
                q,
                k,
                v,
                offset: *offset,
            })
        })
        .collect()
}

/// One session's part of [`Attention::forward_batch`]: its row count and
/// its cache.
pub struct AttnPart<'a, B: Backend> {
    pub t: usize,
    pub cache: &'a mut KvCache<B>,
}
