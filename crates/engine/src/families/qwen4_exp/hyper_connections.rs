//! Hyper-connections (`Qwen4ExpTextGatedResidual`): the residual is `C`
//! parallel streams `X: [T, C·H]`; each sub-layer reads a learned mixture of
//! them and writes back into every stream with its own weight.
//!
//! ```text
//! n   = N1g(X; hc_norm)                              [T, C·H], stats per H-slice
//! m   = sigmoid( W_up · silu( W_down·n / C ) )       W_down [r, C·H], W_up [C·H, r]
//! x   = mean_s( m_s ⊙ n_s )                          [T, H]  sub-layer input
//! inj = 2·sigmoid( W_inj·n / C )                     [T, C]  (not in the final mixer)
//! X'  = X + concat_s( inj_s · sublayer(x) )          residual on the un-normalised X
//! ```
//!
//! The final `hyper_connection_mixer` has no inject weight; its `x` is the
//! model's final hidden state (there is no separate final norm). Stateless.

use candle_core::Tensor;
use candle_nn::ops::sigmoid;

use super::kernels::Dense;
use super::norms::{ZcNorm, load};
use crate::error::Result;
use crate::load::safetensors::SafetensorsDir;

#[derive(Debug, Clone)]
pub struct GatedResidual {
    norm: ZcNorm,
    down: Dense,
    up: Dense,
    inject: Option<Dense>,
    c: usize,
    h: usize,
}

impl GatedResidual {
    /// `prefix` ends with `.`, e.g. `model.layers.3.attn_hyper_connection.`.
    pub fn load(
        st: &mut SafetensorsDir,
        prefix: &str,
        c: usize,
        h: usize,
        rank: usize,
        eps: f64,
        combine: bool,
    ) -> Result<Self> {
        let ch = c * h;
        Ok(Self {
            norm: ZcNorm::load(st, prefix, "hc_norm.weight", ch, h, eps)?,
            down: Dense::new(load(
                st,
                prefix,
                "input_mix_weight_down.weight",
                &[rank, ch],
            )?)?,
            up: Dense::new(load(st, prefix, "input_mix_weight_up.weight", &[ch, rank])?)?,
            inject: if combine {
                Some(Dense::new(load(
                    st,
                    prefix,
                    "block_inject_weight.weight",
                    &[c, ch],
                )?)?)
            } else {
                None
            },
            c,
            h,
        })
    }

    /// `X: [T, C·H]` → (sub-layer input `[T, H]`, inject weights `[T, C]`
    /// when this is a combining module).
    pub fn mix(&self, xs: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        let t = xs.dim(0)?;
        let c = self.c as f64;
        let n = self.norm.forward(xs)?;
        let m = sigmoid(&self.up.forward(&(self.down.forward(&n)? / c)?.silu()?)?)?;
        let x = (m * &n)?.reshape((t, self.c, self.h))?.mean(1)?;
        let inj = match &self.inject {
            Some(w) => Some((sigmoid(&(w.forward(&n)? / c)?)? * 2.0)?),
            None => None,
        };
        Ok((x, inj))
    }

    /// `X + concat_s(inj_s · y)`: `X [T, C·H]`, `y [T, H]`, `inj [T, C]`.
    pub fn combine(&self, xs: &Tensor, y: &Tensor, inj: &Tensor) -> Result<Tensor> {
        let t = xs.dim(0)?;
        let add = inj
            .unsqueeze(2)?
            .broadcast_mul(&y.unsqueeze(1)?)?
            .reshape((t, self.c * self.h))?;
        Ok((xs + add)?)
    }
}
