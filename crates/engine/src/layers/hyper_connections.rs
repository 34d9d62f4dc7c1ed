//! Hyper-connections: the residual is `C` parallel streams `X: [T, C·H]`;
//! each sub-layer reads a learned mixture of them ([`HyperConnection::mix`])
//! and writes back into every stream with its own weight
//! ([`HyperConnection::combine`]). A family picks the variant; the
//! decoder-layer code is the same for every variant.
//!
//! [`GatedResidual`] is Qwen's (`Qwen4ExpTextGatedResidual`):
//!
//! ```text
//! n   = N1g(X; hc_norm)                              [T, C·H], stats per H-slice
//! m   = sigmoid( W_up · silu( W_down·n / C ) )       W_down [r, C·H], W_up [C·H, r]
//! x   = mean_s( m_s ⊙ n_s )                          [T, H]  sub-layer input
//! inj = 2·sigmoid( W_inj·n / C )                     [T, C]  (not in the final mixer)
//! X'  = X + concat_s( inj_s · sublayer(x) )          residual on the un-normalised X
//! ```
//!
//! A module without an inject weight (Qwen's final `hyper_connection_mixer`)
//! only mixes: its `x` is the model's final hidden state. Stateless.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::ZcNorm;
use crate::load::binder::Binder;

/// The contract every hyper-connection variant keeps.
pub trait HyperConnection<B: Backend> {
    /// `X: [rows, C·H]` → (sub-layer input `[rows, H]`, per-stream write
    /// weights `[rows, C]` when the module writes back).
    fn mix(&self, ops: &B, xs: &B::Buf, rows: usize) -> Result<(B::Buf, Option<B::Buf>)>;
    /// `X + concat_s(inj_s · y)`: `X [rows, C·H]`, `y [rows, H]`.
    fn combine(&self, ops: &B, xs: &B::Buf, y: &B::Buf, inj: &B::Buf) -> Result<B::Buf>;
}

#[derive(Debug)]
pub struct GatedResidual<B: Backend> {
    norm: ZcNorm<B>,
    down: Linear<B>,
    up: Linear<B>,
    inject: Option<Linear<B>>,
    c: usize,
    h: usize,
}

impl<B: Backend> GatedResidual<B> {
    /// Bound under `w`'s scope (e.g. `model.layers.3.attn_hyper_connection`);
    /// `combine` says whether the module has an inject weight.
    pub fn load(
        w: &mut Binder<'_, B>,
        c: usize,
        h: usize,
        rank: usize,
        eps: f64,
        combine: bool,
    ) -> Result<Self> {
        let ch = c * h;
        Ok(Self {
            norm: ZcNorm::load(w, "hc_norm.weight", ch, h, eps)?,
            down: w.linear("input_mix_weight_down", rank, ch)?,
            up: w.linear("input_mix_weight_up", ch, rank)?,
            inject: if combine {
                Some(w.linear("block_inject_weight", c, ch)?)
            } else {
                None
            },
            c,
            h,
        })
    }
}

impl<B: Backend> HyperConnection<B> for GatedResidual<B> {
    fn mix(&self, ops: &B, xs: &B::Buf, rows: usize) -> Result<(B::Buf, Option<B::Buf>)> {
        // `t / C` as candle computed it: `t·(1/C) + 0`.
        let inv_c = (1.0 / self.c as f64) as f32;
        let n = self.norm.forward(ops, xs)?;
        let d = ops.affine(&self.down.forward(ops, &n, rows)?, inv_c, 0.0)?;
        let m = ops.sigmoid(&self.up.forward(ops, &ops.silu(&d)?, rows)?)?;
        let x = ops.mean_streams(&ops.mul(&m, &n)?, self.c, self.h)?;
        let inj = match &self.inject {
            Some(w) => {
                let s = ops.sigmoid(&ops.affine(&w.forward(ops, &n, rows)?, inv_c, 0.0)?)?;
                Some(ops.affine(&s, 2.0, 0.0)?)
            }
            None => None,
        };
        Ok((x, inj))
    }

    fn combine(&self, ops: &B, xs: &B::Buf, y: &B::Buf, inj: &B::Buf) -> Result<B::Buf> {
        if self.inject.is_none() {
            return Err(EngineError::State(
                "a mixing-only hyper-connection cannot combine".into(),
            ));
        }
        ops.inject_streams(xs, y, inj, self.c)
    }
}
