//! RMSNorm: `y = x / sqrt(mean(x²) + eps) * weight`, over the last dimension,
//! computed in f32 (as transformers does before casting back).

use candle_core::{Result, Tensor};

#[derive(Debug, Clone)]
pub struct RmsNorm {
    /// `[dim]`, f32.
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self {
            weight,
            eps: eps as f32,
        }
    }

    /// `x: [.., dim]` → `[.., dim]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // candle's fused kernel reads the input row by row; it needs a
        // contiguous layout.
        candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
    }
}
