//! A block-sparse attention indexer (Qwen's QSA; DeepSeek's and GLM's
//! indexers over pooled keys share the mechanics): which cached tokens each
//! query may attend to.
//!
//! ```text
//! [q (nI×dI) | k (dI)] = index_qk_proj·x
//! qI_h   = RoPE_R( N1(q_h; q_layernorm), pos_t )     rotates the first R of dI dims
//! kraw   = k                                         cached raw: [P, dI]
//! kb_j   = RoPE_R( N1( mean(kraw[j·ratio .. (j+1)·ratio]); k_layernorm ), pos of the block's first token )
//! score_j = Σ_h relu(qI_h · kb_j) / √dI              fp32
//! keep   = tokens of the top min(block_topk, nb) blocks ∪ the incomplete tail
//! ```
//!
//! For a query at index `t` (batch 1, no padding) the visible tokens are
//! `0..=t`, `nb = ⌊(t+1)/ratio⌋` blocks are complete and the tail is
//! `nb·ratio..=t`. Nothing is pruned until a query sees `budget + ratio`
//! tokens; the query's own token can be dropped (its block may be complete
//! and not chosen) — the diagonal is *not* forced.
//!
//! Block keys depend only on their own complete block, so they are computed
//! once when the block completes and cached ([`IndexerCache::blocks`]).

use crate::backend::{Backend, IndexerShape};
use crate::error::Result;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::ZcNorm;
use crate::layers::rope::{PositionTables, Positions, RopeRows};
use crate::load::binder::Binder;
use crate::state::rows::RowCache;

/// The indexer's cache: raw keys per token and block keys per complete
/// block.
#[derive(Debug, Clone)]
pub struct IndexerCache<B: Backend> {
    /// `[P, dI]`.
    pub raw: RowCache<B>,
    /// `[⌊P/ratio⌋, dI]`.
    pub blocks: RowCache<B>,
    /// Tokens per block.
    pub ratio: usize,
}

impl<B: Backend> IndexerCache<B> {
    pub fn new(ops: &B, dim: usize, ratio: usize) -> Result<Self> {
        Ok(Self {
            raw: RowCache::new(ops, dim)?,
            blocks: RowCache::new(ops, dim)?,
            ratio,
        })
    }

    /// Keep the first `n` tokens (a block key depends only on its own
    /// complete block).
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        self.raw.truncate(ops, n)?;
        self.blocks.truncate(ops, n / self.ratio.max(1))
    }

    pub fn byte_size(&self) -> usize {
        self.raw.byte_size() + self.blocks.byte_size()
    }
}

#[derive(Debug)]
pub struct Indexer<B: Backend> {
    qk: Linear<B>,
    q_norm: ZcNorm<B>,
    k_norm: ZcNorm<B>,
    pub shape: IndexerShape,
}

impl<B: Backend> Indexer<B> {
    /// Bound under `w`'s scope (`…self_attn.indexer`) for inputs of width
    /// `h`.
    pub fn load(w: &mut Binder<'_, B>, h: usize, shape: IndexerShape, eps: f64) -> Result<Self> {
        let dim = shape.dim;
        Ok(Self {
            qk: w.linear("index_qk_proj", (shape.heads + 1) * dim, h)?,
            q_norm: ZcNorm::load(w, "q_layernorm.weight", dim, dim, eps)?,
            k_norm: ZcNorm::load(w, "k_layernorm.weight", dim, dim, eps)?,
            shape,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<IndexerCache<B>> {
        IndexerCache::new(ops, self.shape.dim, self.shape.ratio)
    }

    /// Append the new tokens' raw keys (and any newly complete block keys)
    /// to `cache`, then select for every new query. `x: [rows, H]`; the new
    /// queries are the last `rows` of `pos.all`.
    pub fn forward<R: PositionTables<B>>(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        cache: &mut IndexerCache<B>,
        pos: &Positions<'_, B, R>,
    ) -> Result<B::Selection> {
        let (q, k) = self.project_rows(ops, x, rows, pos.rows)?;
        self.select_rows(ops, [&q, &k], rows, cache, pos.all, pos.rope)
    }

    /// The row-wise half of [`Self::forward`]: the q / k projection of `x`,
    /// then q's norm and RoPE (`rope`: the tables of `x`'s rows) → `(q,
    /// raw k)`. A batched forward runs it once over every session's rows.
    pub fn project_rows(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        rope: &RopeRows<B>,
    ) -> Result<(B::Buf, B::Buf)> {
        let (nh, d) = (self.shape.heads, self.shape.dim);
        let qk = self.qk.forward(ops, x, rows)?;
        let mut parts = ops.split_cols(&qk, rows, &[nh * d, d], 1)?;
        let k = parts.pop().expect("two parts");
        let mut q = parts.pop().expect("two parts");
        self.q_norm.apply_heads(ops, &mut q)?;
        rope.apply(ops, &mut q, d)?;
        Ok((q, k))
    }

    /// The part of [`Self::forward`] on one session's cache, after
    /// [`Self::project_rows`] of its rows: append the raw keys `k` (and
    /// any newly complete block keys, rotated at their first token's
    /// position in `all`, every cached position and the new rows', by
    /// `rope`), then select for the queries `q`.
    pub fn select_rows<R: PositionTables<B>>(
        &self,
        ops: &B,
        [q, k]: [&B::Buf; 2],
        rows: usize,
        cache: &mut IndexerCache<B>,
        all: &[[u32; 3]],
        rope: &R,
    ) -> Result<B::Selection> {
        let (d, ratio) = (self.shape.dim, self.shape.ratio);
        cache.raw.append(ops, k)?;
        let total = cache.raw.rows();
        let base = total - rows;
        let (first, last) = (cache.blocks.rows(), total / ratio);
        if last > first {
            let mut kb = ops.block_keys(cache.raw.buf(), d, ratio, first, last)?;
            self.k_norm.apply_heads(ops, &mut kb)?;
            let starts: Vec<[u32; 3]> = (first..last).map(|j| all[j * ratio]).collect();
            rope.tables(ops, &starts)?.apply(ops, &mut kb, d)?;
            cache.blocks.append(ops, &kb)?;
        }
        ops.indexer_select(q, cache.blocks.buf(), base, self.shape)
    }
}
