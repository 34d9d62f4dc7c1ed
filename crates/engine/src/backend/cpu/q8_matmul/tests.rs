use super::*;
use crate::backend::cpu::block_matmul::BlockMatrix;
use crate::quant::WeightType;
use crate::quant::random::{Rng, random_bytes};

fn weight_type(format: BlockFormat) -> WeightType {
    match format {
        BlockFormat::Q4_1 => WeightType::Q4_1,
        BlockFormat::Q8_0 => WeightType::Q8_0,
    }
}

const FORMATS: [BlockFormat; 2] = [BlockFormat::Q4_1, BlockFormat::Q8_0];

/// Activations with a few large channels, as real hidden states have.
fn activations(m: usize, k: usize, seed: u64) -> Vec<f32> {
    crate::quant::random::activations_with_outliers(m * k, seed)
}

fn every_kernel() -> Vec<Q8Kernels> {
    let mut out = vec![Q8Kernels::Scalar];
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        out.push(Q8Kernels::Avx2);
        if std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
        {
            out.push(Q8Kernels::Avx512Vnni);
        }
    }
    out
}

/// The product with the given kernels, through the same tiling as
/// `matmul` (one work item holding every group).
fn product_with(w: &Q8Matrix, kernels: Q8Kernels, x: &[f32], m: usize) -> Vec<f32> {
    let mut rows = QuantizedRows::default();
    rows.fill(x, m, w.k);
    let mut y = vec![f32::NAN; m * w.n];
    let ptr = SendPtr(y.as_mut_ptr());
    // SAFETY: one caller writes `y`, which is `[m, n]`.
    unsafe { w.run_range(kernels, &rows, &ptr, 0..w.groups(), OutputMap::None) };
    y
}

/// The set's arithmetic computed from the file's blocks directly (no
/// repacked layout): the definition the kernels must reproduce exactly.
fn model_from_file(
    data: &[u8],
    format: BlockFormat,
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let nb = k / BLOCK;
    let bb = format.block_bytes();
    let f16 = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let (mut q, mut d, mut qs, mut s) =
            (vec![0i8; k], vec![0f32; nb], vec![0i32; nb], vec![0f32; nb]);
        quantize_row(&x[r * k..(r + 1) * k], &mut q, &mut d, &mut qs, &mut s);
        for j in 0..n {
            let mut acc = 0f32;
            for b in 0..nb {
                let block = &data[(j * nb + b) * bb..(j * nb + b + 1) * bb];
                let qa = &q[b * BLOCK..(b + 1) * BLOCK];
                match format {
                    BlockFormat::Q4_1 => {
                        let u = |v: usize| {
                            if v < 16 {
                                block[4 + v] & 0x0F
                            } else {
                                block[4 + v - 16] >> 4
                            }
                        };
                        let sumi: i32 = (0..BLOCK).map(|v| u(v) as i32 * qa[v] as i32).sum();
                        acc = (f16(block, 0) * d[b]).mul_add(sumi as f32, acc);
                        acc = f16(block, 2).mul_add(s[b], acc);
                    }
                    BlockFormat::Q8_0 => {
                        let sumi: i32 = (0..BLOCK)
                            .map(|v| block[2 + v] as i8 as i32 * qa[v] as i32)
                            .sum();
                        acc = (f16(block, 0) * d[b]).mul_add(sumi as f32, acc);
                    }
                }
            }
            y[r * n + j] = acc;
        }
    }
    y
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_kernel_computes_the_file_model_bit_for_bit_for_every_row_count() {
    for format in FORMATS {
        // 37 rows: two whole groups and a partial one.
        let (n, k) = (37, 96);
        let data = random_bytes(weight_type(format), n, k, &mut Rng::new(7));
        let w = Q8Matrix::new(&data, format, n, k).unwrap();
        for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 17] {
            let x = activations(m, k, 11 + m as u64);
            let want = bits(&model_from_file(&data, format, n, k, &x, m));
            for kernels in every_kernel() {
                let got = bits(&product_with(&w, kernels, &x, m));
                assert_eq!(got, want, "{format:?} {kernels:?} m={m}");
            }
        }
    }
}

