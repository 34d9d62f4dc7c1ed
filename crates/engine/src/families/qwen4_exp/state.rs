//! Decode state of a Qwen4-Exp trunk (and of its MTP head), batch 1.
//!
//! | layer | what | layout | growth |
//! |---|---|---|---|
//! | GDN | conv window: last `K−1` raw `u = in_proj_qkv·x` rows | `[K−1, Cc]` | fixed |
//! | GDN | recurrent `S` | `[Hv, dk, dv]` fp32 | fixed |
//! | PLE layer | last `(K_ple−1)·N` normalised gated values `gvn` | `[(K−1)·N, C·H]` | fixed |
//! | PLE layer | last `N−1` token ids (initially EOS) | `[N−1]` | fixed |
//! | QSA | K (after q/k-norm and RoPE), V | `[P, Hkv·D]` each | +1 row/token |
//! | QSA | raw indexer keys (no norm, no RoPE) | `[P, dI]` | +1 row/token |
//! | QSA | block keys: mean → norm → RoPE at block start, final once complete | `[⌊P/ratio⌋, dI]` | +1 row/ratio tokens |
//! | trunk | (t, h, w) position of every token (M-RoPE; equal for text) | `[P, 3]` | +1/token |
//!
//! HF keeps `K` conv columns (only `K−1` are read) and recomputes block keys
//! each step; both are equivalent. Hyper-connections and MoE hold nothing.
//!
//! Recurrent layers cannot truncate: [`ModelState::truncate`] refuses unless
//! nothing would be dropped. Speculative verify instead records a window
//! ([`WindowCapture`]: the recurrent state before it plus the GDN scan inputs
//! and PLE windows of its rows) and commits an accepted prefix by replaying
//! that many rows: one state copy per window, not one per row.
//!
//! Every cache is a backend buffer; export/import go through host tables.

use crate::backend::{Backend, CpuOps};
use crate::error::{EngineError, Result};
use crate::layers::delta_rule::{DeltaCache, DeltaReplay};
use crate::layers::indexer::IndexerCache;
use crate::model::ModelState;
use crate::state::mtp::{HeadCache, MtpCache, import_positions, positions_table};
use crate::state::rows::RowCache;
use crate::state::table::{NamedTensor, TableReader};

/// PLE state of a PLE layer.
#[derive(Debug, Clone)]
pub struct PleCache<B: Backend = CpuOps> {
    /// `[(K−1)·N, C·H]`, oldest row first; zeros before the first token.
    pub gvn: B::Buf,
    /// `[N−1]`, oldest first; EOS before the first token (host: token ids).
    pub ids: Vec<u32>,
}

/// QSA layer state.
#[derive(Debug, Clone)]
pub struct AttnCache<B: Backend = CpuOps> {
    /// `[P, Hkv·D]` each.
    pub k: RowCache<B>,
    pub v: RowCache<B>,
    /// Raw indexer keys `[P, dI]` and block keys `[⌊P/ratio⌋, dI]`.
    pub indexer: IndexerCache<B>,
}

#[derive(Debug, Clone)]
pub enum LayerCache<B: Backend = CpuOps> {
    Linear {
        gdn: DeltaCache<B>,
        ple: Option<PleCache<B>>,
    },
    Attn(AttnCache<B>),
}

/// Window record of one linear layer.
#[derive(Debug, Clone)]
pub struct LinearCapture<B: Backend = CpuOps> {
    pub gdn: DeltaReplay<B>,
    /// PLE state before the window and after each row (small: `(K−1)·N`
    /// rows of `C·H` plus `N−1` ids).
    pub ple_before: Option<PleCache<B>>,
    pub ple_rows: Vec<PleCache<B>>,
}

/// Record of a multi-token forward ([`super::Qwen4ExpModel::forward_window`])
/// from which [`Qwen4ExpState::commit`] keeps any prefix.
#[derive(Debug, Clone)]
pub struct WindowCapture<B: Backend = CpuOps> {
    /// State length before the window.
    pub base: usize,
    pub rows: usize,
    /// One entry per linear layer, in layer order.
    pub layers: Vec<LinearCapture<B>>,
}

#[derive(Debug, Clone)]
pub struct Qwen4ExpState<B: Backend = CpuOps> {
    pub(crate) ops: B,
    pub(crate) layers: Vec<LayerCache<B>>,
    pub(crate) positions: Vec<[u32; 3]>,
}

