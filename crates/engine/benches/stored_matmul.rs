//! The reference kernel set's product for every stored type on the CPU:
//! one activation row (a decode step) times a 4096 × 4096 matrix, reported
//! by criterion as stored bytes per second (`Throughput::Bytes`: the
//! matrix's bytes in its stored type), to set against the machine's memory
//! bandwidth. The matrix (9–64 MiB) is larger than any last-level cache of
//! the machines this runs on except the VMs that report a 480 MiB L3.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ds4_engine::backend::{Backend, CpuOps, HostWeight};
use ds4_engine::quant::{QuantTensor, ScaleGrid, WeightBytes, WeightType};

const N: usize = 4096;
const K: usize = 4096;

/// Byte offsets of the f16 scale fields in a block, forced to a small
/// finite value so no NaN or subnormal slows anything down.
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

fn matrix(ty: WeightType) -> QuantTensor {
    let bytes = ty.row_bytes(K).expect("whole blocks") * N;
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ ty.block_bytes() as u64;
    let mut data: Vec<u8> = (0..bytes)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let half = half::f16::from_f32(0.01).to_le_bytes();
    match ty {
        WeightType::F16 => data
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&half)),
        WeightType::BF16 => data
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&[0x24, 0x3c])),
        WeightType::MXFP4 => data.chunks_exact_mut(17).for_each(|b| b[0] = 120),
        _ => {
            for block in data.chunks_exact_mut(ty.block_bytes()) {
                for &o in scale_fields(ty) {
                    block[o..o + 2].copy_from_slice(&half);
                }
            }
        }
    }
    let scales = match ty {
        WeightType::FP8_E4M3 => {
            data.iter_mut().for_each(|b| *b &= 0x77); // finite codes
            Some(ScaleGrid {
                values: vec![0.01f32; N.div_ceil(128) * K.div_ceil(128)].into(),
                block_rows: 128,
                block_cols: 128,
            })
        }
        WeightType::FP4_E2M1 => Some(ScaleGrid {
            values: vec![0.01f32; N * K / 32].into(),
            block_rows: 1,
            block_cols: 32,
        }),
        _ => None,
    };
    QuantTensor::new(ty, vec![N, K], WeightBytes::owned(data), scales).expect("a valid matrix")
}

fn bench(c: &mut Criterion) {
    let ops = CpuOps;
    let x: Vec<f32> = (0..K)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut group = c.benchmark_group("stored_matmul_4096x4096_1row");
    for ty in [
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
        WeightType::IQ2_XXS,
        WeightType::MXFP4,
        WeightType::FP8_E4M3,
        WeightType::FP4_E2M1,
        // The block kernels, for comparison.
        WeightType::Q4_1,
        WeightType::Q8_0,
    ] {
        let q = matrix(ty);
        group.throughput(Throughput::Bytes(q.byte_size() as u64));
        let m = ops
            .matrix(HostWeight::Quant(Arc::new(q)), N, K)
            .expect("placed");
        group.bench_with_input(BenchmarkId::from_parameter(ty.name()), &m, |b, m| {
            b.iter(|| black_box(ops.matmul(&x, 1, m).expect("product")))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
