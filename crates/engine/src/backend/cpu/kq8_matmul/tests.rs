use super::*;
use crate::quant::random::{Rng, random_bytes};
use crate::quant::{WeightBytes, dequant};

const FORMATS: [KFormat; 6] = [
    KFormat::Q2K,
    KFormat::Q3K,
    KFormat::Q4K,
    KFormat::Q5K,
    KFormat::Q6K,
    KFormat::Iq2Xxs,
];

/// Activations with a few large channels, as real hidden states have.
fn activations(m: usize, k: usize, seed: u64) -> Vec<f32> {
    crate::quant::random::activations_with_outliers(m * k, seed)
}

fn every_kernel() -> Vec<KKernels> {
    let mut out = vec![KKernels::Scalar];
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        out.push(KKernels::Avx2);
        if kernels() == KKernels::Avx512Vnni {
            out.push(KKernels::Avx512Vnni);
        }
    }
    out
}

fn tensor(format: KFormat, data: Vec<u8>, n: usize, k: usize) -> QuantTensor {
    QuantTensor::new(
        format.weight_type(),
        vec![n, k],
        WeightBytes::owned(data),
        None,
    )
    .unwrap()
}

/// The product with the given kernels, through `run_range` (one work item
/// holding every row).
fn product_with(q: &QuantTensor, kernels: KKernels, x: &[f32], m: usize) -> Vec<f32> {
    let (n, k) = (q.rows(), q.cols());
    let mut rows = QuantizedRows::default();
    rows.fill(x, m, k);
    let mut y = vec![f32::NAN; m * n];
    let ptr = SendPtr(y.as_mut_ptr());
    let format = KFormat::of(q.ty).unwrap();
    // SAFETY: one caller writes `y`, which is `[m, n]`.
    unsafe {
        run_range(
            format,
            kernels,
            &WeightRows::new(q, 0, n),
            &rows,
            &ptr,
            0..n,
        )
    };
    y
}

