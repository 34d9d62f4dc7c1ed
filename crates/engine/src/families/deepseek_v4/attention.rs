//! DeepSeek-V4 attention: shared-K=V multi-query attention over a sliding
//! window, plus compressed entries (HCA: every complete entry; CSA: the
//! entries the lightning indexer picks), with per-head sinks.
//!
//! ```text
//! qr  = q_norm(wq_a·x)                                    shared with the indexer
//! q   = RoPE( rms_heads(wq_b·qr) )                         unweighted per-head norm
//! kv  = RoPE( norm(wkv·x) )                                one head: both K and V
//! o   = softmax([q·kv_window ; q·entries ; sink]/√d) · [kv_window ; entries]   (sink column dropped)
//! o   = RoPE⁻¹(o)                                          rotate back by −position
//! y   = wo_b · concat_g( wo_a_g · o_g )                    grouped low-rank output
//! ```
//!
//! Sliding layers use the main rope, CSA/HCA layers the compress rope (for
//! q, kv, the entries and the indexer). RoPE rotates the trailing
//! `rope_dim` dims of each head in interleaved pairs.
//!
//! The lightning indexer (CSA): its own overlapping compressor at
//! `index_head_dim`, `q_I = RoPE(wq_b·qr)`, `w = weights_proj·x`, and per
//! query `score_e = Σ_h w_h/√Hi · relu(q_I,h·K_e)/√di` over the entries the
//! query may see (`e < (t+1)/m`); the top `index_topk` are kept.

use std::sync::Arc;

use super::config::{AttnKind, DeepseekV4Config};
use crate::backend::{Backend, EntryKeep, Epilogue, HostWeight};
use crate::error::{EngineError, Result};
use crate::families::batch_split::split_rows;
use crate::layers::compressor::{Compressor, CompressorCache, STEP_BACK};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::RmsNorm;
use crate::layers::rope::{RopeFreqs, RopeRows};
use crate::load::binder::Binder;
use crate::state::tail::Tail;
use crate::table::{NamedTensor, TableReader};

/// The two rotary embeddings of the model.
#[derive(Debug)]
pub struct Ropes {
    pub main: RopeFreqs,
    pub compress: RopeFreqs,
}

/// One forward's rotations: the frequencies (the compressors rotate their
/// entries at their own positions) and the tables of the new rows, made
/// once and read by every layer.
#[derive(Debug)]
pub struct Rotations<'a, B: Backend> {
    pub freqs: &'a Ropes,
    /// Token index of the first new row.
    pub base: usize,
    pub main: RopeRows<B>,
    pub main_inverse: RopeRows<B>,
    pub compress: RopeRows<B>,
    pub compress_inverse: RopeRows<B>,
}

/// A batch's tables `[rotation, inverse]` at the main and the compressed
/// frequencies for every session's rows at its own positions, one after
/// another (a table row depends on its position alone: each session's
/// rows read its own tables).
#[derive(Debug)]
pub struct RowTables<B: Backend> {
    pub main: [RopeRows<B>; 2],
    pub compress: [RopeRows<B>; 2],
}

impl Ropes {
    /// The tables of rows at `positions` (a batch's rows).
    pub fn for_positions<B: Backend>(&self, ops: &B, positions: &[usize]) -> Result<RowTables<B>> {
        let at = || positions.iter().copied();
        Ok(RowTables {
            main: [
                self.main.tables(ops, at(), false)?,
                self.main.tables(ops, at(), true)?,
            ],
            compress: [
                self.compress.tables(ops, at(), false)?,
                self.compress.tables(ops, at(), true)?,
            ],
        })
    }

    /// The tables of rows `base .. base + rows`.
    pub fn for_rows<B: Backend>(
        &self,
        ops: &B,
        base: usize,
        rows: usize,
    ) -> Result<Rotations<'_, B>> {
        let at = base..base + rows;
        Ok(Rotations {
            freqs: self,
            base,
            main: self.main.tables(ops, at.clone(), false)?,
            main_inverse: self.main.tables(ops, at.clone(), true)?,
            compress: self.compress.tables(ops, at.clone(), false)?,
            compress_inverse: self.compress.tables(ops, at, true)?,
        })
    }
}

