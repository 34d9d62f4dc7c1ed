//! A bias-free linear map `y = x·wᵀ` over any weight format the backend
//! holds (f32, Q4_1, Q8_0, other GGUF blocks), with one contract: every
//! output row depends on its own input row only, with the same bits whether
//! it runs in a decode step, a verify window or any prefill chunk
//! ([`crate::backend::Backend::matmul`] documents the reduction order).

use crate::backend::{Backend, Epilogue, HostWeight, Unary};
use crate::error::{EngineError, Result};
use crate::load::binder::Binder;

#[derive(Debug)]
pub struct Linear<B: Backend> {
    /// `[out, in]`.
    w: B::Matrix,
    out: usize,
    inp: usize,
}

impl<B: Backend> Linear<B> {
    pub fn new(w: B::Matrix, out: usize, inp: usize) -> Result<Self> {
        Ok(Self { w, out, inp })
    }

    pub fn out_dim(&self) -> usize {
        self.out
    }

    pub fn in_dim(&self) -> usize {
        self.inp
    }

    pub fn matrix(&self) -> &B::Matrix {
        &self.w
    }

    /// `x: [rows, in]` → `[rows, out]`.
    pub fn forward(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        self.check(ops, x, rows)?;
        ops.matmul(x, rows, &self.w)
    }

    /// `x` normalised by its RMS without a weight (`ones`, `in` ones), then
    /// multiplied ([`Backend::rms_matmul`]: the mHC `fn` projection).
    pub fn forward_rms(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        ones: &B::Buf,
        eps: f32,
    ) -> Result<B::Buf> {
        self.check(ops, x, rows)?;
        ops.rms_matmul(x, rows, ones, &self.w, eps)
    }

    /// [`Self::forward`], then `chain` ([`Backend::matmul_unary`]: one
    /// launch on a device for a decode row).
    pub fn forward_unary(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        chain: &[Unary],
    ) -> Result<B::Buf> {
        self.check(ops, x, rows)?;
        ops.matmul_unary(x, rows, &self.w, chain)
    }

    /// `gated_mean_streams(self·x, streams, c, h)` ([`Backend::matmul_gated_mean`]:
    /// one launch on a device for a decode row).
    pub fn forward_gated_mean(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        streams: &B::Buf,
        c: usize,
        h: usize,
    ) -> Result<B::Buf> {
        self.check(ops, x, rows)?;
        ops.matmul_gated_mean(x, rows, &self.w, streams, c, h)
    }

    /// Several layers over the same input, each with its [`Epilogue`]
    /// ([`Backend::matmul_many`]: one launch on a device for a decode row).
    pub fn forward_many<const N: usize>(
        ops: &B,
        x: &B::Buf,
        rows: usize,
        parts: [(&Self, Epilogue<'_>); N],
    ) -> Result<[B::Buf; N]> {
        for (l, then) in &parts {
            l.check(ops, x, rows)?;
            if matches!(then, Epilogue::Swiglu(_)) && l.out % 2 != 0 {
                return Err(EngineError::State(format!(
                    "linear [{}, {}]: a SwiGLU needs an even number of outputs",
                    l.out, l.inp
                )));
            }
        }
        let mats = parts.map(|(l, then)| (&l.w, then));
        ops.matmul_many(x, rows, &mats)?
            .try_into()
            .map_err(|v: Vec<B::Buf>| {
                EngineError::State(format!("matmul_many: {} outputs for {N} parts", v.len()))
            })
    }

    fn check(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<()> {
        if ops.len(x) != rows * self.inp {
            return Err(EngineError::State(format!(
                "linear [{}, {}]: input of {} values is not {rows} rows",
                self.out,
                self.inp,
                ops.len(x)
            )));
        }
        Ok(())
    }
}

/// Binding linear layers: `w.linear("gate_proj", out, in)` reads
/// `gate_proj.weight` under the binder's scope.
pub trait BindLinear<B: Backend> {
    /// A linear layer from `{name}.weight`, `[out, in]`.
    fn linear(&mut self, name: &str, out: usize, inp: usize) -> Result<Linear<B>>;
    /// A linear layer from an already read (or fused) weight `[out, in]`.
    fn linear_from(&self, w: HostWeight, out: usize, inp: usize) -> Result<Linear<B>>;
}

impl<B: Backend> BindLinear<B> for Binder<'_, B> {
    fn linear(&mut self, name: &str, out: usize, inp: usize) -> Result<Linear<B>> {
        Linear::new(self.matrix(name, out, inp)?, out, inp)
    }

    fn linear_from(&self, w: HostWeight, out: usize, inp: usize) -> Result<Linear<B>> {
        Linear::new(self.ops().matrix(w, out, inp)?, out, inp)
    }
}
