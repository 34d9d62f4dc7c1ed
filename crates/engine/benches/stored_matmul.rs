//! The reference kernel set's product for every stored type on the CPU:
//! one activation row (a decode step) times a 4096 × 4096 matrix, reported
//! by criterion as stored bytes per second (`Throughput::Bytes`: the
//! matrix's bytes in its stored type), to set against the machine's memory
//! bandwidth. The matrix (9–64 MiB) is larger than any last-level cache of
//! the machines this runs on except the VMs that report a 480 MiB L3.
//!
//! `fast_vs_reference`: for the types the fast kernel set covers with its
//! int8 product ([`KMatrix`]: Q2_K–Q6_K, IQ2_XXS), that product next to
//! the reference one (this process runs the reference set, so `matrix`
//! places the reference; the fast matrix is built directly), 1 and 4
//! activation rows.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ds4_engine::backend::cpu::kq8_matmul::KMatrix;
use ds4_engine::backend::{Backend, CpuOps, HostWeight};
use ds4_engine::quant::WeightType;
use ds4_engine::quant::random::random_stored;

const N: usize = 4096;
const K: usize = 4096;

fn bench(c: &mut Criterion) {
    let ops = CpuOps;
    let x: Vec<f32> = (0..K)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut group = c.benchmark_group("stored_matmul_4096x4096_1row");
    // Every stored type, then the block kernels for comparison.
    let types = ds4_engine::quant::random::STORED_TYPES
        .into_iter()
        .chain([WeightType::Q4_1, WeightType::Q8_0]);
    for ty in types {
        let q = random_stored(ty, &[N, K], &[N], 1);
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

fn fast_vs_reference(c: &mut Criterion) {
    let ops = CpuOps;
    let x: Vec<f32> = (0..4 * K)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let mut y = vec![0f32; 4 * N];
    for ty in [
        WeightType::Q2_K,
        WeightType::Q3_K,
        WeightType::Q4_K,
        WeightType::Q5_K,
        WeightType::Q6_K,
        WeightType::IQ2_XXS,
    ] {
        let q = Arc::new(random_stored(ty, &[N, K], &[N], 1));
        let reference = ops
            .matrix(HostWeight::Quant(q.clone()), N, K)
            .expect("placed");
        let fast = KMatrix::new(q).expect("a type of the int8 kernels");
        let mut group = c.benchmark_group(format!("fast_vs_reference_4096x4096_{}", ty.name()));
        for rows in [1, 4] {
            let xr = x[..rows * K].to_vec();
            group.bench_with_input(BenchmarkId::new("reference", rows), &rows, |b, &rows| {
                b.iter(|| black_box(ops.matmul(&xr, rows, &reference).expect("product")))
            });
            group.bench_with_input(BenchmarkId::new("fast", rows), &rows, |b, &rows| {
                b.iter(|| fast.matmul(black_box(&xr), rows, &mut y[..rows * N]))
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = fast;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = fast_vs_reference
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches, fast);
