//! Rounding activation rows to int8 super-blocks of 256 (ggml's Q8_K
//! semantics, with q8_matmul's rounding rule): the definition.

use super::QK;

/// Round `x` (whole super-blocks of 256) into `q`, with per super-block the
/// scale `d` and per 16 values the sums `bsums`.
///
/// `d = amax / 127` (a NaN anywhere in the super-block makes `d` NaN, so
/// products report it), `q_i = round_ties_even(x_i · (1 / d))` clamped to
/// ±127 (0 for a NaN value, and every `q` is 0 when `d` is 0), exactly as
/// [`crate::backend::cpu::q8_matmul::quantize_row_scalar`] rounds a block
/// of 32. `bsums` are `Σ q` over each run of 16 values: at most
/// 16 · 127 = 2032 in magnitude, so they are kept as i16 (exact; the
/// vector kernels multiply them with `vpmaddwd`).
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    debug_assert!(x.len().is_multiple_of(QK) && q.len() == x.len());
    for (b, (xb, qb)) in x.chunks_exact(QK).zip(q.chunks_exact_mut(QK)).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| {
            let v = v.abs();
            if v > a || v.is_nan() { v } else { a }
        });
        let db = amax / 127.0;
        let id = if db != 0.0 { 1.0 / db } else { 0.0 };
        for (qv, &v) in qb.iter_mut().zip(xb) {
            // `as i8` of a NaN is 0.
            *qv = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        d[b] = db;
        for (s, sum) in bsums[b * 16..(b + 1) * 16].iter_mut().enumerate() {
            *sum = qb[16 * s..16 * (s + 1)].iter().map(|&v| v as i16).sum();
        }
    }
}
