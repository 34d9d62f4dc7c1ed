//! The two RMSNorm conventions of Qwen4-Exp, plus the weight loader helper
//! every component of the family uses.
//!
//! * Zero-centred (`Qwen4ExpTextRMSNorm`): `y = x·rsqrt(mean(x²)+eps)·(1+w)`,
//!   statistics in fp32. The grouped form takes the statistics per
//!   `group`-slice of a `[.., D]` vector (hyper-connection and PLE norms over
//!   `C·H` use `group = H`; the MTP `pre_fc_norm_hidden` uses one group of
//!   `C·H`). The stored `w` is initialised to 0 by HF; we keep `1+w`.
//! * Gated (`RMSNormGated`, GDN output): `y = w·rms(o)·act(z)` with the
//!   *plain* weight (initialised to 1).

use candle_core::{D, Device, Tensor};

use super::config::GateAct;
use crate::error::Result;
use crate::load::safetensors::SafetensorsDir;

/// Bind `{prefix}{name}` with `shape` as an f32 tensor on the CPU.
pub(crate) fn load(
    st: &mut SafetensorsDir,
    prefix: &str,
    name: &str,
    shape: &[usize],
) -> Result<Tensor> {
    st.tensor(&format!("{prefix}{name}"), shape, &Device::Cpu)
}

/// Bind a tensor and copy it to a host vector (small per-channel weights that
/// the host kernels read directly).
pub(crate) fn load_vec(
    st: &mut SafetensorsDir,
    prefix: &str,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>> {
    Ok(load(st, prefix, name, shape)?
        .flatten_all()?
        .to_vec1::<f32>()?)
}

pub(crate) fn to_vec(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// Zero-centred RMSNorm over `[.., dim]` with statistics per `group` slice.
#[derive(Debug, Clone)]
pub struct ZcNorm {
    /// `1 + w`, `[dim]`.
    scale: Tensor,
    /// The same on the host, for kernels that normalise in place.
    scale_host: Vec<f32>,
    dim: usize,
    group: usize,
    eps: f64,
}

impl ZcNorm {
    /// `{prefix}{name}` of shape `[dim]`.
    pub fn load(
        st: &mut SafetensorsDir,
        prefix: &str,
        name: &str,
        dim: usize,
        group: usize,
        eps: f64,
    ) -> Result<Self> {
        let w = load(st, prefix, name, &[dim])?;
        let scale = (w + 1.0)?;
        let scale_host = to_vec(&scale)?;
        Ok(Self {
            scale,
            scale_host,
            dim,
            group,
            eps,
        })
    }

    /// `x: [rows, dim]` → `[rows, dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.elem_count() / self.dim;
        let xs = x.reshape((rows, self.dim / self.group, self.group))?;
        let inv = (xs.sqr()?.mean_keepdim(D::Minus1)? + self.eps)?
            .sqrt()?
            .recip()?;
        Ok(xs
            .broadcast_mul(&inv)?
            .reshape((rows, self.dim))?
            .broadcast_mul(&self.scale)?)
    }

    /// In place on one host vector of `dim` values (single group only:
    /// q/k/indexer norms over one head).
    pub fn apply_host(&self, x: &mut [f32]) {
        debug_assert_eq!(x.len(), self.dim);
        debug_assert_eq!(self.group, self.dim);
        let ms = x.iter().map(|v| v * v).sum::<f32>() / self.dim as f32;
        let inv = 1.0 / (ms + self.eps as f32).sqrt();
        for (v, s) in x.iter_mut().zip(&self.scale_host) {
            *v = *v * inv * s;
        }
    }
}

/// `act(z)` on the host.
pub(crate) fn gate_act(act: GateAct, z: f32) -> f32 {
    match act {
        GateAct::Sigmoid => sigmoid(z),
        GateAct::Silu => z * sigmoid(z),
    }
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub(crate) fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// torch's softplus (threshold 20: linear above it).
pub(crate) fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// Gated RMSNorm (GDN output): rows of `o` and `z` are `[rows, dim]`
/// host-major; returns `w·rms(o)·act(z)` row by row.
pub fn gated_norm(o: &[f32], z: &[f32], w: &[f32], eps: f32, act: GateAct) -> Vec<f32> {
    let dim = w.len();
    let mut out = vec![0f32; o.len()];
    for ((orow, zrow), dst) in o
        .chunks_exact(dim)
        .zip(z.chunks_exact(dim))
        .zip(out.chunks_exact_mut(dim))
    {
        let ms = orow.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for i in 0..dim {
            dst[i] = w[i] * (orow[i] * inv) * gate_act(act, zrow[i]);
        }
    }
    out
}
