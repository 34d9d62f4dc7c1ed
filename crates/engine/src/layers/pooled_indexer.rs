//! The DSA indexer over pooled keys (GLM-5's k-pool indexer): which cached
//! tokens each query of an MLA layer attends to. `Hi` heads of `di`, pools
//! of `P` tokens, batch 1, no padding (pools start at token 0).
//!
//! ```text
//! q_t   = wq_b·qr_t                                   [Hi, di]  (qr: the MLA query residual)
//! k_t   = LayerNorm_1e-6(wk·x_t)                      [di]      cached per token
//! gs_t  = index_kpool_compress_gate·x_t               [di]      cached per token, raw
//! K_p   = Σ_j softmax_j(gs_{pP+j} + ape_j) ⊙ k_{pP+j}  per channel, pool p complete
//! I_t,p = Σ_h (w_h(x_t)·Hi^−½)·relu(q_t,h·K_p·di^−½)   over the pools complete at t
//! keep  = tokens of the top min(topk/P, ⌊(t+1)/P⌋) pools (ties: lower pool)
//!         ∪ the incomplete tail ⌊(t+1)/P⌋·P ..= t
//! ```
//!
//! A pool key depends only on its own complete pool, so it is computed once,
//! when the pool completes, and cached ([`PooledIndexerCache::pools`]);
//! transformers recomputes every pool each step (same values). The raw keys
//! and gates stay cached so truncating inside a pool and completing it again
//! gives the same key.

use crate::backend::{Backend, HostWeight};
use crate::error::Result;
use crate::layers::linear::{BindLinear, Linear};
use crate::load::binder::Binder;
use crate::state::rows::RowCache;
use crate::table::{NamedTensor, TableReader};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PooledIndexerSpec {
    pub heads: usize,
    pub dim: usize,
    /// Tokens per pool.
    pub pool: usize,
    /// Complete pools kept per query (`index_topk / P`).
    pub pool_topk: usize,
    /// Always select the incomplete tail pool.
    pub tail: bool,
}

/// The indexer's cache: raw keys and gates per token, pool keys per
/// complete pool.
#[derive(Debug, Clone)]
pub struct PooledIndexerCache<B: Backend> {
    /// `[P, di]` each.
    pub keys: RowCache<B>,
    pub gates: RowCache<B>,
    /// `[⌊P/pool⌋, di]`.
    pub pools: RowCache<B>,
    pub pool: usize,
}

impl<B: Backend> PooledIndexerCache<B> {
    pub fn new(ops: &B, dim: usize, pool: usize) -> Result<Self> {
        Ok(Self {
            keys: RowCache::new(ops, dim)?,
            gates: RowCache::new(ops, dim)?,
            pools: RowCache::new(ops, dim)?,
            pool,
        })
    }

    /// Keep the first `n` tokens (a pool key depends only on its pool).
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        self.keys.truncate(ops, n)?;
        self.gates.truncate(ops, n)?;
        self.pools.truncate(ops, n / self.pool)
    }

    pub fn byte_size(&self) -> usize {
        self.keys.byte_size() + self.gates.byte_size() + self.pools.byte_size()
    }

    /// `{p}.idx_keys`, `{p}.idx_gates`, `{p}.idx_pools`.
    pub fn export(&self, ops: &B, p: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        out.push(self.keys.export(ops, format!("{p}.idx_keys"))?);
        out.push(self.gates.export(ops, format!("{p}.idx_gates"))?);
        out.push(self.pools.export(ops, format!("{p}.idx_pools"))?);
        Ok(())
    }

    /// Read `n` tokens' tables (lengths follow from `n`).
    pub fn import(&mut self, ops: &B, r: &mut TableReader, p: &str, n: usize) -> Result<()> {
        self.keys.import(ops, r, &format!("{p}.idx_keys"), n)?;
        self.gates.import(ops, r, &format!("{p}.idx_gates"), n)?;
        self.pools
            .import(ops, r, &format!("{p}.idx_pools"), n / self.pool)
    }
}

#[derive(Debug)]
pub struct PooledIndexer<B: Backend> {
    wq_b: Linear<B>,
    wk: Linear<B>,
    k_norm_w: B::Buf,
    k_norm_b: B::Buf,
    weights: Linear<B>,
    gate: Linear<B>,
    /// `[P·di]`.
    ape: B::Buf,
    pub spec: PooledIndexerSpec,
}

