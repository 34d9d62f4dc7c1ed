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

use super::gated_deltanet::{ScanDims, replay};
use crate::error::{EngineError, Result};

use crate::model::{ModelState, MtpHistory};
use crate::state::table::{NamedTensor, TableReader};

/// GDN layer state.
#[derive(Debug, Clone, PartialEq)]
pub struct GdnCache {
    /// `[K−1, Cc]`, oldest row first; zeros before the first token.
    pub conv: Vec<f32>,
    /// `[Hv, dk, dv]`.
    pub s: Vec<f32>,
}

/// PLE state of a PLE layer.
#[derive(Debug, Clone, PartialEq)]
pub struct PleCache {
    /// `[(K−1)·N, C·H]`, oldest row first; zeros before the first token.
    pub gvn: Vec<f32>,
    /// `[N−1]`, oldest first; EOS before the first token.
    pub ids: Vec<u32>,
}

/// QSA layer state.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttnCache {
    /// `[P, Hkv·D]`.
    pub k: Vec<f32>,
    /// `[P, Hkv·D]`.
    pub v: Vec<f32>,
    /// `[P, dI]`.
    pub idx_raw: Vec<f32>,
    /// `[⌊P/ratio⌋, dI]`.
    pub blocks: Vec<f32>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LayerCache {
    Linear {
        gdn: GdnCache,
        ple: Option<PleCache>,
    },
    Attn(AttnCache),
}

/// What a GDN layer needs to recompute its state after any prefix of a
/// window: the state before it and the window's scan inputs. Replaying `a`
/// rows through the same scan is bit-identical to having run only those
/// rows, and costs one state copy per window instead of one per row (the
/// real model's `S` is 3 MiB per layer).
#[derive(Debug, Clone, PartialEq)]
pub struct GdnReplay {
    pub before: GdnCache,
    pub dims: ScanDims,
    pub kernel: usize,
    /// Raw `u` rows `[R, Cc]` (conv window replay).
    pub u: Vec<f32>,
    /// Scan inputs of the window rows: `q`, `k` `[R, Hk, dk]`, `v`
    /// `[R, Hv, dv]`, `g`, `beta` `[R, Hv]`.
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub g: Vec<f32>,
    pub beta: Vec<f32>,
}

/// Window record of one linear layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearCapture {
    pub gdn: GdnReplay,
    /// PLE state before the window and after each row (small: `(K−1)·N`
    /// rows of `C·H` plus `N−1` ids).
    pub ple_before: Option<PleCache>,
    pub ple_rows: Vec<PleCache>,
}

/// Record of a multi-token forward ([`super::Qwen4ExpModel::forward_window`])
/// from which [`Qwen4ExpState::commit`] keeps any prefix.
#[derive(Debug, Clone, Default)]
pub struct WindowCapture {
    /// State length before the window.
    pub base: usize,
    pub rows: usize,
    /// One entry per linear layer, in layer order.
    pub layers: Vec<LinearCapture>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Qwen4ExpState {
    pub(crate) layers: Vec<LayerCache>,
    pub(crate) positions: Vec<[u32; 3]>,
    /// Attention cache row width `Hkv·D`, indexer key width `dI`, ratio.
    pub(crate) kv_width: usize,
    pub(crate) idx_dim: usize,
    pub(crate) ratio: usize,
}

impl AttnCache {
    pub fn len(&self, kv_width: usize) -> usize {
        self.k.len() / kv_width
    }

    /// Keep the first `n` tokens (legal: attention is position-addressed).
    pub fn truncate(&mut self, n: usize, kv_width: usize, idx_dim: usize, ratio: usize) {
        self.k.truncate(n * kv_width);
        self.v.truncate(n * kv_width);
        self.idx_raw.truncate(n * idx_dim);
        // A block key depends only on its own complete block.
        self.blocks.truncate((n / ratio) * idx_dim);
    }

    fn bytes(&self) -> usize {
        4 * (self.k.len() + self.v.len() + self.idx_raw.len() + self.blocks.len())
    }