#[derive(Debug)]
pub struct LightningIndexer<B: Backend> {
    compressor: Compressor<B>,
    wq_b: Linear<B>,
    weights: Linear<B>,
    heads: usize,
    dim: usize,
    topk: usize,
    rope_dim: usize,
}

#[derive(Debug)]
pub struct Attention<B: Backend> {
    wq_a: Linear<B>,
    q_norm: RmsNorm<B>,
    wq_b: Linear<B>,
    wkv: Linear<B>,
    kv_norm: RmsNorm<B>,
    /// One `[o_lora, H·d/g]` block per group.
    wo_a: Vec<Linear<B>>,
    wo_b: Linear<B>,
    sinks: B::Buf,
    /// Ones `[d]`: the per-head q norm has no weight.
    ones: B::Buf,
    pub kind: AttnKind,
    compressor: Option<Compressor<B>>,
    indexer: Option<LightningIndexer<B>>,
    heads: usize,
    dim: usize,
    rope_dim: usize,
    window: usize,
    eps: f32,
}

/// An attention layer's cache.
#[derive(Debug, Clone)]
pub struct AttnCache<B: Backend> {
    /// Normed, rotated K=V rows `[·, d]` (the window and a step-back slack).
    pub window: Tail<B>,
    pub compressor: Option<CompressorCache<B>>,
    pub indexer: Option<CompressorCache<B>>,
    span: usize,
}