impl<B: Backend> PooledIndexer<B> {
    /// Bound under `w`'s scope (`…self_attn.indexer`) for inputs of width
    /// `h` and a query residual of `q_lora`.
    pub fn load(
        w: &mut Binder<'_, B>,
        h: usize,
        q_lora: usize,
        spec: PooledIndexerSpec,
    ) -> Result<Self> {
        let (hi, di, p) = (spec.heads, spec.dim, spec.pool);
        // A bare parameter (no `.weight`), used as a linear map.
        let gate: HostWeight = w.raw("index_kpool_compress_gate", &[di, h])?;
        Ok(Self {
            wq_b: w.linear("wq_b", hi * di, q_lora)?,
            wk: w.linear("wk", di, h)?,
            k_norm_w: w.vector("k_norm.weight", &[di])?,
            k_norm_b: w.vector("k_norm.bias", &[di])?,
            weights: w.linear("weights_proj", hi, h)?,
            gate: w.linear_from(gate, di, h)?,
            ape: w.vector("index_kpool_compress_ape", &[p, di])?,
            spec,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<PooledIndexerCache<B>> {
        PooledIndexerCache::new(ops, self.spec.dim, self.spec.pool)
    }

    /// Append the new tokens' keys and gates (and any newly complete pool
    /// keys) to `cache`, then select for each of the `rows` new queries.
    /// `x: [rows, H]` (the layer input), `qr: [rows, q_lora]`.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        qr: &B::Buf,
        rows: usize,
        cache: &mut PooledIndexerCache<B>,
    ) -> Result<B::Selection> {
        let projected = self.project_rows(ops, x, qr, rows)?;
        self.select_rows(ops, &projected, rows, cache)
    }

    /// The row-wise half of [`Self::forward`] (a batched forward runs it
    /// once over every session's rows): `[k, g, q, w]`, the normed keys,
    /// the pooling gates, the queries and the head weights of `x`'s rows
    /// (`qr` their query residual).
    pub fn project_rows(
        &self,
        ops: &B,
        x: &B::Buf,
        qr: &B::Buf,
        rows: usize,
    ) -> Result<[B::Buf; 4]> {
        let k = ops.layer_norm(
            &self.wk.forward(ops, x, rows)?,
            self.spec.dim,
            &self.k_norm_w,
            &self.k_norm_b,
            1e-6,
        )?;
        let g = self.gate.forward(ops, x, rows)?;
        let q = self.wq_b.forward(ops, qr, rows)?;
        let w = self.weights.forward(ops, x, rows)?;
        Ok([k, g, q, w])
    }

    /// One session's part of [`Self::forward`], on its rows of
    /// [`Self::project_rows`]: its keys and gates appended (and any newly
    /// complete pool keys), then the selection of its `rows` queries.
    pub fn select_rows(
        &self,
        ops: &B,
        [k, g, q, w]: &[B::Buf; 4],
        rows: usize,
        cache: &mut PooledIndexerCache<B>,
    ) -> Result<B::Selection> {
        let PooledIndexerSpec {
            heads,
            dim,
            pool,
            pool_topk,
            tail,
        } = self.spec;
        cache.keys.append(ops, k)?;
        cache.gates.append(ops, g)?;
        let total = cache.keys.rows();
        let base = total - rows;
        let (first, last) = (cache.pools.rows(), total / pool);
        if last > first {
            let n = last - first;
            let kv = ops.rows(cache.keys.buf(), dim, first * pool, n * pool)?;
            let g = ops.rows(cache.gates.buf(), dim, first * pool, n * pool)?;
            // `ape` repeated for each new pool: `[n·P·di]`.
            let ape = ops.tile_streams(&self.ape, n, pool * dim)?;
            let pooled = ops.softmax_pool(&kv, &ops.add(&g, &ape)?, pool, dim)?;
            cache.pools.append(ops, &pooled)?;
        }
        let scores = ops.index_scores(
            q,
            w,
            cache.pools.buf(),
            rows,
            heads,
            dim,
            (dim as f64).powf(-0.5) as f32,
            (heads as f64).powf(-0.5) as f32,
        )?;
        let limits: Vec<usize> = (0..rows).map(|r| (base + r + 1) / pool).collect();
        let chosen = ops.select_topk(&scores, rows, cache.pools.rows(), &limits, pool_topk)?;
        ops.expand_pools(&chosen, base, pool, tail)
    }
}
