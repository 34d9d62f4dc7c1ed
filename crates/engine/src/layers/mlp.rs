//! SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.

use crate::backend::Backend;
use crate::error::Result;
use crate::layers::linear::Linear;

#[derive(Debug)]
pub struct SwiGlu<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
}

impl<B: Backend> SwiGlu<B> {
    /// `x: [rows, hidden]` → `[rows, hidden]`.
    pub fn forward(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        let g = ops.silu(&self.gate.forward(ops, x, rows)?)?;
        let u = self.up.forward(ops, x, rows)?;
        self.down.forward(ops, &ops.mul(&g, &u)?, rows)
    }
}
