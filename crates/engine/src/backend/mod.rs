//! Device-specific kernels behind candle custom ops. Each op has a CPU
//! implementation first; a CUDA or Metal implementation plugs into the same
//! op (`cuda_fwd` / `metal_fwd`) without changing the layers that call it.

pub mod cpu;
