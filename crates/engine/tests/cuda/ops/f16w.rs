//! The fast kernel set's products over F16 / BF16 weights on the GPU
//! (`kernels/f16w.cu`): f32 activations, a warp an output, lane l's FMA
//! chain over the 8-value units u ≡ l (mod 32) then the warp's butterfly.
//! Every output is that order's bits (emulated here on the host), in every
//! row count and kernel (one row, a warp an output over tiles, four outputs
//! a warp), near the reference set's order; a routed pair's projection is
//! the product by its expert's matrix; where k is not a multiple of 8 the
//! fast set runs the reference kernels, bit for bit.

use std::sync::Arc;

use ds4_engine::backend::{Backend, CudaOps, HostWeight, KernelSet};
use ds4_engine::quant::WeightType;
use ds4_engine::quant::random::random_stored;

use super::kq8::fast_gpu;
use super::stored::{routed_and_expert_products, stacks_on};
use crate::support::{bits, check, down, gpu, rnd, rows_invariant, up};

const TYPES: [WeightType; 2] = [WeightType::F16, WeightType::BF16];

/// `y[r, j]` in the fast set's order: lane l's chain over units
/// u ≡ l (mod 32), a unit's values in order, then the butterfly
/// (`warp_sum`: lane values added to their partner's at distance 16, 8, 4,
/// 2, 1; every lane ends with lane 0's bits).
fn emulated(w: &[f32], x: &[f32], rows: usize, n: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; rows * n];
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            let mut lanes = [0f32; 32];
            for (l, acc) in lanes.iter_mut().enumerate() {
                for u in (l..k / 8).step_by(32) {
                    for i in 8 * u..8 * u + 8 {
                        *acc = wr[i].mul_add(xr[i], *acc);
                    }
                }
            }
            for step in [16, 8, 4, 2, 1] {
                let before = lanes;
                for (l, v) in lanes.iter_mut().enumerate() {
                    *v = before[l] + before[l ^ step];
                }
            }
            y[r * n + j] = lanes[0];
        }
    }
    y
}

fn matrix(g: &CudaOps, w: &HostWeight, n: usize, k: usize) -> <CudaOps as Backend>::Matrix {
    let m = g.matrix(w.clone(), n, k).unwrap();
    assert!(format!("{m:?}").contains("Stored"), "{m:?} is not stored");
    m
}

/// Rows 1 (`f16w_one_*`), 2–64 (`f16w_few_*`: one tile, several, a partial
/// one) and 65–100 (`f16w_rows_*`: four outputs a warp, outputs past n in
/// the last warp); lengths of one unit a lane and less (k = 136: 17 units),
/// several rounds of eight (4096, 16384), a 37-output product of two joined
/// parts: the emulated order's bits, rows independent of the window, within
/// 1e-5 of the reference set.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_f16_products_are_their_order() {
    let (fast, reference) = (fast_gpu(), gpu());
    assert_eq!(fast.kernel_set(), KernelSet::Fast);
    for (ti, ty) in TYPES.into_iter().enumerate() {
        for (n, k, parts) in [
            (37usize, 4096usize, vec![20usize, 17]),
            (70, 136, vec![70]),
            (9, 16_384, vec![9]),
        ] {
            let seed = 4100 + 10 * ti as u64 + k as u64 + n as u64;
            let w = HostWeight::Quant(Arc::new(random_stored(ty, &[n, k], &parts, seed)));
            let host = w_of(&w, n, k);
            let (fm, rm) = (matrix(&fast, &w, n, k), matrix(&reference, &w, n, k));
            let x: Vec<f32> = rnd(100 * k, seed + 1)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1.0 + (i / k % 7) as f32))
                .collect();
            for rows in [1usize, 2, 5, 8, 9, 64, 65, 100] {
                let xs = &x[..rows * k];
                let what = format!("fast {ty} [{n},{k}] x{rows}");
                let got = down(&fast, &fast.matmul(&up(&fast, xs), rows, &fm).unwrap());
                assert_eq!(
                    bits(&got),
                    bits(&emulated(&host, xs, rows, n, k)),
                    "{what}: not the fast order"
                );
                let want = down(
                    &reference,
                    &reference.matmul(&up(&reference, xs), rows, &rm).unwrap(),
                );
                check(&what, &got, &want, 1e-5, false);
            }
            rows_invariant(&format!("fast {ty} [{n},{k}]"), 100, |r| {
                let xs = &x[r.start * k..r.end * k];
                down(&fast, &fast.matmul(&up(&fast, xs), r.len(), &fm).unwrap())
            });
        }
    }
}

/// The host values of a stored weight.
fn w_of(w: &HostWeight, n: usize, k: usize) -> Vec<f32> {
    let HostWeight::Quant(q) = w else {
        panic!("a stored weight")
    };
    let mut out = vec![0f32; n * k];
    q.dequantize_rows(0, n, &mut out);
    out
}

/// A k that is not a multiple of 8 keeps the reference kernels on the fast
/// set, for every row count: the reference set's bits.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_f16_products_of_odd_lengths_are_the_reference() {
    let (fast, reference) = (fast_gpu(), gpu());
    let (n, k) = (24usize, 76usize);
    for (ti, ty) in TYPES.into_iter().enumerate() {
        let w = HostWeight::Quant(Arc::new(random_stored(ty, &[n, k], &[n], 4300 + ti as u64)));
        let (fm, rm) = (matrix(&fast, &w, n, k), matrix(&reference, &w, n, k));
        let x = rnd(20 * k, 4310 + ti as u64);
        for rows in [1usize, 3, 20] {
            let xs = &x[..rows * k];
            let f = down(&fast, &fast.matmul(&up(&fast, xs), rows, &fm).unwrap());
            let r = down(
                &reference,
                &reference.matmul(&up(&reference, xs), rows, &rm).unwrap(),
            );
            assert_eq!(bits(&f), bits(&r), "fast {ty} [{n},{k}] x{rows}");
        }
    }
}

/// Routed SwiGLU experts over F16 / BF16 stacks on the fast set: every
/// (token, slot) projection has the bits of the fast `matmul` by that
/// expert's matrix (`f16w_gather_*` against `f16w_one_*`), so the output
/// equals those products, `swiglu` and the slots summed in order.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_f16_experts_are_their_expert_products() {
    let g = fast_gpu();
    let (rows, e, top, h, inter) = (5usize, 4usize, 2usize, 512usize, 136usize);
    for (ti, ty) in TYPES.into_iter().enumerate() {
        let seed = 4400 + 10 * ti as u64;
        let st = stacks_on(&g, ty, e, h, inter, seed);
        let x: Vec<f32> = rnd(rows * h, seed + 2).iter().map(|v| 3.0 * v).collect();
        let logits = rnd(rows * e, seed + 3);
        let [got, want] =
            routed_and_expert_products(&g, &st, &x, &logits, (rows, e, top, h, inter));
        assert_eq!(bits(&got), bits(&want), "fast {ty} experts");
        println!("REPORT fast16_experts type={ty} ok=true");
    }
}
