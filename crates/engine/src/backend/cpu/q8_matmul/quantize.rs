//! Rounding activation rows to int8 blocks: the set's definition
//! ([`quantize_row_scalar`]) and vector versions that give its bytes
//! exactly (max of absolute values, one IEEE division and reciprocal, one
//! multiply and round-to-nearest-even per value: no step depends on the
//! order of evaluation). A block holding a NaN or an infinity takes the
//! scalar path, so even those blocks have one answer.

use crate::backend::cpu::block_matmul::BLOCK;

/// Round `x` (whole blocks of 32) into `q`, with per block `d`, `Σ q` and
/// `d · Σ q`, using the widest code the CPU runs (same bytes everywhere).
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], qsum: &mut [i32], s: &mut [f32]) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        if super::kernels() == super::Q8Kernels::Avx512Vnni {
            // SAFETY: chosen only where AVX-512 F/BW are present.
            return unsafe { avx512::quantize_row(x, q, d, qsum, s) };
        }
        // SAFETY: AVX2 is the build baseline.
        unsafe { avx2::quantize_row(x, q, d, qsum, s) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    quantize_row_scalar(x, q, d, qsum, s)
}

/// The definition, one value at a time: `d = amax / 127` (a NaN anywhere
/// in the block makes `d` NaN, so products report it), `q_i =
/// round_ties_even(x_i · (1 / d))` clamped to ±127 (0 for a NaN value).
pub fn quantize_row_scalar(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    qsum: &mut [i32],
    s: &mut [f32],
) {
    for (b, (xb, qb)) in x
        .chunks_exact(BLOCK)
        .zip(q.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        let (db, sum) = block_scalar(xb, qb);
        d[b] = db;
        qsum[b] = sum;
        s[b] = db * sum as f32;
    }
}

