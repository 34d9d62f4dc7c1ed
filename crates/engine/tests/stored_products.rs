//! The CPU reference product of every stored type: the bits of the f32
//! product over the same matrix dequantized (`CpuMatrix::Stored` runs the f32
//! kernel over exactly dequantized rows), for any number of rows in the call
//! (a row's bits never depend on the others), and expert stacks likewise.

use std::sync::Arc;

use ds4_engine::backend::{Backend, CpuOps, HostWeight};
use ds4_engine::quant::random::{STORED_TYPES, random_stored};
use ds4_engine::quant::{QuantTensor, WeightType};

const N: usize = 40;
const K: usize = 512;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_stored_type_has_the_bits_of_its_dequantized_f32_product() {
    let ops = CpuOps;
    let x: Vec<f32> = (0..17 * K)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    for (n, ty) in STORED_TYPES.into_iter().enumerate() {
        let q = random_stored(ty, &[N, K], &[N], 7 + n as u64);
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
        let gu = random_stored(ty, &[e, 2 * inter, h], &[e * 2 * inter], 100 + n as u64);
        let dn = random_stored(ty, &[e, h, inter], &[e * h], 200 + n as u64);
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
