//! The CPU backend: the reference implementation of the op inventory.
//!
//! Buffers are host `Vec<f32>`. Kernels: [`f32_matmul`] (row-independent f32
//! matmul, tiled AVX2), [`block_matmul`] (Q4_1 / Q8_0 weights times f32
//! activations; AVX2 or AVX-512 chosen at run time), [`q8_matmul`] (the
//! fast kernel set's Q4_1 / Q8_0 product over int8 activations),
//! [`experts`] (routed
//! experts), [`attention`] (causal, per query in a fixed order),
//! [`sparse_attention`] (over a selection), [`indexer`] (QSA blocks),
//! [`delta_rule`] (conv + scan). Where the reference arithmetic is candle's
//! (the grouped RMSNorm, the llama RMSNorm), the op runs candle's own kernel
//! on a view of the buffer, so bits match what the families computed when
//! they called candle directly.

pub mod attention;
pub mod block_matmul;
pub mod compression;
pub mod delta_rule;
pub mod experts;
pub mod f32_matmul;
pub mod hyper;
pub mod indexer;
pub mod kda_gate;
pub mod kq8_matmul;
pub mod layer_norm;
mod ops;
pub mod pool_expand;
pub mod q8_matmul;
pub mod routing;
pub mod sparse_attention;
pub mod window_attention;

pub use ops::{CpuMatrix, CpuOps, CpuRouting, CpuTable};

/// A raw output pointer shared by pool workers that write disjoint elements.
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: every user splits the output so that no two workers write the
// same element (see the kernels' `matmul` / `causal_attention`).
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
