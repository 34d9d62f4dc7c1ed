//! The CPU reference product of every stored type: the bits of the f32
//! product over the same matrix dequantized (`CpuMatrix::Stored` runs the f32
//! kernel over exactly dequantized rows), for any number of rows in the call
//! (a row's bits never depend on the others), and expert stacks likewise.

use std::sync::Arc;

use ds4_engine::backend::{Backend, CpuOps, HostWeight};
use ds4_engine::quant::{QuantTensor, ScaleGrid, WeightBytes, WeightType};

const N: usize = 40;
const K: usize = 512;

/// Byte offsets of the f16 scale fields of a block (set to small finite
/// values, so products stay finite and the comparison means something).
fn scale_fields(ty: WeightType) -> &'static [usize] {
    match ty {
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 | WeightType::IQ2_XXS => &[0],
        WeightType::Q4_1 | WeightType::Q5_1 | WeightType::Q4_K | WeightType::Q5_K => &[0, 2],
        WeightType::Q2_K => &[80, 82],
        WeightType::Q3_K => &[108],
        WeightType::Q6_K => &[208],
        _ => &[],
    }
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

fn stored(ty: WeightType, dims: Vec<usize>, seed: u64) -> QuantTensor {
    let (cols, rows) = (
        dims[dims.len() - 1],
        dims.iter().rev().skip(1).product::<usize>(),
    );
    let mut data = random_bytes(ty.row_bytes(cols).unwrap() * rows, seed);
    let small = half::f16::from_f32(0.0123).to_le_bytes();
    match ty {
        WeightType::F16 => data.chunks_exact_mut(2).enumerate().for_each(|(i, c)| {
            c.copy_from_slice(&half::f16::from_f32((i % 97) as f32 / 50.0 - 1.0).to_le_bytes())
        }),
        WeightType::BF16 => data
            .chunks_exact_mut(2)
            .for_each(|c| c[1] = 0x3c | (c[1] & 0x80)),
        WeightType::MXFP4 => data
            .chunks_exact_mut(17)
            .for_each(|b| b[0] = 118 + b[0] % 8),
        WeightType::FP8_E4M3 => data.iter_mut().for_each(|b| *b &= 0xF7),
        // Q8_K's scale is an f32.
        WeightType::Q8_K => data
            .chunks_exact_mut(292)
            .for_each(|b| b[..4].copy_from_slice(&0.0123f32.to_le_bytes())),
        _ => data.chunks_exact_mut(ty.block_bytes()).for_each(|b| {
            for &o in scale_fields(ty) {
                b[o..o + 2].copy_from_slice(&small);
            }
        }),
    }
    let scales = match ty {
        WeightType::FP8_E4M3 => Some(ScaleGrid {
            values: (0..rows.div_ceil(128) * cols.div_ceil(128))
                .map(|i| 0.5f32.powi(i as i32 % 4 + 3))
                .collect::<Vec<_>>()
                .into(),
            block_rows: 128,
            block_cols: 128,
        }),
        WeightType::FP4_E2M1 => Some(ScaleGrid {
            values: (0..rows * cols / 32)
                .map(|i| 0.5f32.powi(i as i32 % 5 + 2))
                .collect::<Vec<_>>()
                .into(),
            block_rows: 1,
            block_cols: 32,
        }),
        _ => None,
    };
    QuantTensor::new(ty, dims, WeightBytes::owned(data), scales).unwrap()
}

const TYPES: [WeightType; 15] = [
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q4_0,
    WeightType::Q5_0,
    WeightType::Q5_1,
    WeightType::Q2_K,
    WeightType::Q3_K,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
    WeightType::Q8_K,
    WeightType::IQ2_XXS,
    WeightType::MXFP4,
    WeightType::FP8_E4M3,
    WeightType::FP4_E2M1,
];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_stored_type_has_the_bits_of_its_dequantized_f32_product() {
    let ops = CpuOps;
    let x: Vec<f32> = (0..17 * K)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    for (n, ty) in TYPES.into_iter().enumerate() {
        let q = stored(ty, vec![N, K], 7 + n as u64);
        let f = candle_core::Tensor::from_vec(q.to_f32_vec(), (N, K), &candle_core::Device::Cpu)
            .unwrap();
        assert!(q.to_f32_vec().iter().all(|v| v.is_finite()), "{ty}");
        let sm = ops.matrix(HostWeight::Quant(Arc::new(q)), N, K).unwrap();
        let fm = ops.matrix(HostWeight::F32(f), N, K).unwrap();
        let alone: Vec<Vec<u32>> = (0..17)
            .map(|r| bits(&ops.matmul(&x[r * K..(r + 1) * K].to_vec(), 1, &sm).unwrap()))
            .collect();
        for rows in [1, 2, 3, 5, 17] {
            let xs = x[..rows * K].to_vec();
            let ys = ops.matmul(&xs, rows, &sm).unwrap();
            let yf = ops.matmul(&xs, rows, &fm).unwrap();
            assert_eq!(bits(&ys), bits(&yf), "{ty}: {rows} rows");
            for (r, row) in ys.chunks_exact(N).enumerate() {
                assert_eq!(bits(row), alone[r], "{ty}: row {r} of {rows}");
            }
        }
    }
}

#[test]
fn stored_expert_stacks_have_the_bits_of_their_f32_stacks() {
    use ds4_engine::backend::cpu::CpuRouting;
    let ops = CpuOps;
    let (e, h, inter, k, rows) = (4, 256, 256, 2, 5);
    let x: Vec<f32> = (0..rows * h)
        .map(|i| ((i * 31) % 97) as f32 / 48.0 - 1.0)
        .collect();
    let routing = CpuRouting {
        experts: (0..rows * k).map(|j| (j * 3 + 1) % e).collect(),
        weights: (0..rows * k)
            .map(|j| 0.25 + 0.125 * (j % 4) as f32)
            .collect(),
        k,
    };
    for (n, ty) in [
        WeightType::IQ2_XXS,
        WeightType::Q2_K,
        WeightType::Q4_K,
        WeightType::MXFP4,
        WeightType::FP4_E2M1,
    ]
    .into_iter()
    .enumerate()
    {
        let gu = stored(ty, vec![e, 2 * inter, h], 100 + n as u64);
        let dn = stored(ty, vec![e, h, inter], 200 + n as u64);
        let to_f32 = |q: &QuantTensor| {
            HostWeight::F32(
                candle_core::Tensor::from_vec(
                    q.to_f32_vec(),
                    q.dims.clone(),
                    &candle_core::Device::Cpu,
                )
                .unwrap(),
            )
        };
        let (guf, dnf) = (to_f32(&gu), to_f32(&dn));
        let gs = ops
            .experts(HostWeight::Quant(Arc::new(gu)), e, 2 * inter, h)
            .unwrap();
        let ds = ops
            .experts(HostWeight::Quant(Arc::new(dn)), e, h, inter)
            .unwrap();
        let gf = ops.experts(guf, e, 2 * inter, h).unwrap();
        let df = ops.experts(dnf, e, h, inter).unwrap();
        let a = ops
            .experts_swiglu(&x, rows, &routing, &gs, &ds, Some(7.0))
            .unwrap();
        let b = ops
            .experts_swiglu(&x, rows, &routing, &gf, &df, Some(7.0))
            .unwrap();
        assert!(a.iter().all(|v| v.is_finite()), "{ty}");
        assert_eq!(bits(&a), bits(&b), "{ty}");
    }
}
