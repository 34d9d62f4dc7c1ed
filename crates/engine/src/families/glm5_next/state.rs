//! Decode state of a GLM-5 trunk (and of its NextN head), batch 1.
//!
//! | layer | what | layout | growth |
//! |---|---|---|---|
//! | KDA | conv window: last `K−1` raw `[q|k|v]` projections | `[K−1, 3C]` | fixed |
//! | KDA | recurrent `S` | `[H, d, d]` fp32 | fixed |
//! | MLA | normalised latent `c` | `[P, kv_lora]` | +1 row/token |
//! | MLA, full indexer | indexer keys (LayerNorm'd) and raw pool gates | `[P, di]` each | +1 row/token |
//! | MLA, full indexer | pool keys, final once the pool completes | `[⌊P/pool⌋, di]` | +1 row/pool |
//!
//! transformers keeps `K` conv columns (only `K−1` are read), `[k | gate |
//! valid]` rows and recomputes every pool each step; the contents here are
//! the same values. Shared-indexer layers keep only their latent. NoPE: no
//! positions are stored, only the length. mHC and the FFNs hold nothing.
//!
//! KDA layers are recurrent: [`ModelState::truncate`] refuses to drop
//! tokens when any exists (the truncation floor is the length). A verify
//! window records, per KDA layer, the state before it and the scan inputs
//! of its rows ([`WindowCapture`]); [`Glm5NextState::commit`] truncates the
//! MLA caches and replays the accepted rows.

use super::config::{Glm5NextConfig, IndexerKind, LayerKind};
use crate::backend::{Backend, CpuOps};
use crate::error::{EngineError, Result};
use crate::layers::delta_rule::{DeltaCache, DeltaReplay};
use crate::layers::pooled_indexer::PooledIndexerCache;
use crate::model::ModelState;
use crate::state::mtp::{HeadCache, MtpCache};
use crate::state::rows::RowCache;
use crate::table::{NamedTensor, TableReader};

/// An MLA layer's state.
#[derive(Debug, Clone)]
pub struct MlaCache<B: Backend = CpuOps> {
    /// `[P, kv_lora]`.
    pub latent: RowCache<B>,
    /// `None` on shared-indexer layers.
    pub indexer: Option<PooledIndexerCache<B>>,
}

#[derive(Debug, Clone)]
pub enum LayerCache<B: Backend = CpuOps> {
    Kda(DeltaCache<B>),
    Mla(MlaCache<B>),
}

/// Record of a verify window ([`super::Glm5NextModel::forward_window`]) from
/// which [`Glm5NextState::commit`] keeps any prefix.
#[derive(Debug, Clone)]
pub struct WindowCapture<B: Backend = CpuOps> {
    /// State length before the window.
    pub base: usize,
    pub rows: usize,
    /// One replay per KDA layer, in layer order.
    pub kda: Vec<DeltaReplay<B>>,
}

#[derive(Debug, Clone)]
pub struct Glm5NextState<B: Backend = CpuOps> {
    pub(crate) ops: B,
    pub(crate) layers: Vec<LayerCache<B>>,
    pub(crate) len: usize,
}

impl<B: Backend> MlaCache<B> {
    pub fn new(ops: &B, latent: usize, indexer: Option<PooledIndexerCache<B>>) -> Result<Self> {
        Ok(Self {
            latent: RowCache::new(ops, latent)?,
            indexer,
        })
    }

    /// Keep the first `n` tokens (attention is position-addressed).
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        self.latent.truncate(ops, n)?;
        match &mut self.indexer {
            Some(i) => i.truncate(ops, n),
            None => Ok(()),
        }
    }

    fn bytes(&self) -> usize {
        self.latent.byte_size() + self.indexer.as_ref().map_or(0, |i| i.byte_size())
    }

    fn export_to(&self, ops: &B, p: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        out.push(self.latent.export(ops, format!("{p}.latent"))?);
        if let Some(i) = &self.indexer {
            i.export(ops, p, out)?;
        }
        Ok(())
    }

    /// Read `n` tokens' caches (lengths follow from `n`).
    fn import_from(&mut self, ops: &B, r: &mut TableReader, p: &str, n: usize) -> Result<()> {
        self.latent.import(ops, r, &format!("{p}.latent"), n)?;
        if let Some(i) = &mut self.indexer {
            i.import(ops, r, p, n)?;
        }
        Ok(())
    }
}

impl<B: Backend> Glm5NextState<B> {
    pub fn layers(&self) -> &[LayerCache<B>] {
        &self.layers
    }

    fn has_recurrent(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerCache::Kda(_)))
    }

    /// Keep the first `accepted` rows of the window recorded in `capture`
    /// (which must be the last forward on this state).
    pub fn commit(&mut self, capture: &WindowCapture<B>, accepted: usize) -> Result<()> {
        let rows = capture.rows;
        if self.len != capture.base + rows {
            return Err(EngineError::State(format!(
                "window capture covers tokens {}..{} but the state holds {}",
                capture.base,
                capture.base + rows,
                self.len
            )));
        }
        if accepted > rows {
            return Err(EngineError::State(format!(
                "cannot accept {accepted} rows of a {rows}-row window"
            )));
        }
        if accepted == rows {
            return Ok(());
        }
        let keep = capture.base + accepted;
        let ops = self.ops.clone();
        let mut rec = capture.kda.iter();
        for layer in &mut self.layers {
            match layer {
                LayerCache::Mla(m) => m.truncate(&ops, keep)?,
                LayerCache::Kda(k) => {
                    let r = rec.next().ok_or_else(|| {
                        EngineError::State(
                            "window capture has fewer KDA layers than the state".into(),
                        )
                    })?;
                    *k = r.replay(&ops, accepted)?;
                }
            }
        }
        self.len = keep;
        Ok(())
    }
}

