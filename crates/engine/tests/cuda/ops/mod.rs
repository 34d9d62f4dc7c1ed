//! Every op of the inventory on the GPU against `CpuOps` on random inputs,
//! with a stated bound per op (relative to the largest reference value),
//! bit-for-bit where the kernel follows the CPU's sequence without a
//! transcendental in it; and bit-identical across row counts, chunkings
//! and repeated runs on the GPU.
//!
//! Bounds: an op whose only difference from the CPU is `expf`/`log1pf`
//! (≤ 2 ulp on the device, ≤ 1 ulp in the host libm) gets 1e-6; an op that
//! adds such values or normalises with its own summation order gets 1e-5;
//! bit-exact ops get 0.

mod attention;
mod elementwise;
mod f16w;
mod fast8;
mod fused;
mod grouped;
mod hc_fn;
pub(crate) mod kq8;
mod linear;
mod memory;
mod norms;
mod recurrent;
mod routing;
pub(crate) mod stored;