    fn export(&self, p: &str, n: usize, kv: usize, di: usize, out: &mut Vec<NamedTensor>) {
        let nb = self.blocks.len() / di.max(1);
        out.push(NamedTensor::f32(
            format!("{p}.k"),
            vec![n, kv],
            self.k.clone(),
        ));
        out.push(NamedTensor::f32(
            format!("{p}.v"),
            vec![n, kv],
            self.v.clone(),
        ));
        out.push(NamedTensor::f32(
            format!("{p}.idx_raw"),
            vec![n, di],
            self.idx_raw.clone(),
        ));
        out.push(NamedTensor::f32(
            format!("{p}.blocks"),
            vec![nb, di],
            self.blocks.clone(),
        ));
    }

    /// Read `n` positions' caches; lengths follow from `n`, so a table whose
    /// attention caches disagree with its positions is refused.
    fn import(
        r: &mut TableReader,
        p: &str,
        n: usize,
        kv: usize,
        di: usize,
        ratio: usize,
    ) -> Result<Self> {
        Ok(Self {
            k: r.f32(&format!("{p}.k"), n * kv)?,
            v: r.f32(&format!("{p}.v"), n * kv)?,
            idx_raw: r.f32(&format!("{p}.idx_raw"), n * di)?,
            blocks: r.f32(&format!("{p}.blocks"), (n / ratio.max(1)) * di)?,
        })
    }
}

fn export_positions(positions: &[[u32; 3]]) -> NamedTensor {
    let flat = positions.iter().flat_map(|p| p.iter().copied()).collect();
    NamedTensor::u32("positions", vec![positions.len(), 3], flat)
}

fn import_positions(r: &mut TableReader) -> Result<Vec<[u32; 3]>> {
    let n = r.peek_rows("positions")?;
    let flat = r.u32("positions", n.saturating_mul(3))?;
    Ok(flat.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect())
}

impl Qwen4ExpState {
    pub fn layers(&self) -> &[LayerCache] {
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
    pub fn commit(&mut self, capture: &WindowCapture, accepted: usize) -> Result<()> {
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
        let (kv, di, ratio) = (self.kv_width, self.idx_dim, self.ratio);
        let mut rec = capture.layers.iter();
        for layer in &mut self.layers {
            match layer {
                LayerCache::Attn(a) => a.truncate(keep, kv, di, ratio),
                LayerCache::Linear { gdn, ple } => {
                    let r = rec.next().ok_or_else(|| {
                        EngineError::State(
                            "window capture has fewer linear layers than the state".into(),
                        )
                    })?;
                    *gdn = replay(&r.gdn, accepted);
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

impl ModelState for Qwen4ExpState {
    type Window = WindowCapture;

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
        let (kv, di, ratio) = (self.kv_width, self.idx_dim, self.ratio);
        for layer in &mut self.layers {
            if let LayerCache::Attn(a) = layer {
                a.truncate(n, kv, di, ratio);
            }
        }
        self.positions.truncate(n);
        Ok(())
    }

    fn commit(&mut self, window: &WindowCapture, accepted: usize) -> Result<()> {
        Qwen4ExpState::commit(self, window, accepted)
    }

    fn export(&self) -> Result<Vec<NamedTensor>> {
        let n = self.positions.len();
        let (kv, di) = (self.kv_width, self.idx_dim);
        let mut out = vec![export_positions(&self.positions)];
        for (i, layer) in self.layers.iter().enumerate() {
            match layer {
                LayerCache::Attn(a) => a.export(&format!("l{i}"), n, kv, di, &mut out),
                LayerCache::Linear { gdn, ple } => {
                    let c = gdn.conv.len();
                    out.push(NamedTensor::f32(
                        format!("l{i}.conv"),
                        vec![c],
                        gdn.conv.clone(),
                    ));
                    out.push(NamedTensor::f32(
                        format!("l{i}.s"),
                        vec![gdn.s.len()],
                        gdn.s.clone(),
                    ));
                    if let Some(p) = ple {
                        let g = p.gvn.len();
                        out.push(NamedTensor::f32(
                            format!("l{i}.ple_gvn"),
                            vec![g],
                            p.gvn.clone(),
                        ));
                        let d = p.ids.len();
                        out.push(NamedTensor::u32(
                            format!("l{i}.ple_ids"),
                            vec![d],
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
        let mut r = TableReader::new(tensors, "qwen4_exp state");
        let positions = import_positions(&mut r)?;
        let n = positions.len();
        let (kv, di, ratio) = (self.kv_width, self.idx_dim, self.ratio);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            // The fresh layer's fixed sizes are the model's: a table from a
            // differently shaped model fails here.
            *layer = match layer {
                LayerCache::Attn(_) => LayerCache::Attn(AttnCache::import(
                    &mut r,
                    &format!("l{i}"),
                    n,
                    kv,
                    di,
                    ratio,
                )?),
                LayerCache::Linear { gdn, ple } => LayerCache::Linear {
                    gdn: GdnCache {
                        conv: r.f32(&format!("l{i}.conv"), gdn.conv.len())?,
                        s: r.f32(&format!("l{i}.s"), gdn.s.len())?,
                    },
                    ple: match ple {
                        Some(p) => Some(PleCache {
                            gvn: r.f32(&format!("l{i}.ple_gvn"), p.gvn.len())?,
                            ids: r.u32(&format!("l{i}.ple_ids"), p.ids.len())?,
                        }),
                        None => None,
                    },
                },
            };
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
                    4 * (gdn.conv.len() + gdn.s.len())
                        + ple.as_ref().map_or(0, |p| 4 * (p.gvn.len() + p.ids.len()))
                }
            };
        }
        b
    }
}

/// State of the MTP head: its one QSA layer's caches and positions.
#[derive(Debug, Clone, PartialEq)]
pub struct MtpState {
    /// Always [`LayerCache::Attn`]: the head's one QSA layer.
    pub(crate) cache: LayerCache,
    pub(crate) positions: Vec<[u32; 3]>,
    pub(crate) kv_width: usize,
    pub(crate) idx_dim: usize,
    pub(crate) ratio: usize,
}

impl MtpState {
    /// Rows the MTP cache covers.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Drop drafted rows after `n` (attention only, always legal).
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.positions.len() {
            return Err(EngineError::State(format!(
                "cannot truncate an MTP state of {} rows to {n}",
                self.positions.len()
            )));
        }
        if let LayerCache::Attn(a) = &mut self.cache {
            a.truncate(n, self.kv_width, self.idx_dim, self.ratio);
        }
        self.positions.truncate(n);
        Ok(())
    }

    pub fn byte_size(&self) -> usize {
        let cache = match &self.cache {
            LayerCache::Attn(a) => a.bytes(),
            LayerCache::Linear { .. } => 0,
        };
        cache + 12 * self.positions.len()
    }
}

impl MtpState {
    /// The head's QSA layer cache (for tests comparing states).
    pub fn cache(&self) -> &LayerCache {
        &self.cache
    }
}

impl MtpHistory for MtpState {
    fn len(&self) -> usize {
        self.positions.len()
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        MtpState::truncate(self, n)
    }

    fn byte_size(&self) -> usize {
        MtpState::byte_size(self)
    }

    fn export(&self) -> Result<Vec<NamedTensor>> {
        let n = self.positions.len();
        let mut out = vec![export_positions(&self.positions)];
        if let LayerCache::Attn(a) = &self.cache {
            a.export("mtp", n, self.kv_width, self.idx_dim, &mut out);
        }
        Ok(out)
    }

    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        if !self.positions.is_empty() {
            return Err(EngineError::State(
                "qwen4_exp MTP: import needs a fresh history".into(),
            ));
        }
        let mut r = TableReader::new(tensors, "qwen4_exp MTP history");
        let positions = import_positions(&mut r)?;
        let n = positions.len();
        if matches!(self.cache, LayerCache::Attn(_)) {
            self.cache = LayerCache::Attn(AttnCache::import(
                &mut r,
                "mtp",
                n,
                self.kv_width,
                self.idx_dim,
                self.ratio,
            )?);
        }
        r.finish()?;
        self.positions = positions;
        Ok(())
    }
}
