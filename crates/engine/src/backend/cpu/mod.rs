//! CPU kernels candle lacks or runs slowly.

pub mod block_matmul;
