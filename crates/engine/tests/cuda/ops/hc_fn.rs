//! `Backend::rms_matmul`, the mHC `fn` projection after its unweighted RMS
//! norm: the CUDA fast set's one launch (`kernels/hc_fn.cu`, sums of its
//! own order) near the reference set's two ops and bit-identical across
//! row counts (one output a block below 16 rows, eight from 16: the same
//! bits), for f32, F16 and BF16 weights; where the kernel does not apply
//! (an input size not a multiple of 8) the fast set runs the two ops, bit
//! for bit; and the reference set's op is exactly its norm then product.

use std::sync::Arc;

use ds4_engine::backend::{Backend, CudaOps, HostWeight};
use ds4_engine::quant::WeightType;
use ds4_engine::quant::random::random_stored;

use super::kq8::fast_gpu;
use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

/// `[n, k]` random weights of `ty` (f32 as a host tensor, 16-bit floats
/// stored).
fn weight(ty: WeightType, n: usize, k: usize, seed: u64) -> HostWeight {
    match ty {
        WeightType::F32 => HostWeight::F32(
            candle_core::Tensor::from_vec(rnd(n * k, seed), (n, k), &candle_core::Device::Cpu)
                .unwrap(),
        ),
        _ => HostWeight::Quant(Arc::new(random_stored(ty, &[n, k], &[n], seed))),
    }
}

fn run(g: &CudaOps, m: &<CudaOps as Backend>::Matrix, x: &[f32], k: usize) -> Vec<f32> {
    let rows = x.len() / k;
    let y = g
        .rms_matmul(&up(g, x), rows, &up(g, &vec![1.0; k]), m, 1e-6)
        .unwrap();
    down(g, &y)
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_rms_matmul_is_row_invariant_and_near_the_two_ops() {
    let (fast, reference) = (fast_gpu(), gpu());
    let n = 24;
    for (k, rows, fused) in [(16_384, 40, true), (256, 20, true), (76, 18, false)] {
        for (ti, ty) in [WeightType::F32, WeightType::F16, WeightType::BF16]
            .into_iter()
            .enumerate()
        {
            let seed = 7 + 31 * ti as u64 + k as u64;
            let w = weight(ty, n, k, seed);
            let (fm, rm) = (
                fast.matrix(w.clone(), n, k).unwrap(),
                reference.matrix(w, n, k).unwrap(),
            );
            // Streams of uneven scale per row, so each row's norm matters.
            let x: Vec<f32> = rnd(rows * k, seed + 1)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1.0 + (i / k) as f32))
                .collect();
            let op = format!("rms_matmul_fast_{ty}_k{k}");
            rows_invariant(&op, rows, |r| {
                run(&fast, &fm, &x[r.start * k..r.end * k], k)
            });
            let f = run(&fast, &fm, &x, k);
            let r = run(&reference, &rm, &x, k);
            // The reference set's op is its norm, then its product.
            let ones = up(&reference, &vec![1.0; k]);
            let normed = reference
                .rms_norm(&up(&reference, &x), k, &ones, 1e-6)
                .unwrap();
            let two = down(&reference, &reference.matmul(&normed, rows, &rm).unwrap());
            assert_eq!(bits(&r), bits(&two), "{op}: the reference's two ops");
            if fused {
                // Another order of the same f32 sums.
                check(&op, &f, &r, 1e-5, false);
            } else {
                assert_eq!(bits(&f), bits(&r), "{op}: not fused, the two ops");
            }
        }
    }
}
