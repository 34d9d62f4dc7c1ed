//! A bias-free linear map `y = x·wᵀ` over any weight format the backend
//! holds (f32, Q4_1, Q8_0, other GGUF blocks), with one contract: every
//! output row depends on its own input row only, with the same bits whether
//! it runs in a decode step, a verify window or any prefill chunk
//! ([`crate::backend::Backend::matmul`] documents the reduction order).

use crate::backend::Backend;
use crate::error::{EngineError, Result};

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
        if ops.len(x) != rows * self.inp {
            return Err(EngineError::State(format!(
                "linear [{}, {}]: input of {} values is not {rows} rows",
                self.out,
                self.inp,
                ops.len(x)
            )));
        }
        ops.matmul(x, rows, &self.w)
    }
}
