//! The default model's block-quantized products (SmolLM2-135M: hidden 576,
//! MLP 1536, vocabulary 49,152) for 1 to 4 activation rows: a decode step
//! and MTP verify windows of depth 1 to 3. What a window row costs against
//! a step is what bounds MTP's speed-up on the CPU, and timing the products
//! alone is far steadier than `bench --mtp` on a shared machine.
//!
//! The products run on candle's CPU pool (every core, as in serving) with
//! the ISA `DS4_CPU_KERNELS` selects; each shape is timed with both kernel
//! sets' matrices side by side (`reference`: [`BlockMatrix`], f32
//! activations; `fast`: [`Q8Matrix`], int8 activations).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ds4_engine::backend::cpu::block_matmul::{BlockFormat, BlockMatrix};
use ds4_engine::backend::cpu::q8_matmul::Q8Matrix;

/// A deterministic GGUF-layout matrix: normal-sized scales and minima
/// (no subnormals or NaNs to slow anything down) and pseudo-random quants.
fn matrix(format: BlockFormat, n: usize, k: usize, seed: u64) -> BlockMatrix {
    BlockMatrix::new(&gguf_bytes(format, n, k, seed), format, n, k).expect("sizes match")
}

/// The GGUF bytes of [`matrix`].
fn gguf_bytes(format: BlockFormat, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let blocks = n * k / 32;
    let mut data = Vec::with_capacity(blocks * format.block_bytes());
    for _ in 0..blocks {
        let d = half::f16::from_f32(0.01 + (next() % 100) as f32 * 1e-4);
        data.extend_from_slice(&d.to_bits().to_le_bytes());
        let quants = match format {
            BlockFormat::Q4_1 => {
                let m = half::f16::from_f32(-0.08 + (next() % 100) as f32 * 1e-4);
                data.extend_from_slice(&m.to_bits().to_le_bytes());
                16
            }
            BlockFormat::Q8_0 => 32,
        };
        data.extend((0..quants).map(|_| next() as u8));
    }
    data
}

fn activations(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect()
}

fn bench(c: &mut Criterion) {
    let shapes = [
        ("q4_1_mlp_up_1536x576", BlockFormat::Q4_1, 1536, 576),
        ("q4_1_mlp_down_576x1536", BlockFormat::Q4_1, 576, 1536),
        ("q8_0_output_49152x576", BlockFormat::Q8_0, 49_152, 576),
    ];
    for (name, format, n, k) in shapes {
        let data = gguf_bytes(format, n, k, n as u64 ^ k as u64);
        let w = BlockMatrix::new(&data, format, n, k).expect("sizes match");
        let fast = Q8Matrix::new(&data, format, n, k).expect("sizes match");
        let x = activations(16 * k);
        let mut y = vec![0f32; 16 * n];
        let mut group = c.benchmark_group(name);
        for rows in 1..=4 {
            group.bench_with_input(BenchmarkId::new("reference", rows), &rows, |b, &rows| {
                b.iter(|| w.matmul(black_box(&x[..rows * k]), rows, &mut y[..rows * n]))
            });
            group.bench_with_input(BenchmarkId::new("fast", rows), &rows, |b, &rows| {
                b.iter(|| fast.matmul(black_box(&x[..rows * k]), rows, &mut y[..rows * n]))
            });
        }
        // Continuous batching's decode steps: the fast set at 8 and 16 rows.
        for rows in [8, 16] {
            group.bench_with_input(BenchmarkId::new("fast", rows), &rows, |b, &rows| {
                b.iter(|| fast.matmul(black_box(&x[..rows * k]), rows, &mut y[..rows * n]))
            });
        }
        group.finish();
    }
}

/// A layer's products of one input, as separate calls (one pool dispatch
/// and barrier each) against `matmul_several` (one for all): llama's q / k /
/// v (576, 192, 192 rows) and gate / up (1536 each), for a decode step and
/// a 2-row verify window.
fn bench_several(c: &mut Criterion) {
    let k = 576;
    let sets = [("qkv", vec![576, 192, 192]), ("gate_up", vec![1536, 1536])];
    for (name, widths) in sets {
        let parts: Vec<BlockMatrix> = widths
            .iter()
            .enumerate()
            .map(|(i, &n)| matrix(BlockFormat::Q4_1, n, k, 11 + i as u64))
            .collect();
        let refs: Vec<&BlockMatrix> = parts.iter().collect();
        let x = activations(2 * k);
        let mut ys: Vec<Vec<f32>> = parts.iter().map(|w| vec![0f32; 2 * w.rows()]).collect();
        let mut group = c.benchmark_group(format!("layer_{name}"));
        for rows in [1, 2] {
            group.bench_with_input(BenchmarkId::new("calls", rows), &rows, |b, &rows| {
                b.iter(|| {
                    for (w, y) in parts.iter().zip(ys.iter_mut()) {
                        w.matmul(black_box(&x[..rows * k]), rows, &mut y[..rows * w.rows()]);
                    }
                })
            });
            group.bench_with_input(BenchmarkId::new("one_dispatch", rows), &rows, |b, &rows| {
                b.iter(|| {
                    let mut views: Vec<&mut [f32]> = parts
                        .iter()
                        .zip(ys.iter_mut())
                        .map(|(w, y)| &mut y[..rows * w.rows()])
                        .collect();
                    BlockMatrix::matmul_several(&refs, black_box(&x[..rows * k]), rows, &mut views)
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench, bench_several);
criterion_main!(benches);