/// The set's arithmetic from the file's blocks, written out on its own:
/// the blocks decoded to integer form (which `decode_equals_the_file_formats_values`
/// ties to the file format), integer sums in i64 (checked to fit i32), the
/// two float steps spelled out.
fn model_from_file(
    format: KFormat,
    data: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let (nb, bb) = (k / QK, format.block_bytes());
    let mut y = vec![0f32; m * n];
    for r in 0..m {
        let (mut q, mut d, mut bs) = (vec![0i8; k], vec![0f32; nb], vec![0i16; k / 16]);
        quantize_row(&x[r * k..(r + 1) * k], &mut q, &mut d, &mut bs);
        for j in 0..n {
            let mut acc = 0f32;
            for b in 0..nb {
                let blk = scalar::decode(format, &data[(j * nb + b) * bb..(j * nb + b + 1) * bb]);
                let (mut sumi, mut summ) = (0i64, 0i64);
                for i in 0..QK {
                    let s = i / blk.sub;
                    let qi = q[b * QK + i] as i64;
                    sumi += blk.sc[s] as i64 * blk.w[i] as i64 * qi;
                    summ += blk.m[s] as i64 * qi;
                }
                let (sumi, summ) = (i32::try_from(sumi).unwrap(), i32::try_from(summ).unwrap());
                acc = (blk.d * d[b]).mul_add(sumi as f32, acc);
                if format.has_min() {
                    acc = (-(blk.dmin * d[b])).mul_add(summ as f32, acc);
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
fn decode_equals_the_file_formats_values() {
    for format in FORMATS {
        let (n, k) = (8, 512);
        let data = random_bytes(format.weight_type(), n, k, &mut Rng::new(13));
        let mut want = vec![0f32; n * k];
        dequant::blocks(format.weight_type(), &data, &mut want);
        for (i, blk) in data.chunks_exact(format.block_bytes()).enumerate() {
            let d = scalar::decode(format, blk);
            for v in 0..QK {
                let s = v / d.sub;
                let mut got = (d.d * d.sc[s] as f32) * d.w[v] as f32;
                if format.has_min() {
                    got -= d.dmin * d.m[s] as f32;
                }
                assert_eq!(
                    got.to_bits(),
                    want[i * QK + v].to_bits(),
                    "{format:?} block {i} value {v}: {got} vs {}",
                    want[i * QK + v]
                );
            }
        }
    }
}

#[test]
fn every_kernel_computes_the_file_model_bit_for_bit_for_every_row_count() {
    for format in FORMATS {
        // 37 rows: two whole work items and a partial one.
        let (n, k) = (37, 768);
        let data = random_bytes(format.weight_type(), n, k, &mut Rng::new(7));
        let q = tensor(format, data.clone(), n, k);
        for m in [1, 2, 3, 4, 5, 9] {
            let x = activations(m, k, 11 + m as u64);
            let want = bits(&model_from_file(format, &data, n, k, &x, m));
            for kernels in every_kernel() {
                let got = bits(&product_with(&q, kernels, &x, m));
                assert_eq!(got, want, "{format:?} {kernels:?} m={m}");
            }
        }
    }
}

#[test]
fn a_row_has_the_same_bits_in_every_window_and_thread_split() {
    for format in FORMATS {
        let (n, k) = (80, 1024);
        let data = random_bytes(format.weight_type(), n, k, &mut Rng::new(3));
        let w = KMatrix::new(Arc::new(tensor(format, data, n, k))).unwrap();
        let m = 11;
        let x = activations(m, k, 5);
        // Through the pool (work items of 16 rows over the threads).
        let mut all = vec![0f32; m * n];
        w.matmul(&x, m, &mut all);
        assert_eq!(
            bits(&all),
            bits(&product_with(&w.q, kernels(), &x, m)),
            "{format:?}: pool vs one work item"
        );
        for r in 0..m {
            let mut one = vec![0f32; n];
            w.matmul(&x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(
                bits(&one),
                bits(&all[r * n..(r + 1) * n]),
                "{format:?} row {r}"
            );
        }
        // A range of rows (an expert of a stack) is those rows' columns.
        let mut part = vec![0f32; m * 19];
        matmul_rows(&w.q, 40, 19, &x, m, &mut part);
        for r in 0..m {
            assert_eq!(
                bits(&part[r * 19..(r + 1) * 19]),
                bits(&all[r * n + 40..r * n + 59])
            );
        }
    }
}

#[test]
fn rows_split_over_parts_read_the_right_bytes() {
    let (n, k) = (40, 512);
    let data = random_bytes(WeightType::Q4_K, n, k, &mut Rng::new(17));
    let whole = tensor(KFormat::Q4K, data.clone(), n, k);
    let rb = whole.row_bytes();
    let parts = QuantTensor::join(
        vec![n, k],
        &[
            &tensor(KFormat::Q4K, data[..7 * rb].to_vec(), 7, k),
            &tensor(KFormat::Q4K, data[7 * rb..].to_vec(), 33, k),
        ],
    )
    .unwrap();
    let x = activations(2, k, 9);
    let (mut a, mut b) = (vec![0f32; 2 * 30], vec![0f32; 2 * 30]);
    matmul_rows(&whole, 5, 30, &x, 2, &mut a);
    matmul_rows(&parts, 5, 30, &x, 2, &mut b);
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn stays_within_the_activation_rounding_of_the_reference_product() {
    for format in FORMATS {
        let (n, k) = (48, 1024);
        let data = random_bytes(format.weight_type(), n, k, &mut Rng::new(9));
        let w = KMatrix::new(Arc::new(tensor(format, data.clone(), n, k))).unwrap();
        let mut deq = vec![0f32; n * k];
        dequant::blocks(format.weight_type(), &data, &mut deq);
        let m = 3;
        let x = activations(m, k, 21);
        let mut y = vec![0f32; m * n];
        w.matmul(&x, m, &mut y);
        // Each activation moves by at most da/2 = amax/254 of its
        // super-block, so |Δy| ≤ Σ_b amax_b/254 · Σ_i |w_bi|; the f32
        // steps add a few ulps of Σ |w·x| on top.
        let mut worst = 0f64;
        for r in 0..m {
            for j in 0..n {
                let (mut bound, mut exact, mut mag) = (0f64, 0f64, 0f64);
                for b in 0..k / QK {
                    let xb = &x[r * k + b * QK..r * k + (b + 1) * QK];
                    let wb = &deq[j * k + b * QK..j * k + (b + 1) * QK];
                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                    bound += amax / 254.0 * wb.iter().map(|v| v.abs() as f64).sum::<f64>();
                    exact += wb
                        .iter()
                        .zip(xb)
                        .map(|(&w, &x)| w as f64 * x as f64)
                        .sum::<f64>();
                    mag += wb
                        .iter()
                        .zip(xb)
                        .map(|(&w, &x)| (w as f64 * x as f64).abs())
                        .sum::<f64>();
                }
                let diff = (y[r * n + j] as f64 - exact).abs();
                assert!(
                    diff <= bound * 1.001 + mag * 1e-6,
                    "{format:?} ({r},{j}): {diff} > {bound}"
                );
                worst = worst.max(diff / bound);
            }
        }
        assert!(worst > 0.0, "{format:?}: the rounding shows");
    }
}

#[test]
fn activation_rounding_is_bounded_and_reports_nan() {
    let k = 512;
    let mut x = activations(1, k, 2);
    x[3] = -1000.0;
    let (mut q, mut d, mut bs) = (vec![0i8; k], vec![0f32; 2], vec![0i16; k / 16]);
    quantize_row(&x, &mut q, &mut d, &mut bs);
    assert_eq!(q[3], -127);
    for (s, &sum) in bs.iter().enumerate() {
        assert_eq!(
            sum as i32,
            q[16 * s..16 * (s + 1)]
                .iter()
                .map(|&v| v as i32)
                .sum::<i32>()
        );
    }
    for (i, (&xv, &qv)) in x.iter().zip(&q).enumerate() {
        let db = d[i / QK];
        assert!(
            (xv - db * qv as f32).abs() <= db * 0.5 * 1.0001,
            "value {i}"
        );
    }
    // An all-zero super-block rounds to zeros with d = 0.
    quantize_row(&[0.0; QK], &mut q[..QK], &mut d[..1], &mut bs[..16]);
    assert_eq!(d[0], 0.0);
    assert!(q[..QK].iter().all(|&v| v == 0));
    // A NaN reaches every output of the product.
    x[300] = f32::NAN;
    for format in FORMATS {
        let data = random_bytes(format.weight_type(), 16, k, &mut Rng::new(1));
        let w = KMatrix::new(Arc::new(tensor(format, data, 16, k))).unwrap();
        let mut y = vec![0f32; 16];
        w.matmul(&x, 1, &mut y);
        assert!(y.iter().all(|v| v.is_nan()), "{format:?}");
    }
}

#[test]
fn takes_only_whole_super_blocks_of_its_types() {
    let q = |ty: WeightType, k: usize| {
        let data = random_bytes(ty, 2, k, &mut Rng::new(1));
        QuantTensor::new(ty, vec![2, k], WeightBytes::owned(data), None).unwrap()
    };
    assert!(supports(&q(WeightType::Q4_K, 512)));
    assert!(!supports(&q(WeightType::Q8_0, 512)));
    assert!(!supports(&q(WeightType::Q4_0, 512)));
}
