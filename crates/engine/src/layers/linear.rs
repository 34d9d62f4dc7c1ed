//! A bias-free linear map `y = x @ w.t()` over either a quantized GGUF weight
//! or a dense f32 weight; both are candle [`QMatMul`]s so that a layer does
//! not care which it holds.
//!
//! Q4_1 and Q8_0 weights on the CPU go to
//! [`crate::backend::cpu::block_matmul`], which keeps activations in f32 and
//! so equals dequantized weights times the activations (up to f32 summation
//! order). Other quantized types use candle's kernels, which round the
//! activations to 8 bits per 32-value block as llama.cpp does — the main
//! source of difference against a dequantized-f32 reference.

use std::sync::Arc;

use candle_core::Module;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Result, Tensor};

use crate::backend::cpu::block_matmul::{BlockFormat, BlockMatrix};

#[derive(Debug, Clone)]
enum Kernel {
    /// candle: dense f32 (`Tensor`) or its quantized types.
    Candle(QMatMul),
    /// Our f32-activation kernel for Q4_1 / Q8_0.
    Block(BlockMatrix),
}

#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    w: Kernel,
    out_dim: usize,
}

impl Linear {
    /// Dense f32 weight `[out, in]`.
    pub fn dense(w: Tensor) -> Result<Self> {
        let out_dim = w.dim(0)?;
        Ok(Self {
            w: Kernel::Candle(QMatMul::Tensor(w.contiguous()?)),
            out_dim,
        })
    }

    /// GGUF weight `[out, in]`. Float storage types are expanded to f32 (the
    /// quantized kernels would round activations for no saving); block
    /// quantized types stay quantized.
    pub fn quantized(w: Arc<QTensor>) -> Result<Self> {
        let (out_dim, in_dim) = w.shape().dims2()?;
        let w = match w.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                Kernel::Candle(QMatMul::Tensor(w.dequantize(&w.device())?))
            }
            dtype @ (GgmlDType::Q4_1 | GgmlDType::Q8_0) if w.device().is_cpu() => {
                let format = if dtype == GgmlDType::Q4_1 {
                    BlockFormat::Q4_1
                } else {
                    BlockFormat::Q8_0
                };
                // The bytes are repacked once; the QTensor is dropped after
                // loading, so memory is not doubled.
                let m = BlockMatrix::new(&w.data()?, format, out_dim, in_dim)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
                Kernel::Block(m)
            }
            _ => Kernel::Candle(QMatMul::QTensor(w)),
        };
        Ok(Self { w, out_dim })
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// `x: [rows, in]` (contiguous) → `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.w {
            Kernel::Candle(w) => w.forward(x),
            Kernel::Block(w) => x.contiguous()?.apply_op1_no_bwd(w),
        }
    }
}
