//! The fast kernel set's products on the GPU (`kernels/kq8.cu`): Q2_K–Q6_K
//! and IQ2_XXS with activations rounded to int8 super-blocks compute the
//! CPU fast set's arithmetic (`cpu/kq8_matmul`), so every output is the
//! CPU fast kernels' bits — in every row count, tile and routed pair.

use std::sync::{Arc, OnceLock};

use ds4_engine::backend::cpu::kq8_matmul::KMatrix;
use ds4_engine::backend::{Backend, CudaOps, HostWeight, KernelSet};
use ds4_engine::quant::WeightType;
use ds4_engine::quant::random::random_stored;

use super::stored::{routed_and_expert_products, stacks_on};
use crate::support::{bits, down, gpu, rnd, up};

const TYPES: [WeightType; 6] = [
    WeightType::Q2_K,
    WeightType::Q3_K,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
    WeightType::IQ2_XXS,
];

/// A device of its own running the fast set (the shared one keeps the
/// reference set the other tests check).
pub(crate) fn fast_gpu() -> CudaOps {
    static GPU: OnceLock<CudaOps> = OnceLock::new();
    GPU.get_or_init(|| {
        let g = CudaOps::new(0).expect("a usable CUDA device");
        g.set_kernel_set(KernelSet::Fast);
        g
    })
    .clone()
}

/// Activations with every super-block kind the rounding meets: random
/// values at several magnitudes, an all-zero super-block, one value far
/// above the rest.
fn activations(rows: usize, k: usize, seed: u64) -> Vec<f32> {
    rounding_cases(rows, k, seed, 256)
}

/// Rows at several magnitudes, the first `zero` values of every third row
/// zero (a whole rounding block), one value far above the rest of its
/// block in every fifth.
pub(crate) fn rounding_cases(rows: usize, k: usize, seed: u64, zero: usize) -> Vec<f32> {
    let mut x = rnd(rows * k, seed);
    for (r, row) in x.chunks_mut(k).enumerate() {
        let scale = [1.0f32, 30.0, 1e-3, 4.0][r % 4];
        row.iter_mut().for_each(|v| *v *= scale);
        if r % 3 == 1 {
            row[..zero].iter_mut().for_each(|v| *v = 0.0);
        }
        if r % 5 == 2 {
            row[k - 7] = 1e4;
        }
    }
    x
}

/// Products of 1, 2, 3, 5 and 17 rows (one-row kernel, tiles of four,
/// partial tiles), reductions of 1, 5 and 16 super-blocks (whole and
/// partial groups of four), one part or two joined: the CPU fast kernel's
/// bits. The fast device reports the fast set's id.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_kq8_products_are_the_cpu_fast_bits() {
    let g = fast_gpu();
    assert_eq!(g.kernel_set(), KernelSet::Fast);
    let (fast_id, reference_id) = (g.id(), gpu().id());
    assert_ne!(fast_id.tag, reference_id.tag);
    assert!(fast_id.tag.ends_with("+q8-activations"), "{fast_id:?}");
    let mut failed = Vec::new();
    for (ti, ty) in TYPES.into_iter().enumerate() {
        let r = std::panic::catch_unwind(|| {
            for k in [256usize, 1280, 4096] {
                for (n, parts) in [(37, vec![37]), (70, vec![45, 25])] {
                    let seed = 3000 + 10 * ti as u64 + k as u64 + n as u64;
                    let q = Arc::new(random_stored(ty, &[n, k], &parts, seed));
                    let cpu = KMatrix::new(q.clone()).expect("a fast-set type");
                    let gm = g.matrix(HostWeight::Quant(q), n, k).unwrap();
                    let x = activations(17, k, seed + 1);
                    for rows in [1usize, 2, 3, 5, 17] {
                        let xs = &x[..rows * k];
                        let got = down(&g, &g.matmul(&up(&g, xs), rows, &gm).unwrap());
                        let mut want = vec![0f32; rows * n];
                        cpu.matmul(xs, rows, &mut want);
                        assert!(want.iter().all(|v| v.is_finite()));
                        assert_eq!(
                            bits(&got),
                            bits(&want),
                            "{ty} [{n},{k}] parts {parts:?} x{rows}"
                        );
                    }
                }
            }
        });
        println!("REPORT kq8_matmul type={ty} ok={}", r.is_ok());
        if r.is_err() {
            failed.push(ty);
        }
    }
    assert!(failed.is_empty(), "failing types {failed:?}");
}

/// Routed products over stacks of these types (each expert a part): every
/// (token, slot) projection has the bits of the fast `matmul` by that
/// expert's own matrix, so the routed SwiGLU output equals those products,
/// `swiglu` and the slots summed in order on the host — over 16 experts,
/// for 10 pairs (a warp per pair, `kq8_gather_*`), 40 and 120 (grouped
/// by expert into tiles of up to 8 on the tensor cores, `kq8_mma_*`: 2.5
/// and 7.5 pairs an expert, whole and partial tiles).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_kq8_experts_are_their_expert_products() {
    let g = fast_gpu();
    let (e, k, h, inter) = (16usize, 2usize, 512usize, 256usize);
    let mut failed = Vec::new();
    for (ti, ty) in TYPES.into_iter().enumerate() {
        let r = std::panic::catch_unwind(|| {
            let seed = 700 + 7 * ti as u64;
            let st = stacks_on(&g, ty, e, h, inter, seed);
            for rows in [5usize, 20, 60] {
                let x = activations(rows, h, seed + 2);
                let logits = rnd(rows * e, seed + 3);
                let [got, want] =
                    routed_and_expert_products(&g, &st, &x, &logits, (rows, e, k, h, inter));
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{ty} x{rows}: not its expert products"
                );
            }
        });
        println!("REPORT kq8_experts type={ty} ok={}", r.is_ok());
        if r.is_err() {
            failed.push(ty);
        }
    }
    assert!(failed.is_empty(), "failing types {failed:?}");
}