impl<B: Backend> AttnCache<B> {
    pub fn new(ops: &B, kv_width: usize, indexer: IndexerCache<B>) -> Result<Self> {
        Ok(Self {
            k: RowCache::new(ops, kv_width)?,
            v: RowCache::new(ops, kv_width)?,
            indexer,
        })
    }

    pub fn len(&self) -> usize {
        self.k.rows()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keep the first `n` tokens (legal: attention is position-addressed).
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        self.k.truncate(ops, n)?;
        self.v.truncate(ops, n)?;
        self.indexer.truncate(ops, n)
    }

    fn bytes(&self) -> usize {
        self.k.byte_size() + self.v.byte_size() + self.indexer.byte_size()
    }

    fn export(&self, ops: &B, p: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        out.push(self.k.export(ops, format!("{p}.k"))?);
        out.push(self.v.export(ops, format!("{p}.v"))?);
        out.push(self.indexer.raw.export(ops, format!("{p}.idx_raw"))?);
        out.push(self.indexer.blocks.export(ops, format!("{p}.blocks"))?);
        Ok(())
    }

    /// Read `n` positions' caches; lengths follow from `n`, so a table whose
    /// attention caches disagree with its positions is refused.
    fn import(&mut self, ops: &B, r: &mut TableReader, p: &str, n: usize) -> Result<()> {
        let ratio = self.indexer.ratio;
        self.k.import(ops, r, &format!("{p}.k"), n)?;
        self.v.import(ops, r, &format!("{p}.v"), n)?;
        self.indexer
            .raw
            .import(ops, r, &format!("{p}.idx_raw"), n)?;
        self.indexer
            .blocks
            .import(ops, r, &format!("{p}.blocks"), n / ratio.max(1))
    }
}

impl<B: Backend> Qwen4ExpState<B> {
    /// The position of a text token after everything covered: one past the
    /// largest position on any axis (an image advances the running position
    /// by its longer merged side, not by its placeholder count), which is
    /// the token index when the state holds no image. Derived from the
    /// positions themselves, so truncate, restore, commit and import need
    /// no separate delta.
    pub(crate) fn next_text_position(&self) -> u32 {
        self.positions.iter().flatten().max().map_or(0, |m| m + 1)
    }

    pub fn layers(&self) -> &[LayerCache<B>] {
        &self.layers
    }

    /// Restore from a snapshot taken from the same model.
    pub fn restore(&mut self, snapshot: &Self) {
        self.clone_from(snapshot);
    }

    fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerCache::Linear { .. }))
    }

    /// Keep the first `accepted` rows of the window captured in `capture`
    /// (which must be the last forward on this state): attention caches are
    /// truncated, recurrent layers restored to their state after row
    /// `accepted − 1` (or before the window for `accepted == 0`).
    pub fn commit(&mut self, capture: &WindowCapture<B>, accepted: usize) -> Result<()> {
        let rows = capture.rows;
        if self.positions.len() != capture.base + rows {
            return Err(EngineError::State(format!(
                "window capture covers tokens {}..{} but the state holds {}",
                capture.base,
                capture.base + rows,
                self.positions.len()
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
        let mut rec = capture.layers.iter();
        for layer in &mut self.layers {
            match layer {
                LayerCache::Attn(a) => a.truncate(&ops, keep)?,
                LayerCache::Linear { gdn, ple } => {
                    let r = rec.next().ok_or_else(|| {
                        EngineError::State(
                            "window capture has fewer linear layers than the state".into(),
                        )
                    })?;
                    *gdn = r.gdn.replay(&ops, accepted)?;
                    *ple = if accepted == 0 {
                        r.ple_before.clone()
                    } else {
                        r.ple_rows.get(accepted - 1).cloned()
                    };
                }
            }
        }
        self.positions.truncate(keep);
        Ok(())
    }
}

impl<B: Backend> ModelState for Qwen4ExpState<B> {
    type Window = WindowCapture<B>;

    fn len(&self) -> usize {
        self.positions.len()
    }

    fn truncate_floor(&self) -> usize {
        if self.has_recurrent() {
            self.positions.len()
        } else {
            0
        }
    }

    fn snapshot(&self) -> Self {
        self.clone()
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        let len = self.positions.len();
        if n > len {
            return Err(EngineError::State(format!(
                "cannot truncate {len} tokens to {n}"
            )));
        }
        if n == len {
            return Ok(());
        }
        if self.has_recurrent() {
            return Err(EngineError::State(format!(
                "qwen4_exp: Gated DeltaNet and PLE states are recurrent and cannot be truncated \
                 from {len} to {n} tokens; restore a snapshot or commit a verify window"
            )));
        }
        let ops = self.ops.clone();
        for layer in &mut self.layers {
            if let LayerCache::Attn(a) = layer {
                a.truncate(&ops, n)?;
            }
        }
        self.positions.truncate(n);
        Ok(())
    }

    fn commit(&mut self, window: &WindowCapture<B>, accepted: usize) -> Result<()> {
        Qwen4ExpState::commit(self, window, accepted)
    }

    fn export(&self) -> Result<Vec<NamedTensor>> {
        let ops = &self.ops;
        let mut out = vec![positions_table(&self.positions)];
        for (i, layer) in self.layers.iter().enumerate() {
            match layer {
                LayerCache::Attn(a) => a.export(ops, &format!("l{i}"), &mut out)?,
                LayerCache::Linear { gdn, ple } => {
                    gdn.export(ops, &format!("l{i}"), &mut out)?;
                    if let Some(p) = ple {
                        out.push(NamedTensor::f32(
                            format!("l{i}.ple_gvn"),
                            vec![ops.len(&p.gvn)],
                            ops.download(&p.gvn)?,
                        ));
                        out.push(NamedTensor::u32(
                            format!("l{i}.ple_ids"),
                            vec![p.ids.len()],
                            p.ids.clone(),
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        if !self.positions.is_empty() {
            return Err(EngineError::State(
                "qwen4_exp: import needs a fresh state".into(),
            ));
        }
        let ops = self.ops.clone();
        let mut r = TableReader::new(tensors, "qwen4_exp state");
        let positions = import_positions(&mut r)?;
        let n = positions.len();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            // The fresh layer's fixed sizes are the model's: a table from a
            // differently shaped model fails here.
            match layer {
                LayerCache::Attn(a) => a.import(&ops, &mut r, &format!("l{i}"), n)?,
                LayerCache::Linear { gdn, ple } => {
                    gdn.import(&ops, &mut r, &format!("l{i}"))?;
                    if let Some(p) = ple {
                        let gvn = r.f32(&format!("l{i}.ple_gvn"), ops.len(&p.gvn))?;
                        p.gvn = ops.upload(&gvn)?;
                        p.ids = r.u32(&format!("l{i}.ple_ids"), p.ids.len())?;
                    }
                }
            }
        }
        r.finish()?;
        self.positions = positions;
        Ok(())
    }

    fn byte_size(&self) -> usize {
        let mut b = self.positions.len() * 12;
        for layer in &self.layers {
            b += match layer {
                LayerCache::Attn(a) => a.bytes(),
                LayerCache::Linear { gdn, ple } => {
                    gdn.byte_size(&self.ops)
                        + ple
                            .as_ref()
                            .map_or(0, |p| 4 * (self.ops.len(&p.gvn) + p.ids.len()))
                }
            };
        }
        b
    }
}

/// State of the MTP head: the generic MTP history over its one QSA layer's
/// cache (always [`LayerCache::Attn`]).
pub type MtpState<B = CpuOps> = MtpCache<LayerCache<B>, B>;

/// The MTP head's layer is a QSA layer: its cache truncates and exports as
/// an attention cache.
impl<B: Backend> HeadCache<B> for LayerCache<B> {
    fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        attn_mut(self)?.truncate(ops, n)
    }

    fn byte_size(&self) -> usize {
        match self {
            LayerCache::Attn(a) => a.bytes(),
            LayerCache::Linear { .. } => 0,
        }
    }

    fn export(&self, ops: &B, prefix: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        match self {
            LayerCache::Attn(a) => a.export(ops, prefix, out),
            LayerCache::Linear { .. } => Err(not_attention()),
        }
    }

    fn import(&mut self, ops: &B, r: &mut TableReader, prefix: &str, rows: usize) -> Result<()> {
        attn_mut(self)?.import(ops, r, prefix, rows)
    }
}

fn attn_mut<B: Backend>(c: &mut LayerCache<B>) -> Result<&mut AttnCache<B>> {
    match c {
        LayerCache::Attn(a) => Ok(a),
        LayerCache::Linear { .. } => Err(not_attention()),
    }
}

/// Equal when the exported tables are equal (a download of every cache:
/// for tests and tooling, not for the decode path).
impl<B: Backend> PartialEq for Qwen4ExpState<B> {
    fn eq(&self, other: &Self) -> bool {
        match (self.export(), other.export()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

fn not_attention() -> EngineError {
    EngineError::State("the MTP head's cache is not an attention cache".into())
}
