//! Shared helpers of the CUDA tests: the device, random data, comparisons
//! against the CPU with a stated bound, and the row-count invariance check.

use std::ops::Range;
use std::sync::OnceLock;

use ds4_engine::backend::{Backend, CudaOps};

/// The device, opened once per test process (compiling the kernels once).
pub fn gpu() -> CudaOps {
    static GPU: OnceLock<CudaOps> = OnceLock::new();
    GPU.get_or_init(|| {
        let start = std::time::Instant::now();
        let g = CudaOps::new(0)
            .unwrap_or_else(|e| panic!("these tests need a usable CUDA device: {e}"));
        let (origin, compile) = g.kernels_origin();
        println!(
            "REPORT device={} arch={} kernels_from=\"{origin}\" nvrtc_s={compile:.2} open_s={:.2}",
            g.device_name(),
            g.arch(),
            start.elapsed().as_secs_f64()
        );
        g
    })
    .clone()
}

/// `n` values in [-1, 1) from a fixed xorshift stream.
pub fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub fn up(g: &CudaOps, v: &[f32]) -> <CudaOps as Backend>::Buf {
    g.upload(v).unwrap()
}

pub fn down(g: &CudaOps, b: &<CudaOps as Backend>::Buf) -> Vec<f32> {
    g.download(b).unwrap()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `max |g − c| / max |c|` (0 when both are all zero).
pub fn rel(g: &[f32], c: &[f32]) -> f64 {
    assert_eq!(g.len(), c.len(), "lengths");
    let num = g
        .iter()
        .zip(c)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0f64, f64::max);
    let den = c.iter().map(|b| (*b as f64).abs()).fold(0f64, f64::max);
    if num == 0.0 {
        0.0
    } else {
        num / den.max(1e-30)
    }
}

/// Compare a GPU result with the CPU's: the relative bound must hold, and
/// with `exact` every bit must match. Prints one report line.
#[track_caller]
pub fn check(op: &str, g: &[f32], c: &[f32], bound: f64, exact: bool) {
    assert_eq!(g.len(), c.len(), "{op}: lengths");
    assert!(!c.is_empty(), "{op}: an empty comparison proves nothing");
    assert!(
        g.iter().all(|v| v.is_finite()),
        "{op}: non-finite GPU values"
    );
    let r = rel(g, c);
    let same = g
        .iter()
        .zip(c)
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count();
    println!(
        "REPORT op={op} n={} max_rel={r:.3e} bound={bound:.0e} identical_bits={same}/{} exact_required={exact}",
        c.len(),
        c.len()
    );
    assert!(
        r <= bound,
        "{op}: max relative difference {r:e} > {bound:e}"
    );
    if exact {
        assert_eq!(same, c.len(), "{op}: bits differ from the CPU");
    }
}

/// The GPU result for rows `0..rows` must have the same bits whether the
/// rows run in one call, one at a time, in two uneven chunks, or again.
#[track_caller]
pub fn rows_invariant(op: &str, rows: usize, f: impl Fn(Range<usize>) -> Vec<f32>) {
    assert!(rows >= 3, "{op}: too few rows to split");
    let all = f(0..rows);
    let singles: Vec<f32> = (0..rows).flat_map(|r| f(r..r + 1)).collect();
    let cut = rows / 3 + 1;
    let mut chunks = f(0..cut);
    chunks.extend(f(cut..rows));
    let again = f(0..rows);
    assert_eq!(bits(&singles), bits(&all), "{op}: one row at a time");
    assert_eq!(bits(&chunks), bits(&all), "{op}: two chunks");
    assert_eq!(bits(&again), bits(&all), "{op}: a second run");
    println!(
        "REPORT op={op} rows_invariant=1x{rows},{rows}x1,{cut}+{},repeat",
        rows - cut
    );
}