impl<B: Backend> ModelState for Glm5NextState<B> {
    type Window = WindowCapture<B>;

    fn len(&self) -> usize {
        self.len
    }

    fn truncate_floor(&self) -> usize {
        if self.has_recurrent() { self.len } else { 0 }
    }

    fn snapshot(&self) -> Self {
        self.clone()
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::State(format!(
                "cannot truncate {} tokens to {n}",
                self.len
            )));
        }
        if n == self.len {
            return Ok(());
        }
        if self.has_recurrent() {
            return Err(EngineError::State(format!(
                "glm5_next: KDA states are recurrent and cannot be truncated from {} to {n} \
                 tokens; restore a snapshot or commit a verify window",
                self.len
            )));
        }
        let ops = self.ops.clone();
        for layer in &mut self.layers {
            if let LayerCache::Mla(m) = layer {
                m.truncate(&ops, n)?;
            }
        }
        self.len = n;
        Ok(())
    }

    fn commit(&mut self, window: &WindowCapture<B>, accepted: usize) -> Result<()> {
        Glm5NextState::commit(self, window, accepted)
    }

    fn export(&self) -> Result<Vec<NamedTensor>> {
        let ops = &self.ops;
        let mut out = vec![length_table(self.len)];
        for (i, layer) in self.layers.iter().enumerate() {
            match layer {
                LayerCache::Mla(m) => m.export_to(ops, &format!("l{i}"), &mut out)?,
                LayerCache::Kda(k) => k.export(ops, &format!("l{i}"), &mut out)?,
            }
        }
        Ok(out)
    }

    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        if self.len != 0 {
            return Err(EngineError::State(
                "glm5_next: import needs a fresh state".into(),
            ));
        }
        let ops = self.ops.clone();
        let mut r = TableReader::new(tensors, "glm5_next state");
        let n = import_length(&mut r)?;
        for (i, layer) in self.layers.iter_mut().enumerate() {
            // The fresh layer's fixed sizes are the model's: a table from a
            // differently shaped model fails here.
            match layer {
                LayerCache::Mla(m) => m.import_from(&ops, &mut r, &format!("l{i}"), n)?,
                LayerCache::Kda(k) => k.import(&ops, &mut r, &format!("l{i}"))?,
            }
        }
        r.finish()?;
        self.len = n;
        Ok(())
    }

    fn byte_size(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Mla(m) => m.bytes(),
                LayerCache::Kda(k) => k.byte_size(&self.ops),
            })
            .sum()
    }
}

/// Bytes a trunk state holds after `tokens` tokens (what
/// [`ModelState::byte_size`] reports), from the configuration alone: KDA
/// layers are fixed, MLA layers grow per token and per complete pool.
pub fn state_bytes(cfg: &Glm5NextConfig, tokens: usize) -> usize {
    let c = cfg.linear_num_heads * cfg.linear_head_dim;
    let kda =
        (cfg.linear_conv_kernel - 1) * 3 * c + cfg.linear_num_heads * cfg.linear_head_dim.pow(2);
    let floats: usize = (0..cfg.num_layers)
        .map(|l| match (cfg.layer_kinds[l], cfg.indexer_kinds[l]) {
            (LayerKind::Kda, _) => kda,
            (LayerKind::Mla, IndexerKind::Shared) => tokens * cfg.kv_lora_rank,
            (LayerKind::Mla, IndexerKind::Full) => {
                let di = cfg.index_head_dim;
                tokens * (cfg.kv_lora_rank + 2 * di) + tokens / cfg.index_pool * di
            }
        })
        .sum();
    4 * floats
}

fn length_table(n: usize) -> NamedTensor {
    NamedTensor::u32("length", vec![1], vec![n as u32])
}

fn import_length(r: &mut TableReader) -> Result<usize> {
    Ok(r.u32("length", 1)?[0] as usize)
}

/// State of the NextN head: the generic MTP history over its MLA layer's
/// cache.
pub type MtpState<B = CpuOps> = MtpCache<MlaCache<B>, B>;

impl<B: Backend> HeadCache<B> for MlaCache<B> {
    fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        MlaCache::truncate(self, ops, n)
    }

    fn byte_size(&self) -> usize {
        self.bytes()
    }

    fn export(&self, ops: &B, prefix: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        self.export_to(ops, prefix, out)
    }

    fn import(&mut self, ops: &B, r: &mut TableReader, prefix: &str, rows: usize) -> Result<()> {
        self.import_from(ops, r, prefix, rows)
    }
}

/// Equal when the exported tables are equal (a download of every cache:
/// for tests and tooling, not for the decode path).
impl<B: Backend> PartialEq for Glm5NextState<B> {
    fn eq(&self, other: &Self) -> bool {
        match (self.export(), other.export()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}
