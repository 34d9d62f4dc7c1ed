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
//! query) through the backend's gathered attention: that is the point of QSA
//! and avoids materialising a dense masked `[Hq, T, P+T]` score tensor.
//!
//! RoPE: `R = int(D·partial_rotary_factor)`, half-split rotation of the first
//! `R` dims with the interleaved M-RoPE of [`crate::layers::rope::MRope`].

use super::config::Qwen4ExpConfig;
use super::state::AttnCache;
use crate::backend::{Backend, Epilogue, Heads, IndexerShape};
use crate::error::Result;
use crate::layers::indexer::Indexer;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::ZcNorm;
use crate::layers::rope::{MRope, Positions, RopeRows};
use crate::load::binder::Binder;

#[derive(Debug)]
pub struct GatedAttention<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    q_norm: ZcNorm<B>,
    k_norm: ZcNorm<B>,
    pub indexer: Indexer<B>,
    hq: usize,
    hkv: usize,
    d: usize,
}

impl<B: Backend> GatedAttention<B> {
    /// Bound under `w`'s scope (`…self_attn`).
    pub fn load(cfg: &Qwen4ExpConfig, w: &mut Binder<'_, B>) -> Result<Self> {
        let (h, hq, hkv, d) = (
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        );
        let eps = cfg.rms_norm_eps;
        let shape = IndexerShape {
            heads: cfg.indexer_n_heads,
            dim: cfg.indexer_head_dim,
            ratio: cfg.indexer_compress_ratio,
            block_topk: cfg.indexer_budget / cfg.indexer_compress_ratio,
        };
        Ok(Self {
            q_proj: w.linear("q_proj", hq * 2 * d, h)?,
            k_proj: w.linear("k_proj", hkv * d, h)?,
            v_proj: w.linear("v_proj", hkv * d, h)?,
            o_proj: w.linear("o_proj", h, hq * d)?,
            q_norm: ZcNorm::load(w, "q_norm.weight", d, d, eps)?,
            k_norm: ZcNorm::load(w, "k_norm.weight", d, d, eps)?,
            indexer: Indexer::load(&mut w.pp("indexer"), h, shape, eps)?,
            hq,
            hkv,
            d,
        })
    }

    pub fn kv_width(&self) -> usize {
        self.hkv * self.d
    }

    pub fn new_cache(&self, ops: &B) -> Result<AttnCache<B>> {
        AttnCache::new(ops, self.kv_width(), self.indexer.new_cache(ops)?)
    }

    /// `x: [T, H]` → `[T, H]`; `pos` covers every cached token plus the `T`
    /// new ones. Returns the QSA selection of every new query too.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        cache: &mut AttnCache<B>,
        pos: &Positions<'_, B, MRope>,
    ) -> Result<(B::Buf, B::Selection)> {
        let selected = self.select(ops, x, rows, cache, pos)?;
        let qkv = self.project(ops, x, rows)?;
        let y = self.attend(ops, qkv, rows, cache, pos, &selected)?;
        Ok((self.output(ops, &y, rows)?, selected))
    }

    /// One session's QSA selection: its indexer over its rows `x`
    /// (advancing the indexer cache).
    pub(super) fn select(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        cache: &mut AttnCache<B>,
        pos: &Positions<'_, B, MRope>,
    ) -> Result<B::Selection> {
        self.indexer.forward(ops, x, rows, &mut cache.indexer, pos)
    }

    /// The row-wise projections of `x`: `[q|gate, k, v]` (a batched forward
    /// runs them once over every session's rows).
    pub(super) fn project(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<[B::Buf; 3]> {
        // The three projections of `x` as one call (one launch for a
        // decode row).
        Linear::forward_many(
            ops,
            x,
            rows,
            [
                (&self.q_proj, Epilogue::Chain(&[])),
                (&self.k_proj, Epilogue::Chain(&[])),
                (&self.v_proj, Epilogue::Chain(&[])),
            ],
        )
    }

    /// The part on one session's caches and positions (its rows of the
    /// projections, its selection): the q / k norms and RoPE, the cache
    /// append and the gathered attention, gated; → the input of `o_proj`.
    pub(super) fn attend(
        &self,
        ops: &B,
        [qg, k, v]: [B::Buf; 3],
        rows: usize,
        cache: &mut AttnCache<B>,
        pos: &Positions<'_, B, MRope>,
        selected: &B::Selection,
    ) -> Result<B::Buf> {
        let [q, gate, k] = self.attend_rows(ops, &qg, k, rows, pos.rows)?;
        let o = self.attend_cached(ops, [&q, &k, &v], cache, selected)?;
        self.gated(ops, &o, &gate)
    }

    /// The row-wise half of [`Self::attend`] (a batched forward runs it
    /// once over every session's rows): `qg` split into q and the gate,
    /// then the q / k norms and RoPE (`rope`: the rows' tables) → `[q,
    /// gate, k]`.
    pub(super) fn attend_rows(
        &self,
        ops: &B,
        qg: &B::Buf,
        mut k: B::Buf,
        rows: usize,
        rope: &RopeRows<B>,
    ) -> Result<[B::Buf; 3]> {
        let (hq, d) = (self.hq, self.d);
        let mut parts = ops.split_cols(qg, rows, &[d, d], hq)?;
        let gate = parts.pop().expect("two parts");
        let mut q = parts.pop().expect("two parts");
        self.k_norm.apply_heads(ops, &mut k)?;
        rope.apply(ops, &mut k, d)?;
        self.q_norm.apply_heads(ops, &mut q)?;
        rope.apply(ops, &mut q, d)?;
        Ok([q, gate, k])
    }

    /// One session's part of [`Self::attend`]: its rows' k and v appended
    /// to its cache, then the gathered attention of its queries over it.
    pub(super) fn attend_cached(
        &self,
        ops: &B,
        [q, k, v]: [&B::Buf; 3],
        cache: &mut AttnCache<B>,
        selected: &B::Selection,
    ) -> Result<B::Buf> {
        cache.k.append(ops, k)?;
        cache.v.append(ops, v)?;
        ops.attention_gathered(
            q,
            cache.k.buf(),
            cache.v.buf(),
            selected,
            self.hq,
            Heads {
                heads: self.hkv,
                dim: self.d,
            },
            None,
        )
    }

    /// The attention output gated row by row: `o · sigmoid(gate)`.
    pub(super) fn gated(&self, ops: &B, o: &B::Buf, gate: &B::Buf) -> Result<B::Buf> {
        ops.mul(o, &ops.sigmoid(gate)?)
    }

    /// The row-wise output projection.
    pub(super) fn output(&self, ops: &B, y: &B::Buf, rows: usize) -> Result<B::Buf> {
        self.o_proj.forward(ops, y, rows)
    }
}
