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
use std::any::Any;

use crate::model::{ModelState, MtpHistory, WindowRecord};

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
    fn len(&self) -> usize {
        self.positions.len()
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

    fn commit(&mut self, window: &WindowRecord, accepted: usize) -> Result<()> {
        let capture = window
            .downcast_ref::<WindowCapture>()
            .ok_or_else(|| EngineError::State("not a qwen4_exp verify-window record".into()))?;
        Qwen4ExpState::commit(self, capture, accepted)
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

    fn boxed_clone(&self) -> Box<dyn MtpHistory> {
        Box::new(self.clone())
    }

    fn byte_size(&self) -> usize {
        MtpState::byte_size(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
