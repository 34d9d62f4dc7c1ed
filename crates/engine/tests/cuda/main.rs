//! The CUDA backend on a GPU: every op against the CPU reference on random
//! inputs ([`ops`]), and the tiny fixtures end to end ([`e2e`]).
//!
//! These tests need an NVIDIA GPU, so they are `#[ignore]`d: without one
//! they are reported as skipped, never as passed. On a GPU machine run them
//! with `--ignored` (docs/GPU.md has the recipe); there, a missing device
//! fails them. Build: `cargo test --release -p ds4-engine --features cuda
//! --test cuda --no-run`.
#![cfg(feature = "cuda")]

mod bench;
mod bench_batched;
mod e2e;
mod expert_split;
mod fast_exact;
mod fast_quality;
mod ops;
mod support;
