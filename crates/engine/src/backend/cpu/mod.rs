//! CPU kernels candle lacks or runs slowly.

pub mod attention;
pub mod block_matmul;

/// A raw output pointer shared by pool workers that write disjoint elements.
pub(crate) struct SendPtr(pub(crate) *mut f32);
// SAFETY: every user splits the output so that no two workers write the
// same element (see the kernels' `matmul` / `cpu_fwd`).
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}
