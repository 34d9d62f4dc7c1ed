//! The delta rule shared by linear-attention layers (Qwen's Gated DeltaNet
//! with a per-head decay; Kimi delta attention with a per-channel decay
//! joins here): a depthwise causal conv over the raw projections, then the
//! recurrence `S ← S·exp(g); S ← S + k ⊗ β(v − kᵀS); o = qᵀS` per value head,
//! token by token in prefill, decode and verify alike.
//!
//! [`DeltaCache`] is the layer's state (conv window and `S`). A verify
//! window records a [`DeltaReplay`] (the state before the window and the
//! scan inputs of its rows), from which [`DeltaReplay::replay`] rebuilds the
//! state after any prefix of rows bit for bit: one state copy per window,
//! not one per row (the real model's `S` is 3 MiB per layer).

use crate::backend::{Backend, ScanDims, ScanPart};
use crate::error::Result;
use crate::state::table::{NamedTensor, TableReader};

/// A delta-rule layer's state.
#[derive(Debug, Clone)]
pub struct DeltaCache<B: Backend> {
    /// `[K−1, Cc]`, oldest row first; zeros before the first token.
    pub conv: B::Buf,
    /// `[Hv, dk, dv]`.
    pub s: B::Buf,
}

/// The scan inputs of a block of rows: `q`, `k` `[R, Hk, dk]` (normalised),
/// `v` `[R, Hv, dv]`, `beta` `[R, Hv]`, `g` `[R, Hv]` (per head) or `[R, Hv,
/// dk]` (per channel).
#[derive(Debug, Clone)]
pub struct ScanInputs<B: Backend> {
    pub q: B::Buf,
    pub k: B::Buf,
    pub v: B::Buf,
    pub g: B::Buf,
    pub beta: B::Buf,
}

/// What a delta-rule layer needs to recompute its state after any prefix
/// of a verify window.
#[derive(Debug, Clone)]
pub struct DeltaReplay<B: Backend> {
    pub before: DeltaCache<B>,
    pub dims: ScanDims,
    pub kernel: usize,
    pub channels: usize,
    /// Raw conv inputs `[R, Cc]` (the conv window replay).
    pub u: B::Buf,
    pub inputs: ScanInputs<B>,
}

/// Geometry of a delta-rule layer's state.
#[derive(Debug, Clone, Copy)]
pub struct DeltaShape {
    pub dims: ScanDims,
    /// Conv channels `Cc` and taps `K`.
    pub channels: usize,
    pub kernel: usize,
}

impl DeltaShape {
    /// A verify window's replay: the cache `before` it, its rows' raw conv
    /// inputs `u` and scan inputs.
    pub fn replay<B: Backend>(
        &self,
        before: DeltaCache<B>,
        u: B::Buf,
        inputs: ScanInputs<B>,
    ) -> DeltaReplay<B> {
        DeltaReplay {
            before,
            dims: self.dims,
            kernel: self.kernel,
            channels: self.channels,
            u,
            inputs,
        }
    }

    pub fn new_cache<B: Backend>(&self, ops: &B) -> Result<DeltaCache<B>> {
        let d = self.dims;
        Ok(DeltaCache {
            conv: ops.zeros((self.kernel - 1) * self.channels)?,
            s: ops.zeros(d.hv * d.dk * d.dv)?,
        })
    }

    /// Conv (+ SiLU) of the raw projections `u: [rows, Cc]`, advancing the
    /// window.
    pub fn conv<B: Backend>(
        &self,
        ops: &B,
        u: &B::Buf,
        cache: &mut DeltaCache<B>,
        w: &B::Buf,
    ) -> Result<B::Buf> {
        ops.causal_conv_silu(u, &mut cache.conv, w, self.channels, self.kernel, 1)
    }

    /// The recurrence over the rows of `x`, advancing `S`; `o: [rows, Hv,
    /// dv]`.
    pub fn scan<B: Backend>(
        &self,
        ops: &B,
        x: &ScanInputs<B>,
        cache: &mut DeltaCache<B>,
    ) -> Result<B::Buf> {
        ops.delta_rule_scan(self.dims, &x.q, &x.k, &x.v, &x.g, &x.beta, &mut cache.s)
    }