fn block_scalar(xb: &[f32], qb: &mut [i8]) -> (f32, i32) {
    let amax = xb.iter().fold(0f32, |a, v| {
        let v = v.abs();
        if v > a || v.is_nan() { v } else { a }
    });
    let db = amax / 127.0;
    let id = if db != 0.0 { 1.0 / db } else { 0.0 };
    let mut sum = 0i32;
    for (qv, &v) in qb.iter_mut().zip(xb) {
        // `as i8` of a NaN is 0.
        *qv = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        sum += *qv as i32;
    }
    (db, sum)
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{BLOCK, block_scalar};

    /// # Safety
    /// The CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row(
        x: &[f32],
        q: &mut [i8],
        d: &mut [f32],
        qsum: &mut [i32],
        s: &mut [f32],
    ) {
        let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
        let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
        for (b, (xb, qb)) in x
            .chunks_exact(BLOCK)
            .zip(q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            // SAFETY: a block is 32 values.
            let (x0, x1) = unsafe {
                (
                    _mm512_loadu_ps(xb.as_ptr()),
                    _mm512_loadu_ps(xb.as_ptr().add(16)),
                )
            };
            let a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask));
            let a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), abs_mask));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
            let db = amax / 127.0;
            let id = if db != 0.0 { 1.0 / db } else { 0.0 };
            let (db, sum) = if !amax.is_finite()
                || !id.is_finite()
                || _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x0, x1) != 0
            {
                // NaN, infinity, or a scale too small to invert: the
                // definition's own path.
                block_scalar(xb, qb)
            } else {
                let id = _mm512_set1_ps(id);
                // Round to nearest even (the default rounding mode).
                let q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
                let q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
                let q0 = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
                let q1 = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
                // SAFETY: 32 bytes of `qb`.
                unsafe {
                    _mm_storeu_si128(qb.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q0));
                    _mm_storeu_si128(qb.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(q1));
                }
                (db, _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)))
            };
            d[b] = db;
            qsum[b] = sum;
            s[b] = db * sum as f32;
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK, block_scalar};

    /// # Safety
    /// The CPU has AVX2 (the build baseline).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_row(
        x: &[f32],
        q: &mut [i8],
        d: &mut [f32],
        qsum: &mut [i32],
        s: &mut [f32],
    ) {
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
        for (b, (xb, qb)) in x
            .chunks_exact(BLOCK)
            .zip(q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            // SAFETY: a block is 32 values.
            let xs: [__m256; 4] =
                std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * i)) });
            let mut m = _mm256_and_ps(xs[0], abs_mask);
            let mut unord = _mm256_cmp_ps::<_CMP_UNORD_Q>(xs[0], xs[0]);
            for &v in &xs[1..] {
                m = _mm256_max_ps(m, _mm256_and_ps(v, abs_mask));
                unord = _mm256_or_ps(unord, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            }
            let mut lanes = [0f32; 8];
            // SAFETY: 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
            let amax = lanes.iter().fold(0f32, |a, &v| a.max(v));
            let db = amax / 127.0;
            let id = if db != 0.0 { 1.0 / db } else { 0.0 };
            let (db, sum) =
                if !amax.is_finite() || !id.is_finite() || _mm256_movemask_ps(unord) != 0 {
                    block_scalar(xb, qb)
                } else {
                    let id = _mm256_set1_ps(id);
                    let mut total = _mm256_setzero_si256();
                    let mut bytes = [0i32; 32];
                    for (i, &v) in xs.iter().enumerate() {
                        let qi = _mm256_cvtps_epi32(_mm256_mul_ps(v, id));
                        let qi = _mm256_min_epi32(_mm256_max_epi32(qi, lo), hi);
                        total = _mm256_add_epi32(total, qi);
                        // SAFETY: 8 of the 32 values.
                        unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().add(8 * i).cast(), qi) };
                    }
                    for (qv, &v) in qb.iter_mut().zip(&bytes) {
                        *qv = v as i8;
                    }
                    let mut t = [0i32; 8];
                    // SAFETY: 8 lanes.
                    unsafe { _mm256_storeu_si256(t.as_mut_ptr().cast(), total) };
                    (db, t.iter().sum())
                };
            d[b] = db;
            qsum[b] = sum;
            s[b] = db * sum as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Quantizer = dyn Fn(&[f32], &mut [i8], &mut [f32], &mut [i32], &mut [f32]);

    #[test]
    fn vector_rounding_gives_the_definitions_bytes() {
        let mut r = crate::quant::random::Rng::new(5);
        let k = 32 * 40;
        let mut x: Vec<f32> = (0..k)
            .map(|i| {
                let v = r.unit() * 2.0 - 1.0;
                match i % 7 {
                    0 => v * 1e6,
                    1 => v * 1e-30,
                    _ => v,
                }
            })
            .collect();
        // Ties, zeros, a NaN, infinities, the largest float.
        x[0] = 0.5;
        x[1] = 127.0;
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        x[70] = f32::NAN;
        x[100] = f32::INFINITY;
        x[140] = f32::NEG_INFINITY;
        x[200] = f32::MAX;
        x[230] = -2.5;
        x[231] = 2.5;
        // A block of subnormals whose scale has no finite reciprocal.
        for (i, v) in x[256..288].iter_mut().enumerate() {
            *v = f32::from_bits(1 + i as u32 % 3) * if i % 2 == 0 { 1.0 } else { -1.0 };
        }
        let nb = k / BLOCK;
        let run = |f: &Quantizer| {
            let (mut q, mut d, mut qs, mut s) =
                (vec![0i8; k], vec![0f32; nb], vec![0i32; nb], vec![0f32; nb]);
            f(&x, &mut q, &mut d, &mut qs, &mut s);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (q, bits(&d), qs, bits(&s))
        };
        let want = run(&quantize_row_scalar);
        assert!(f32::from_bits(want.1[2]).is_nan(), "the NaN reaches d");
        assert_eq!(run(&quantize_row), want);
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        {
            // SAFETY: AVX2 is the build baseline.
            assert_eq!(
                run(&|x, q, d, qs, s| unsafe { avx2::quantize_row(x, q, d, qs, s) }),
                want
            );
            if std::arch::is_x86_feature_detected!("avx512bw") {
                // SAFETY: checked just above.
                assert_eq!(
                    run(&|x, q, d, qs, s| unsafe { avx512::quantize_row(x, q, d, qs, s) }),
                    want
                );
            }
        }
    }
}
