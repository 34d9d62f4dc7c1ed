//! A bias-free linear map `y = x @ w.t()` over either a quantized GGUF weight
//! or a dense f32 weight; both are candle [`QMatMul`]s so that a layer does
//! not care which it holds.
//!
//! For quantized weights candle quantizes the activations to the weight's
//! dot-product partner type (Q8_1 for Q4_1, Q8_0 for Q8_0) exactly as
//! llama.cpp does; that is the main source of difference against a
//! dequantized-f32 reference.

use std::sync::Arc;

use candle_core::Module;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Result, Tensor};

#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    w: QMatMul,
    out_dim: usize,
}

impl Linear {
    /// Dense f32 weight `[out, in]`.
    pub fn dense(w: Tensor) -> Result<Self> {
        let out_dim = w.dim(0)?;
        Ok(Self {
            w: QMatMul::Tensor(w.contiguous()?),
            out_dim,
        })
    }

    /// GGUF weight `[out, in]`. Float storage types are expanded to f32 (the
    /// quantized kernels would round activations for no saving); block
    /// quantized types stay quantized.
    pub fn quantized(w: Arc<QTensor>) -> Result<Self> {
        let out_dim = w.shape().dims()[0];
        let w = match w.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                QMatMul::Tensor(w.dequantize(&w.device())?)
            }
            _ => QMatMul::QTensor(w),
        };
        Ok(Self { w, out_dim })
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// `x: [rows, in]` (contiguous) → `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.w.forward(x)
    }
}
