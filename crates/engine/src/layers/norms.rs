//! RMS norms: the llama convention ([`RmsNorm`]: `x / rms · w`) and the
//! zero-centred one of Qwen-style models ([`ZcNorm`]: `x · 1/rms · (1 + w)`,
//! statistics per group, the stored `w` initialised to 0).

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::load::binder::Binder;

/// `x / sqrt(mean(x²) + eps) · w` per row.
#[derive(Debug)]
pub struct RmsNorm<B: Backend> {
    w: B::Buf,
    width: usize,
    eps: f32,
}

impl<B: Backend> RmsNorm<B> {
    pub fn load(w: &mut Binder<'_, B>, name: &str, width: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            w: w.vector(name, &[width])?,
            width,
            eps: eps as f32,
        })
    }

    /// `x: [rows, width]` → `[rows, width]`.
    pub fn forward(&self, ops: &B, x: &B::Buf) -> Result<B::Buf> {
        ops.rms_norm(x, self.width, &self.w, self.eps)
    }
}

/// Zero-centred RMSNorm over rows of `dim` with statistics per `group`
/// slice (hyper-connection and PLE norms over `C·H` use `group = H`; one
/// head's q/k norm uses `group = dim`).
#[derive(Debug)]
pub struct ZcNorm<B: Backend> {
    /// `1 + w`, `[dim]`.
    scale: B::Buf,
    dim: usize,
    group: usize,
    eps: f64,
}

impl<B: Backend> ZcNorm<B> {
    /// `name` of shape `[dim]`.
    pub fn load(
        w: &mut Binder<'_, B>,
        name: &str,
        dim: usize,
        group: usize,
        eps: f64,
    ) -> Result<Self> {
        let host = w.tensor(name, &[dim])?;
        // candle's affine (`w·1 + 1`), as the scale was always formed.
        let scale: Vec<f32> = (host + 1.0)?.to_vec1::<f32>()?;
        Ok(Self {
            scale: w.ops().upload(&scale)?,
            dim,
            group,
            eps,
        })
    }

    /// `x: [rows, dim]` → `[rows, dim]` (grouped statistics).
    pub fn forward(&self, ops: &B, x: &B::Buf) -> Result<B::Buf> {
        ops.rms_norm_grouped(x, self.dim, self.group, &self.scale, self.eps)
    }

    /// `inject_streams(xs, y, inj, c)`, then [`ZcNorm::forward`] of it
    /// (`dim = c·group`): `[X', n]` ([`Backend::inject_streams_norm`]).
    pub fn after_inject(
        &self,
        ops: &B,
        xs: &B::Buf,
        y: &B::Buf,
        inj: &B::Buf,
        c: usize,
    ) -> Result<[B::Buf; 2]> {
        if c * self.group != self.dim {
            return Err(EngineError::State(format!(
                "a norm of {} values in groups of {} cannot follow an inject into {c} streams",
                self.dim, self.group
            )));
        }
        ops.inject_streams_norm(xs, y, inj, c, &self.scale, self.eps)
    }

    /// In place on every `dim`-slice of `x` (one group per slice: q/k and
    /// indexer norms over heads).
    pub fn apply_heads(&self, ops: &B, x: &mut B::Buf) -> Result<()> {
        debug_assert_eq!(self.group, self.dim);
        ops.rms_norm_heads(x, self.dim, &self.scale, self.eps as f32)
    }
}
