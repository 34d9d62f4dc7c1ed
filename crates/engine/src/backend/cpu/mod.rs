//! CPU kernels candle lacks or runs slowly.

pub mod attention;
pub mod block_matmul;