    /// [`DeltaShape::scan`] for several sessions at once (continuous
    /// batching): session `i`'s inputs `xs[i]` over its own state in
    /// `caches[i]`, the outputs one after another (one launch on a device,
    /// [`Backend::delta_rule_scan_parts`]; each session's bits).
    pub fn scan_parts<B: Backend>(
        &self,
        ops: &B,
        xs: &[&ScanInputs<B>],
        caches: &mut [&mut DeltaCache<B>],
    ) -> Result<B::Buf> {
        let mut parts: Vec<ScanPart<'_, B::Buf>> = xs
            .iter()
            .zip(caches.iter_mut())
            .map(|(x, c)| ScanPart {
                q: &x.q,
                k: &x.k,
                v: &x.v,
                g: &x.g,
                beta: &x.beta,
                s: &mut c.s,
            })
            .collect();
        ops.delta_rule_scan_parts(self.dims, &mut parts)
    }
}

impl<B: Backend> DeltaCache<B> {
    pub fn byte_size(&self, ops: &B) -> usize {
        4 * (ops.len(&self.conv) + ops.len(&self.s))
    }

    /// `{p}.conv`, `{p}.s` as flat tables.
    pub fn export(&self, ops: &B, p: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        out.push(NamedTensor::f32(
            format!("{p}.conv"),
            vec![ops.len(&self.conv)],
            ops.download(&self.conv)?,
        ));
        out.push(NamedTensor::f32(
            format!("{p}.s"),
            vec![ops.len(&self.s)],
            ops.download(&self.s)?,
        ));
        Ok(())
    }

    /// Read back what [`DeltaCache::export`] wrote; sizes are this (fresh)
    /// cache's.
    pub fn import(&mut self, ops: &B, r: &mut TableReader, p: &str) -> Result<()> {
        let conv = r.f32(&format!("{p}.conv"), ops.len(&self.conv))?;
        let s = r.f32(&format!("{p}.s"), ops.len(&self.s))?;
        self.conv = ops.upload(&conv)?;
        self.s = ops.upload(&s)?;
        Ok(())
    }
}

impl<B: Backend> DeltaReplay<B> {
    /// The state after the first `rows` rows of the recorded window: the
    /// conv window slides over the recorded `u` rows and the same scan
    /// replays the recorded inputs from the state before the window, so the
    /// result is bit-identical to running only those rows.
    pub fn replay(&self, ops: &B, rows: usize) -> Result<DeltaCache<B>> {
        let d = self.dims;
        let cc = self.channels;
        let hist = self.kernel - 1;
        let mut cache = self.before.clone();
        if rows == 0 {
            return Ok(cache);
        }
        let mut all = self.before.conv.clone();
        ops.append(&mut all, &ops.rows(&self.u, cc, 0, rows)?)?;
        cache.conv = ops.rows(&all, cc, rows, hist)?;
        let x = &self.inputs;
        let (kq, kv) = (d.hk * d.dk, d.hv * d.dv);
        // One decay per head (GDN) or per key channel (KDA): the width
        // follows from the recorded window's row count.
        let window = ops.len(&x.beta) / d.hv.max(1);
        let gw = ops.len(&x.g) / window.max(1);
        let prefix: ScanInputs<B> = ScanInputs {
            q: ops.rows(&x.q, kq, 0, rows)?,
            k: ops.rows(&x.k, kq, 0, rows)?,
            v: ops.rows(&x.v, kv, 0, rows)?,
            g: ops.rows(&x.g, gw, 0, rows)?,
            beta: ops.rows(&x.beta, d.hv, 0, rows)?,
        };
        ops.delta_rule_scan(
            d,
            &prefix.q,
            &prefix.k,
            &prefix.v,
            &prefix.g,
            &prefix.beta,
            &mut cache.s,
        )?;
        Ok(cache)
    }
}
