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
//!
//! [`Mhc`] is the mHC block DeepSeek-V4 and GLM-5 share: `f =
//! rms(flatten X)` (no weight), `z = fn·f`, pre/post weights and a
//! Sinkhorn-normalised stream mixing matrix from `z`
//! ([`crate::backend::Backend::hc_sinkhorn`]); the block reads `Σ pre·X`
//! and writes `X'[k] = post[k]·y + Σ_j C[j,k]·X[j]`.

use crate::backend::{Backend, Epilogue, Unary};
use crate::error::{EngineError, Result};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::ZcNorm;
use crate::load::binder::Binder;

/// `(X', x, inj)`: streams with a write-back applied, the next sub-layer's
/// input mixed from them, and its write weights (when it writes back).
pub type Mixed<B> = (
    <B as Backend>::Buf,
    <B as Backend>::Buf,
    Option<<B as Backend>::Buf>,
);

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

impl<B: Backend> GatedResidual<B> {
    /// [`HyperConnection::mix`] after its norm: `n = N1g(X)` → (`x`, `inj`).
    pub fn mix_normed(&self, ops: &B, n: &B::Buf, rows: usize) -> Result<(B::Buf, Option<B::Buf>)> {
        // `t / C` as candle computed it: `t·(1/C) + 0`.
        let inv_c = (1.0 / self.c as f64) as f32;
        // The gates as unary chains on their projections: the bits of the
        // ops one by one, applied as the product is stored on a device; the
        // two projections of `n` as one call (one launch for a decode row).
        let down = [Unary::Affine(inv_c, 0.0), Unary::Silu];
        let (d, inj) = match &self.inject {
            Some(w) => {
                let inject = [
                    Unary::Affine(inv_c, 0.0),
                    Unary::Sigmoid,
                    Unary::Affine(2.0, 0.0),
                ];
                let [d, inj] = Linear::forward_many(
                    ops,
                    n,
                    rows,
                    [
                        (&self.down, Epilogue::Chain(&down)),
                        (w, Epilogue::Chain(&inject)),
                    ],
                )?;
                (d, Some(inj))
            }
            None => (self.down.forward_unary(ops, n, rows, &down)?, None),
        };
        let x = self
            .up
            .forward_gated_mean(ops, &d, rows, n, self.c, self.h)?;
        Ok((x, inj))
    }

    /// `self.combine(xs, y, inj)`, then `next.mix` of the result, the
    /// inject and `next`'s norm as one op ([`Backend::inject_streams_norm`]:
    /// one launch for a decode step, the bits of the two).
    pub fn combine_mix(
        &self,
        ops: &B,
        xs: &B::Buf,
        y: &B::Buf,
        inj: &B::Buf,
        next: &Self,
        rows: usize,
    ) -> Result<Mixed<B>> {
        let [xs, n] = self.combine_norm(ops, xs, y, inj, next)?;
        let (x, inj) = next.mix_normed(ops, &n, rows)?;
        Ok((xs, x, inj))
    }

    /// `[X', n]`: `self.combine(xs, y, inj)` and `next`'s norm of it.
    fn combine_norm(
        &self,
        ops: &B,
        xs: &B::Buf,
        y: &B::Buf,
        inj: &B::Buf,
        next: &Self,
    ) -> Result<[B::Buf; 2]> {
        self.check_combines()?;
        self.check_seam(next)?;
        next.norm.after_inject(ops, xs, y, inj, self.c)
    }

    fn check_seam(&self, next: &Self) -> Result<()> {
        if next.c != self.c || next.h != self.h {
            return Err(EngineError::State(format!(
                "hyper-connections of {}×{} and {}×{} streams cannot share a seam",
                self.c, self.h, next.c, next.h
            )));
        }
        Ok(())
    }

    fn check_combines(&self) -> Result<()> {
        if self.inject.is_none() {
            return Err(EngineError::State(
                "a mixing-only hyper-connection cannot combine".into(),
            ));
        }
        Ok(())
    }
}

impl<B: Backend> HyperConnection<B> for GatedResidual<B> {
    fn mix(&self, ops: &B, xs: &B::Buf, rows: usize) -> Result<(B::Buf, Option<B::Buf>)> {
        self.mix_normed(ops, &self.norm.forward(ops, xs)?, rows)
    }

    fn combine(&self, ops: &B, xs: &B::Buf, y: &B::Buf, inj: &B::Buf) -> Result<B::Buf> {
        self.check_combines()?;
        ops.inject_streams(xs, y, inj, self.c)
    }
}

/// Gated-residual streams between sub-layers, with the last sub-layer's
/// write-back possibly not yet applied (`X' = hc.combine(xs, y, inj)`), so
/// that the next module's norm takes it in the same op
/// ([`Backend::inject_streams_norm`]: one launch for a decode step, the
/// bits of the inject and the norm). A layer hands its MoE half's
/// write-back to the next layer this way.
#[derive(Debug)]
pub struct Streams<'m, B: Backend> {
    xs: B::Buf,
    pending: Option<(&'m GatedResidual<B>, B::Buf, B::Buf)>,
}

impl<'m, B: Backend> Streams<'m, B> {
    pub fn ready(xs: B::Buf) -> Self {
        Self { xs, pending: None }
    }

