//! A bias-free linear map `y = x @ w.t()` over either a quantized GGUF weight
//! or a dense f32 weight; both are candle [`QMatMul`]s so that a layer does
//! not care which it holds.
//!
//! For quantized weights the activations are quantized to 8 bits per
//! 32-value block before the integer dot product, as llama.cpp does (candle:
//! Q8_1 / Q8_0 with f16 scales; our Q4_1 kernel: f32 scales); that is the
//! main source of difference against a dequantized-f32 reference.
//!
//! Q4_1 weights on the CPU go to [`crate::backend::cpu::q4_1`] (AVX2),
//! because candle runs Q4_1 with its scalar reference kernel.

use std::sync::Arc;

use candle_core::Module;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Result, Tensor};

use crate::backend::cpu::q4_1::Q41Matrix;

#[derive(Debug, Clone)]
enum Kernel {
    /// candle: dense f32 (`Tensor`) or its quantized types.
    Candle(QMatMul),
    /// Our AVX2 Q4_1 kernel.
    Q41(Q41Matrix),
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
            GgmlDType::Q4_1 if w.device().is_cpu() => {
                // The bytes are copied once; the QTensor is dropped after
                // loading, so memory is not doubled.
                let bytes: Arc<[u8]> = Arc::from(w.data()?.as_ref());
                let m = Q41Matrix::new(bytes, out_dim, in_dim)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
                Kernel::Q41(m)
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
            Kernel::Q41(w) => x.contiguous()?.apply_op1_no_bwd(w),
        }
    }
}
