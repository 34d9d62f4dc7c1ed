//! CPU kernels candle lacks or runs slowly.

pub mod q4_1;