    /// `hc.combine(xs, y, inj)`, not yet applied.
    pub fn pending(hc: &'m GatedResidual<B>, xs: B::Buf, y: B::Buf, inj: B::Buf) -> Self {
        Self {
            xs,
            pending: Some((hc, y, inj)),
        }
    }

    /// `X'`, the write-back applied.
    pub fn into_buf(self, ops: &B) -> Result<B::Buf> {
        match self.pending {
            None => Ok(self.xs),
            Some((hc, y, inj)) => hc.combine(ops, &self.xs, &y, &inj),
        }
    }

    /// `(X', x, inj)`: `next`'s mix of `X'`.
    pub fn mix(self, ops: &B, next: &GatedResidual<B>, rows: usize) -> Result<Mixed<B>> {
        match self.pending {
            None => {
                let (x, inj) = next.mix(ops, &self.xs, rows)?;
                Ok((self.xs, x, inj))
            }
            Some((hc, y, inj)) => hc.combine_mix(ops, &self.xs, &y, &inj, next, rows),
        }
    }

    /// `[X', n]`: `next`'s norm of `X'`, for a caller that mixes only some
    /// rows of it ([`GatedResidual::mix_normed`]; the norm is per slice, so
    /// a row's bits do not depend on the others).
    pub fn normed(self, ops: &B, next: &GatedResidual<B>) -> Result<[B::Buf; 2]> {
        match self.pending {
            None => {
                let n = next.norm.forward(ops, &self.xs)?;
                Ok([self.xs, n])
            }
            Some((hc, y, inj)) => hc.combine_norm(ops, &self.xs, &y, &inj, next),
        }
    }
}

/// The mHC hyper-connection (DeepSeek-V4, GLM-5).
#[derive(Debug)]
pub struct Mhc<B: Backend> {
    /// `fn`: `[(2+N)·N, N·D]`.
    proj: Linear<B>,
    /// `[(2+N)·N]` and `[3]`.
    base: B::Buf,
    scale: B::Buf,
    /// Ones `[N·D]`: the normalisation has no weight.
    ones: B::Buf,
    n: usize,
    iters: usize,
    hc_eps: f32,
    rms_eps: f32,
}

impl<B: Backend> Mhc<B> {
    /// From bound parts (each family names them its own way).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ops: &B,
        proj: Linear<B>,
        base: B::Buf,
        scale: B::Buf,
        n: usize,
        d: usize,
        iters: usize,
        hc_eps: f32,
        rms_eps: f32,
    ) -> Result<Self> {
        if proj.out_dim() != (2 + n) * n || proj.in_dim() != n * d {
            return Err(EngineError::State(format!(
                "mHC projection [{}, {}] for {n} streams of {d}",
                proj.out_dim(),
                proj.in_dim()
            )));
        }
        Ok(Self {
            proj,
            base,
            scale,
            ones: ops.upload(&vec![1.0; n * d])?,
            n,
            iters,
            hc_eps,
            rms_eps,
        })
    }
}

impl<B: Backend> HyperConnection<B> for Mhc<B> {
    fn mix(&self, ops: &B, xs: &B::Buf, rows: usize) -> Result<(B::Buf, Option<B::Buf>)> {
        let z = self
            .proj
            .forward_rms(ops, xs, rows, &self.ones, self.rms_eps)?;
        let mix = ops.hc_sinkhorn(&z, &self.base, &self.scale, self.n, self.iters, self.hc_eps)?;
        Ok((ops.hc_pre(xs, &mix, self.n)?, Some(mix)))
    }

    fn combine(&self, ops: &B, xs: &B::Buf, y: &B::Buf, mix: &B::Buf) -> Result<B::Buf> {
        ops.hc_post(xs, y, mix, self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{CpuOps, HostWeight};
    use crate::layers::linear::Linear;

    /// The mHC block through the trait: mixing then combining with an
    /// identity sub-layer keeps `N` streams of `D` and the block input is
    /// a positive mix of the streams.
    #[test]
    fn mhc_mixes_and_combines_through_the_trait() {
        let ops = CpuOps;
        let (n, d, rows) = (4, 3, 2);
        let w: Vec<f32> = (0..(2 + n) * n * n * d)
            .map(|i| ((i as f32) * 0.37).sin() * 0.2)
            .collect();
        let t = candle_core::Tensor::from_vec(w, ((2 + n) * n, n * d), &candle_core::Device::Cpu)
            .unwrap();
        let proj = Linear::new(
            ops.matrix(HostWeight::F32(t), (2 + n) * n, n * d).unwrap(),
            (2 + n) * n,
            n * d,
        )
        .unwrap();
        let base = vec![0.1; (2 + n) * n];
        let hc = Mhc::new(&ops, proj, base, vec![1.0, 1.0, 1.0], n, d, 20, 1e-6, 1e-6).unwrap();
        let xs: Vec<f32> = (0..rows * n * d).map(|i| 1.0 + (i % 5) as f32).collect();
        let (x, mix) = hc.mix(&ops, &xs, rows).unwrap();
        let mix = mix.unwrap();
        assert_eq!(x.len(), rows * d);
        assert!(x.iter().all(|v| *v > 0.0));
        let out = hc.combine(&ops, &xs, &x, &mix).unwrap();
        assert_eq!(out.len(), xs.len());
        assert_ne!(out, xs);
    }
}
