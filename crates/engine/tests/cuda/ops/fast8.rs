//! The fast kernel set's Q8_0 / Q4_1 products on the GPU
//! (`kernels/fast8.cu`): activations rounded to int8 blocks of 32, integer
//! sums on `dp4a` (one row) or tensor-core tiles (more), the float steps in
//! block order. Every output is the CPU fast kernel's (`cpu/q8_matmul`)
//! bits, in every row count, tile width and part of a launch.

use std::sync::Arc;

use ds4_engine::backend::cpu::block_matmul::BlockFormat;
use ds4_engine::backend::cpu::q8_matmul::Q8Matrix;
use ds4_engine::backend::{Backend, CudaOps, Epilogue, HostWeight, KernelSet, Unary};
use ds4_engine::quant::random::{Rng, random_bytes};
use ds4_engine::quant::{QuantTensor, WeightBytes, WeightType};

use super::kq8::{fast_gpu, rounding_cases};
use crate::support::{bits, down, up};

const FORMATS: [(WeightType, BlockFormat); 2] = [
    (WeightType::Q8_0, BlockFormat::Q8_0),
    (WeightType::Q4_1, BlockFormat::Q4_1),
];

/// A random `[n, k]` matrix of `ty`: its GGUF bytes, the CPU fast matrix
/// and the fast device's.
fn matrices(
    g: &CudaOps,
    ty: WeightType,
    format: BlockFormat,
    n: usize,
    k: usize,
    seed: u64,
) -> (Q8Matrix, <CudaOps as Backend>::Matrix) {
    let data = random_bytes(ty, n, k, &mut Rng::new(seed));
    let cpu = Q8Matrix::new(&data, format, n, k).expect("whole blocks");
    let q = QuantTensor::new(ty, vec![n, k], WeightBytes::owned(data), None).unwrap();
    let gm = g.matrix(HostWeight::Quant(Arc::new(q)), n, k).unwrap();
    (cpu, gm)
}

/// Rows at several magnitudes, an all-zero block, a value far above the
/// rest of its block.
fn activations(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    rounding_cases(rows, k, seed, 32)
}

/// 1 row (`dp4a`), 2–4 and 5–8 rows (`dp4a` with 4 or 8 rows a warp),
/// 9–128 rows (tiles of 8 rows a warp: whole, partial and several), 129
/// and 200 rows (tiles of 32); one block, 18 blocks, 33 (a one-row round
/// of 32 and one more) and 129 (four rounds and one more); 37 and 70
/// outputs (partial warp tiles and 64-output blocks): the CPU fast
/// kernel's bits.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_block_products_are_the_cpu_fast_bits() {
    let g = fast_gpu();
    assert_eq!(g.kernel_set(), KernelSet::Fast);
    for (fi, (ty, format)) in FORMATS.into_iter().enumerate() {
        for k in [32usize, 576, 1056, 4128] {
            for n in [37usize, 70] {
                let seed = 9000 + 100 * fi as u64 + k as u64 + n as u64;
                let (cpu, gm) = matrices(&g, ty, format, n, k, seed);
                let x = activations(200, k, seed + 1);
                for rows in [1usize, 2, 3, 4, 5, 8, 9, 17, 64, 129, 200] {
                    let xs = &x[..rows * k];
                    let got = down(&g, &g.matmul(&up(&g, xs), rows, &gm).unwrap());
                    let mut want = vec![0f32; rows * n];
                    cpu.matmul(xs, rows, &mut want);
                    assert!(want.iter().all(|v| v.is_finite()));
                    assert_eq!(bits(&got), bits(&want), "{ty} [{n},{k}] x{rows}");
                }
            }
        }
        println!("REPORT fast8_matmul type={ty} ok=true");
    }
}

/// Several matrices read one rounding in one launch (`matmul_many`): each
/// output is its own `matmul_unary`'s (chains applied as stored) or its
/// `matmul` then `swiglu`, for one row and for tiles.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_block_parts_are_their_own_products() {
    let g = fast_gpu();
    let k = 576;
    let chain = [Unary::Affine(0.5, -1.0)];
    for (fi, (ty, format)) in FORMATS.into_iter().enumerate() {
        let seed = 9500 + 10 * fi as u64;
        let mats: Vec<_> = [(40usize, 0u64), (64, 1), (24, 2), (130, 3), (18, 4)]
            .iter()
            .map(|&(n, s)| matrices(&g, ty, format, n, k, seed + s).1)
            .collect();
        let x = activations(40, k, seed + 9);
        for rows in [1usize, 3, 5, 40] {
            let xb = up(&g, &x[..rows * k]);
            let parts: Vec<(&<CudaOps as Backend>::Matrix, Epilogue<'_>)> = vec![
                (&mats[0], Epilogue::Chain(&[])),
                (&mats[1], Epilogue::Chain(&chain)),
                (&mats[2], Epilogue::Swiglu(None)),
                (&mats[3], Epilogue::Chain(&[])),
                (&mats[4], Epilogue::Swiglu(Some(0.75))),
            ];
            let got = g.matmul_many(&xb, rows, &parts).unwrap();
            for (i, ((w, then), y)) in parts.iter().zip(&got).enumerate() {
                let want = match then {
                    Epilogue::Chain(c) => g.matmul_unary(&xb, rows, w, c).unwrap(),
                    Epilogue::Swiglu(limit) => {
                        let gu = g.matmul(&xb, rows, w).unwrap();
                        g.swiglu(&gu, w.dims().0 / 2, *limit).unwrap()
                    }
                };
                assert_eq!(
                    bits(&down(&g, y)),
                    bits(&down(&g, &want)),
                    "{ty} part {i} x{rows}"
                );
            }
        }
        println!("REPORT fast8_parts type={ty} ok=true");
    }
}

/// Groups of one shape (`matmul_grouped`: group `i` reads columns `i·k ..`
/// of the row, writes columns `i·n ..`): each group's columns are its own
/// `matmul` of its slice, for one row, tiles of 8 and tiles of 32.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_block_groups_are_their_own_products() {
    let g = fast_gpu();
    let (groups, n, k) = (5usize, 48usize, 96usize);
    for (fi, (ty, format)) in FORMATS.into_iter().enumerate() {
        let seed = 9700 + 10 * fi as u64;
        let mats: Vec<_> = (0..groups)
            .map(|i| matrices(&g, ty, format, n, k, seed + i as u64).1)
            .collect();
        let refs: Vec<_> = mats.iter().collect();
        let x = activations(150, groups * k, seed + 9);
        for rows in [1usize, 7, 150] {
            let xs = &x[..rows * groups * k];
            let got = down(&g, &g.matmul_grouped(&up(&g, xs), rows, &refs).unwrap());
            for (i, w) in mats.iter().enumerate() {
                let slice: Vec<f32> = xs
                    .chunks(groups * k)
                    .flat_map(|r| r[i * k..(i + 1) * k].to_vec())
                    .collect();
                let want = down(&g, &g.matmul(&up(&g, &slice), rows, w).unwrap());
                let cols: Vec<f32> = got
                    .chunks(groups * n)
                    .flat_map(|r| r[i * n..(i + 1) * n].to_vec())
                    .collect();
                assert_eq!(bits(&cols), bits(&want), "{ty} group {i} x{rows}");
            }
        }
        println!("REPORT fast8_groups type={ty} ok=true");
    }
}
