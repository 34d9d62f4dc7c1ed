//! SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.

use candle_core::{Result, Tensor};

use super::linear::Linear;

#[derive(Debug, Clone)]
pub struct SwiGlu {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl SwiGlu {
    /// `x: [rows, hidden]` → `[rows, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        let u = self.up.forward(x)?;
        self.down.forward(&(g * u)?)
    }
}