impl<B: Backend> Attention<B> {
    /// Bound under `w`'s scope (`…layers.L.attn`).
    pub fn load(w: &mut Binder<'_, B>, cfg: &DeepseekV4Config, kind: AttnKind) -> Result<Self> {
        let (h, d, nh) = (cfg.hidden_size, cfg.head_dim, cfg.num_heads);
        let (g, ol) = (cfg.o_groups, cfg.o_lora_rank);
        let group_in = nh * d / g;
        // `wo_a` is block-diagonal: rows `i·o_lora ..` act on group i.
        // A stored `wo_a` stays stored: each group is a view of its rows.
        let wo_a_all = w.raw("wo_a.weight", &[g * ol, group_in])?;
        let wo_a = (0..g)
            .map(|i| {
                let part = match &wo_a_all {
                    HostWeight::Quant(q) if q.can_cut(i * ol, (i + 1) * ol) => {
                        HostWeight::Quant(Arc::new(q.row_range(i * ol, (i + 1) * ol)))
                    }
                    other => HostWeight::F32(
                        other
                            .clone()
                            .to_f32()?
                            .narrow(0, i * ol, ol)?
                            .contiguous()?,
                    ),
                };
                w.linear_from(part, ol, group_in)
            })
            .collect::<Result<Vec<_>>>()?;
        let compressor = match kind {
            AttnKind::Sliding => None,
            AttnKind::Csa | AttnKind::Hca => Some(Compressor::load(
                &mut w.pp("compressor"),
                h,
                d,
                cfg.ratio_of(kind),
                kind == AttnKind::Csa,
                cfg.rope_dim,
                cfg.rms_norm_eps,
            )?),
        };
        let indexer = if kind == AttnKind::Csa {
            let mut x = w.pp("indexer");
            let (hi, di) = (cfg.index_n_heads, cfg.index_head_dim);
            Some(LightningIndexer {
                compressor: Compressor::load(
                    &mut x.pp("compressor"),
                    h,
                    di,
                    cfg.csa_rate,
                    true,
                    cfg.rope_dim,
                    cfg.rms_norm_eps,
                )?,
                wq_b: x.linear("wq_b", hi * di, cfg.q_lora_rank)?,
                weights: x.linear("weights_proj", hi, h)?,
                heads: hi,
                dim: di,
                topk: cfg.index_topk,
                rope_dim: cfg.rope_dim,
            })
        } else {
            None
        };
        let ops = w.ops().clone();
        Ok(Self {
            wq_a: w.linear("wq_a", cfg.q_lora_rank, h)?,
            q_norm: RmsNorm::load(w, "q_norm.weight", cfg.q_lora_rank, cfg.rms_norm_eps as f64)?,
            wq_b: w.linear("wq_b", nh * d, cfg.q_lora_rank)?,
            wkv: w.linear("wkv", d, h)?,
            // DeepSeek's release names it `kv_norm`; transformers' save `norm`.
            kv_norm: RmsNorm::load(
                w,
                if w.has("kv_norm.weight") {
                    "kv_norm.weight"
                } else {
                    "norm.weight"
                },
                d,
                cfg.rms_norm_eps as f64,
            )?,
            wo_a,
            wo_b: w.linear("wo_b", h, g * ol)?,
            sinks: w.vector("attn_sink", &[nh])?,
            ones: ops.upload(&vec![1.0; d])?,
            kind,
            compressor,
            indexer,
            heads: nh,
            dim: d,
            rope_dim: cfg.rope_dim,
            window: cfg.sliding_window,
            eps: cfg.rms_norm_eps,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<AttnCache<B>> {
        Ok(AttnCache {
            window: Tail::new(ops, self.dim)?,
            compressor: self
                .compressor
                .as_ref()
                .map(|c| c.new_cache(ops))
                .transpose()?,
            indexer: self
                .indexer
                .as_ref()
                .map(|i| i.compressor.new_cache(ops))
                .transpose()?,
            span: self.window,
        })
    }

    /// `x: [rows, h]` (the normed block input) for the tokens after
    /// everything `cache` covers → `[rows, h]`, and the CSA selection.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        cache: &mut AttnCache<B>,
        rot: &Rotations<'_, B>,
    ) -> Result<(B::Buf, Option<B::Selection>)> {
        let [tables, inverse] = self.kind_tables(
            [&rot.main, &rot.main_inverse],
            [&rot.compress, &rot.compress_inverse],
        );
        let rows_of = self.project_rows(ops, x, rows, [tables, &rot.compress])?;
        let (o, selection) = self.attend_cached(ops, x, &rows_of, rows, cache, rot)?;
        let y = self.output_rows(ops, o, rows, inverse)?;
        cache.trim(ops)?;
        Ok((y, selection))
    }

    /// Of a forward's tables `[rotation, inverse]` at the main and the
    /// compressed frequencies, the pair this layer's kind rotates by.
    pub(super) fn kind_tables<'t>(
        &self,
        main: [&'t RopeRows<B>; 2],
        compress: [&'t RopeRows<B>; 2],
    ) -> [&'t RopeRows<B>; 2] {
        match self.kind {
            AttnKind::Sliding => main,
            AttnKind::Csa | AttnKind::Hca => compress,
        }
    }

    /// The row-wise half of [`Self::forward`] before the caches (a batched
    /// forward runs it once over every session's rows): the normed and
    /// rotated query heads, the normed and rotated K = V row, and the
    /// indexer's rotated queries and head weights. `[rotate, compress]`:
    /// the rows' rotation at this layer kind's frequencies, and at the
    /// compressed ones (the indexer's).
    pub(super) fn project_rows(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        [rotate, compress]: [&RopeRows<B>; 2],
    ) -> Result<AttnRows<B>> {
        let (d, r) = (self.dim, self.rope_dim);
        // `wq_a` and `wkv` read the same rows: one launch for both where
        // the device can (each output has its own product's bits).
        let [qa, kv] = Linear::forward_many(
            ops,
            x,
            rows,
            [
                (&self.wq_a, Epilogue::Chain(&[])),
                (&self.wkv, Epilogue::Chain(&[])),
            ],
        )?;
        let qr = self.q_norm.forward(ops, &qa)?;
        let mut q = self.wq_b.forward(ops, &qr, rows)?;
        ops.rms_norm_heads(&mut q, d, &self.ones, self.eps)?;
        rotate.apply_trailing(ops, &mut q, d, r)?;
        let mut kv = self.kv_norm.forward(ops, &kv)?;
        rotate.apply_trailing(ops, &mut kv, d, r)?;
        let index = match &self.indexer {
            Some(ix) => Some(ix.project_rows(ops, x, &qr, rows, compress)?),
            None => None,
        };
        Ok(AttnRows { q, kv, index })
    }

    /// One session's part of [`Self::forward`], on its rows of `x` and of
    /// [`Self::project_rows`]: the K = V rows appended to its window, its
    /// compressor and indexer, then the window attention of its queries →
    /// the attention output (still rotated) and the CSA selection.
    pub(super) fn attend_cached(
        &self,
        ops: &B,
        x: &B::Buf,
        AttnRows { q, kv, index }: &AttnRows<B>,
        rows: usize,
        cache: &mut AttnCache<B>,
        rot: &Rotations<'_, B>,
    ) -> Result<(B::Buf, Option<B::Selection>)> {
        let d = self.dim;
        let base = cache.window.len();
        if rot.base != base {
            return Err(EngineError::State(format!(
                "rotation tables from token {} for a cache of {base}",
                rot.base
            )));
        }
        cache.window.append(ops, kv)?;

        if let (Some(c), Some(cc)) = (&self.compressor, cache.compressor.as_mut()) {
            c.forward(ops, x, rows, cc, &rot.freqs.compress)?;
        }
        let selection = match (&self.indexer, cache.indexer.as_mut(), index) {
            (Some(ix), Some(ic), Some(iq)) => Some(ix.select(ops, x, iq, rows, ic, rot)?),
            _ => None,
        };
        let empty = ops.zeros(0)?;
        let (entries, keep) = match (self.kind, &cache.compressor, &selection) {
            (AttnKind::Hca, Some(cc), _) => (
                cc.entries.buf(),
                EntryKeep::Causal {
                    ratio: self.compressor.as_ref().map_or(1, |c| c.ratio),
                },
            ),
            (AttnKind::Csa, Some(cc), Some(sel)) => (cc.entries.buf(), EntryKeep::Selected(sel)),
            _ => (&empty, EntryKeep::None),
        };
        let o = ops.attention_window(
            q,
            self.heads,
            d,
            base,
            cache.window.buf(),
            cache.window.first(),
            self.window,
            entries,
            keep,
            &self.sinks,
        )?;
        Ok((o, selection))
    }

    /// The row-wise half of [`Self::forward`] after the caches (a batched
    /// forward runs it once over every session's rows): K = V carried the
    /// rotation into the output, undone at the query's position
    /// (`inverse`), then the grouped `wo_a` and `wo_b`.
    pub(super) fn output_rows(
        &self,
        ops: &B,
        mut o: B::Buf,
        rows: usize,
        inverse: &RopeRows<B>,
    ) -> Result<B::Buf> {
        inverse.apply_trailing(ops, &mut o, self.dim, self.rope_dim)?;
        // Group i's columns of `o` through its block of `wo_a`, joined.
        let wo_a: Vec<&B::Matrix> = self.wo_a.iter().map(Linear::matrix).collect();
        self.wo_b
            .forward(ops, &ops.matmul_grouped(&o, rows, &wo_a)?, rows)
    }
}

/// The rows [`Attention::project_rows`] makes for the caches' part: the
/// query heads, the K = V row and the indexer's `[queries, head weights]`
/// (CSA layers).
pub(super) struct AttnRows<B: Backend> {
    pub q: B::Buf,
    pub kv: B::Buf,
    pub index: Option<[B::Buf; 2]>,
}

impl<B: Backend> AttnRows<B> {
    /// Each session's rows, the sessions of `counts` rows one after
    /// another (one launch a buffer on a device: `Backend::split_rows`).
    pub(super) fn split(&self, ops: &B, rows: usize, counts: &[usize]) -> Result<Vec<Self>> {
        let split = |b: &B::Buf| split_rows(ops, b, rows, counts.iter().copied());
        let (qs, kvs) = (split(&self.q)?, split(&self.kv)?);
        let index: Vec<Option<[B::Buf; 2]>> = match &self.index {
            Some([iq, iw]) => split(iq)?
                .into_iter()
                .zip(split(iw)?)
                .map(|(q, w)| Some([q, w]))
                .collect(),
            None => counts.iter().map(|_| None).collect(),
        };
        Ok(qs
            .into_iter()
            .zip(kvs)
            .zip(index)
            .map(|((q, kv), index)| Self { q, kv, index })
            .collect())
    }
}

impl<B: Backend> LightningIndexer<B> {
    /// The row-wise part of the selection: `[q, w]`, the indexer's queries
    /// from the query latent `qr` (rotated at the compressed frequencies,
    /// `compress`) and its head weights from `x`.
    fn project_rows(
        &self,
        ops: &B,
        x: &B::Buf,
        qr: &B::Buf,
        rows: usize,
        compress: &RopeRows<B>,
    ) -> Result<[B::Buf; 2]> {
        let mut q = self.wq_b.forward(ops, qr, rows)?;
        compress.apply_trailing(ops, &mut q, self.dim, self.rope_dim)?;
        let w = self.weights.forward(ops, x, rows)?;
        Ok([q, w])
    }

    /// Compress one session's new tokens into its indexer's entries, then
    /// pick the entries of every new query (tokens `base ..`) from its rows
    /// of [`Self::project_rows`].
    fn select(
        &self,
        ops: &B,
        x: &B::Buf,
        [q, w]: &[B::Buf; 2],
        rows: usize,
        cache: &mut CompressorCache<B>,
        rot: &Rotations<'_, B>,
    ) -> Result<B::Selection> {
        let base = rot.base;
        self.compressor
            .forward(ops, x, rows, cache, &rot.freqs.compress)?;
        let n = cache.entries.rows();
        let scores = ops.index_scores(
            q,
            w,
            cache.entries.buf(),
            rows,
            self.heads,
            self.dim,
            (self.dim as f32).powf(-0.5),
            (self.heads as f32).powf(-0.5),
        )?;
        let m = self.compressor.ratio;
        let limits: Vec<usize> = (0..rows).map(|i| ((base + i + 1) / m).min(n)).collect();
        ops.select_topk(&scores, rows, n, &limits, self.topk)
    }
}

impl<B: Backend> AttnCache<B> {
    /// Tokens covered.
    pub fn len(&self) -> usize {
        self.window.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first window row the next query needs at length `n`.
    fn window_from(&self, n: usize) -> usize {
        n.saturating_sub(self.span - 1)
    }

    pub(super) fn trim(&mut self, ops: &B) -> Result<()> {
        let keep = self.window_from(self.len().saturating_sub(STEP_BACK));
        self.window.trim(ops, keep)
    }

    /// The shortest length every cache of the layer can step back to.
    pub fn floor(&self) -> usize {
        let w = if self.window.first() == 0 {
            0
        } else {
            self.window.first() + self.span - 1
        };
        let c = self.compressor.as_ref().map_or(0, |c| c.floor());
        let i = self.indexer.as_ref().map_or(0, |c| c.floor());
        w.max(c).max(i)
    }

    /// Keep the first `n` tokens (`floor() ≤ n ≤ len()`, checked by the
    /// caller for every layer first).
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        self.window.truncate(ops, n)?;
        if let Some(c) = self.compressor.as_mut() {
            c.truncate(ops, n)?;
        }
        if let Some(c) = self.indexer.as_mut() {
            c.truncate(ops, n)?;
        }
        Ok(())
    }

    pub fn byte_size(&self) -> usize {
        self.window.byte_size()
            + self.compressor.as_ref().map_or(0, |c| c.byte_size())
            + self.indexer.as_ref().map_or(0, |c| c.byte_size())
    }

    /// Canonical tables: the window rows the next query needs, then the
    /// compressors'.
    pub fn export(&self, ops: &B, p: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        out.push(
            self.window
                .export(ops, format!("{p}.window"), self.window_from(self.len()))?,
        );
        if let Some(c) = &self.compressor {
            c.export(ops, &format!("{p}.compressor"), out)?;
        }
        if let Some(c) = &self.indexer {
            c.export(ops, &format!("{p}.indexer"), out)?;
        }
        Ok(())
    }

    /// Read the tables of a state of `n` tokens (this cache is fresh).
    pub fn import(&mut self, ops: &B, r: &mut TableReader, p: &str, n: usize) -> Result<()> {
        let from = self.window_from(n);
        self.window
            .import(ops, r, &format!("{p}.window"), from, n)?;
        if let Some(c) = self.compressor.as_mut() {
            c.import(ops, r, &format!("{p}.compressor"), n)?;
        }
        if let Some(c) = self.indexer.as_mut() {
            c.import(ops, r, &format!("{p}.indexer"), n)?;
        }
        Ok(())
    }
}