#[test]
fn a_row_has_the_same_bits_in_every_window_and_thread_split() {
    for format in FORMATS {
        let (n, k) = (80, 576);
        let data = random_bytes(weight_type(format), n, k, &mut Rng::new(3));
        let w = Q8Matrix::new(&data, format, n, k).unwrap();
        let m = 11;
        let x = activations(m, k, 5);
        let mut all = vec![0f32; m * n];
        w.matmul(&x, m, &mut all);
        for r in 0..m {
            let mut one = vec![0f32; n];
            w.matmul(&x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(
                bits(&one),
                bits(&all[r * n..(r + 1) * n]),
                "{format:?} row {r}"
            );
        }
        // Several parts in one dispatch: each part's own bits.
        let data2 = random_bytes(weight_type(format), 19, k, &mut Rng::new(4));
        let w2 = Q8Matrix::new(&data2, format, 19, k).unwrap();
        let (mut y1, mut y2) = (vec![0f32; m * n], vec![0f32; m * 19]);
        Q8Matrix::matmul_several(&[&w, &w2], &x, m, &mut [&mut y1, &mut y2]);
        let mut alone2 = vec![0f32; m * 19];
        w2.matmul(&x, m, &mut alone2);
        assert_eq!(bits(&y1), bits(&all));
        assert_eq!(bits(&y2), bits(&alone2));
    }
}

/// An output map runs inside the dispatch with the bits of the same map
/// over the finished product: SiLU on one part, none on the other, for
/// 1, 2, 8 and 11 rows (a partial last group: 19 columns).
#[test]
fn mapped_outputs_are_the_map_of_the_product() {
    for format in FORMATS {
        let k = 576;
        let data = random_bytes(weight_type(format), 80, k, &mut Rng::new(21));
        let w = Q8Matrix::new(&data, format, 80, k).unwrap();
        let data2 = random_bytes(weight_type(format), 19, k, &mut Rng::new(22));
        let w2 = Q8Matrix::new(&data2, format, 19, k).unwrap();
        for m in [1, 2, 8, 11] {
            let x = activations(m, k, 23);
            let (mut y1, mut y2) = (vec![0f32; m * 80], vec![0f32; m * 19]);
            let maps = [OutputMap::None, OutputMap::Silu];
            Q8Matrix::matmul_several_with(&[&w, &w2], &x, m, &mut [&mut y1, &mut y2], &|i| maps[i]);
            let (mut p1, mut p2) = (vec![0f32; m * 80], vec![0f32; m * 19]);
            w.matmul(&x, m, &mut p1);
            w2.matmul(&x, m, &mut p2);
            let want2: Vec<f32> = p2
                .iter()
                .map(|&v| crate::backend::cpu::ops::silu(v))
                .collect();
            assert_eq!(bits(&y1), bits(&p1), "{format:?} m={m} unmapped");
            assert_eq!(bits(&y2), bits(&want2), "{format:?} m={m} silu");
            assert!(
                want2.iter().zip(&p2).any(|(a, b)| a != b),
                "the map did something"
            );
        }
    }
}

#[test]
fn stays_within_the_activation_rounding_of_the_reference_product() {
    for format in FORMATS {
        let (n, k) = (64, 576);
        let data = random_bytes(weight_type(format), n, k, &mut Rng::new(9));
        let fast = Q8Matrix::new(&data, format, n, k).unwrap();
        let reference = BlockMatrix::new(&data, format, n, k).unwrap();
        let m = 3;
        let x = activations(m, k, 21);
        let (mut yf, mut yr) = (vec![0f32; m * n], vec![0f32; m * n]);
        fast.matmul(&x, m, &mut yf);
        reference.matmul(&x, m, &mut yr);
        // Bound: each activation moves by at most d/2 = amax/254 of its
        // block, so |Δy| ≤ Σ_b amax_b/254 · Σ_i |w_bi|.
        let nb = k / BLOCK;
        let deq = |j: usize, i: usize| -> f32 {
            let bb = format.block_bytes();
            let block = &data[(j * nb + i / BLOCK) * bb..];
            let f16 = |at: usize| half::f16::from_le_bytes([block[at], block[at + 1]]).to_f32();
            let v = i % BLOCK;
            match format {
                BlockFormat::Q4_1 => {
                    let u = if v < 16 {
                        block[4 + v] & 0x0F
                    } else {
                        block[4 + v - 16] >> 4
                    };
                    f16(0) * u as f32 + f16(2)
                }
                BlockFormat::Q8_0 => f16(0) * block[2 + v] as i8 as f32,
            }
        };
        for r in 0..m {
            for j in 0..n {
                let mut bound = 0f64;
                for b in 0..nb {
                    let xb = &x[r * k + b * BLOCK..r * k + (b + 1) * BLOCK];
                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                    let wsum: f64 = (0..BLOCK).map(|i| deq(j, b * BLOCK + i).abs() as f64).sum();
                    bound += amax / 254.0 * wsum;
                }
                let diff = (yf[r * n + j] - yr[r * n + j]).abs() as f64;
                assert!(
                    diff <= bound * 1.001 + 1e-4,
                    "{format:?} ({r},{j}): {diff} > {bound}"
                );
            }
        }
    }
}

#[test]
fn activation_rounding_is_bounded_and_reports_nan() {
    let mut x: Vec<f32> = activations(1, 64, 2);
    x[3] = -1000.0;
    let (mut q, mut d, mut qs, mut s) =
        (vec![0i8; 64], vec![0f32; 2], vec![0i32; 2], vec![0f32; 2]);
    quantize_row(&x, &mut q, &mut d, &mut qs, &mut s);
    assert_eq!(q[3], -127);
    assert!(q.iter().all(|v| (-127..=127).contains(v)));
    for (b, &db) in d.iter().enumerate() {
        assert_eq!(
            qs[b],
            q[b * 32..(b + 1) * 32]
                .iter()
                .map(|&v| v as i32)
                .sum::<i32>()
        );
        for i in 0..32 {
            let err = (x[b * 32 + i] - db * q[b * 32 + i] as f32).abs();
            assert!(err <= db * 0.5 * 1.0001, "value {i} of block {b}");
        }
    }
    // An all-zero block rounds to zeros with d = 0.
    let zeros = vec![0f32; 32];
    quantize_row(&zeros, &mut q[..32], &mut d[..1], &mut qs[..1], &mut s[..1]);
    assert_eq!((d[0], qs[0]), (0.0, 0));
    // A NaN reaches the product.
    x[40] = f32::NAN;
    let data = random_bytes(WeightType::Q8_0, 16, 64, &mut Rng::new(1));
    let w = Q8Matrix::new(&data, BlockFormat::Q8_0, 16, 64).unwrap();
    let mut y = vec![0f32; 16];
    w.matmul(&x, 1, &mut y);
    assert!(y.iter().all(|v| v.is_nan()));
}

#[test]
fn rejects_bad_shapes() {
    assert!(Q8Matrix::new(&[0; 20], BlockFormat::Q4_1, 1, 33).is_err());
    assert!(Q8Matrix::new(&[0; 19], BlockFormat::Q4_1, 1, 32).is_err());
}
