//! SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`, plain ([`SwiGlu`])
//! or with gate and up fused and an optional clamp ([`FusedSwiGlu`]).

use crate::backend::{Backend, Epilogue, Unary};
use crate::error::Result;
use crate::layers::linear::{BindLinear, Linear};
use crate::load::binder::Binder;

#[derive(Debug)]
pub struct SwiGlu<B: Backend> {
    pub gate: Linear<B>,
    pub up: Linear<B>,
    pub down: Linear<B>,
}

impl<B: Backend> SwiGlu<B> {
    /// `x: [rows, hidden]` → `[rows, hidden]`.
    pub fn forward(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        // Gate (with its SiLU) and up as one call: the ops of
        // `silu(gate·x)` then `up·x` in that order where a backend runs
        // them part by part (the CPU), one launch for a decode row or a
        // verify window on a device; the bits are the parts' either way.
        let [g, u] = Linear::forward_many(
            ops,
            x,
            rows,
            [
                (&self.gate, Epilogue::Chain(&[Unary::Silu])),
                (&self.up, Epilogue::Chain(&[])),
            ],
        )?;
        self.down.forward(ops, &ops.mul(&g, &u)?, rows)
    }
}

/// SwiGLU with gate and up fused into one matmul and an optional clamp
/// (`swiglu_limit`: `silu(min(g, L))·clamp(u, ±L)`, DeepSeek-V4 and GLM-5):
/// `down(act(g, u))`, `[g | u] = gate_up·x`.
#[derive(Debug)]
pub struct FusedSwiGlu<B: Backend> {
    /// `[2I, H]`, rows `[gate | up]`.
    gate_up: Linear<B>,
    down: Linear<B>,
    inter: usize,
    limit: Option<f32>,
}

impl<B: Backend> FusedSwiGlu<B> {
    /// From `{gate}.weight`, `{up}.weight` `[I, H]` and `{down}.weight`
    /// `[H, I]` under `w`'s scope (e.g. `gate_proj`, `up_proj`, `down_proj`).
    pub fn load(
        w: &mut Binder<'_, B>,
        names: [&str; 3],
        h: usize,
        inter: usize,
        limit: Option<f32>,
    ) -> Result<Self> {
        let [gate, up, down] = names;
        let (g, u) = (format!("{gate}.weight"), format!("{up}.weight"));
        let fused = w.fused_rows(&[g.as_str(), u.as_str()], &[inter, inter], h)?;
        Ok(Self {
            gate_up: w.linear_from(fused, 2 * inter, h)?,
            down: w.linear(down, h, inter)?,
            inter,
            limit,
        })
    }

    /// `x: [rows, H]` → `[rows, H]`.
    pub fn forward(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        let gu = self.gate_up.forward(ops, x, rows)?;
        let act = ops.swiglu(&gu, self.inter, self.limit)?;
        self.down.forward(ops, &act, rows)
    }
}
