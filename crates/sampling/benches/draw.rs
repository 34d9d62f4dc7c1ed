//! One draw of each law over a 248,320-entry row (the Qwen3.8 vocabulary
//! size) with the law's default parameters:
//! nucleus T 0.6 / top_p 0.95 / top_k 20, ds4 T 1.0 / top_k 0 / min_p 0.05.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ds4_sampling::{Law, NumpyPcg64, Sampler, TokenCounts};

const VOCAB: usize = 248_320;

/// A deterministic, LM-like row: a broad Gaussian-ish body and a few peaks.
fn row() -> Vec<f32> {
    let mut rng = NumpyPcg64::from_seed(1);
    let mut row: Vec<f32> = (0..VOCAB)
        .map(|_| {
            // Sum of uniforms: cheap, bell-shaped.
            let s: f64 = (0..4).map(|_| rng.random()).sum();
            ((s - 2.0) * 4.0) as f32
        })
        .collect();
    for i in 0..32 {
        row[(i * 7919) % VOCAB] = 12.0 + i as f32 * 0.1;
    }
    row
}

fn bench(c: &mut Criterion) {
    let row = row();
    let counts = TokenCounts::new();
    for law in [Law::Nucleus, Law::Ds4] {
        let mut sampler = Sampler::new(law, law.default_params(), 42).expect("defaults are valid");
        c.bench_function(&format!("{}_default_draw_248k", law.name()), |b| {
            b.iter(|| sampler.sample(black_box(&row), &counts).expect("valid row"))
        });
    }
    // The default model's vocabulary: a trunk row, and an MTP head row
    // (finite over an 8,192-token subset, -inf elsewhere).
    let small: Vec<f32> = row[..49_152].to_vec();
    let head: Vec<f32> = small
        .iter()
        .enumerate()
        .map(|(i, &x)| if i % 6 == 0 { x } else { f32::NEG_INFINITY })
        .collect();
    let mut sampler = Sampler::new(Law::Nucleus, Law::Nucleus.default_params(), 42).expect("valid");
    c.bench_function("nucleus_distribution_49k", |b| {
        b.iter(|| {
            sampler
                .distribution(black_box(&small), &counts)
                .expect("valid row")
        })
    });
    c.bench_function("nucleus_distribution_49k_head_subset", |b| {
        b.iter(|| {
            sampler
                .distribution(black_box(&head), &counts)
                .expect("valid row")
        })
    });
    let mut params = Law::Nucleus.default_params();
    params.frequency_penalty = 0.5;
    let mut counts = TokenCounts::new();
    for t in 0..200 {
        counts.add(t * 13);
    }
    let mut sampler = Sampler::new(Law::Nucleus, params, 42).expect("valid");
    c.bench_function("nucleus_penalised_draw_248k", |b| {
        b.iter(|| sampler.sample(black_box(&row), &counts).expect("valid row"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
