//! [`super::dot4`] with two keys to a 512-bit register (AVX-512F): lanes
//! 0–7 hold one key's eight partial sums and lanes 8–15 the next key's,
//! each lane running the same FMAs in the same order as the 256-bit form,
//! and each half reduced exactly as that form reduces its register. Same
//! bits, half the FMA and f16-conversion instructions: an 8-stream decode
//! of the default model spent 19 % of its time in these score dots.

use std::arch::x86_64::*;

use super::KvElem;

/// The eight values at `p` of two keys side by side (`lo` in lanes 0–7).
#[inline(always)]
unsafe fn pair<E: KvElem>(lo: *const E, hi: *const E) -> __m512 {
    // SAFETY (both arms): the caller guarantees 8 readable elements at
    // `lo` and at `hi`.
    unsafe {
        if E::HALF {
            let l = _mm_loadu_si128(lo as *const __m128i);
            let h = _mm_loadu_si128(hi as *const __m128i);
            _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(l), h, 1))
        } else {
            let l = _mm256_castps_pd(_mm256_loadu_ps(lo as *const f32));
            let h = _mm256_castps_pd(_mm256_loadu_ps(hi as *const f32));
            _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(l), h, 1))
        }
    }
}

/// The 256-bit form's reduction of eight partial sums:
/// `[l0+l4, l1+l5, l2+l6, l3+l7]`, then `(s0+s1) + (s2+s3)`.
#[inline(always)]
fn reduce(v: __m256) -> f32 {
    // SAFETY: AVX (implied by the callers' features).
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let h = _mm_hadd_ps(s, s);
        _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
    }
}

/// `dot` of `a` with each of four keys (all at least `a.len()` long).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) fn dots4<E: KvElem>(a: &[f32], b: [&[E]; 4]) -> [f32; 4] {
    let n = a.len();
    assert!(b.iter().all(|b| b.len() >= n));
    let chunks = n / 8;
    let mut acc = [_mm512_setzero_ps(); 2];
    for c in 0..chunks {
        // SAFETY: c * 8 + 8 <= n <= every length.
        unsafe {
            let av = _mm256_castps_pd(_mm256_loadu_ps(a.as_ptr().add(c * 8)));
            let a2 = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(av), av, 1));
            for (p, acc) in acc.iter_mut().enumerate() {
                let kv = pair(
                    b[2 * p].as_ptr().add(c * 8),
                    b[2 * p + 1].as_ptr().add(c * 8),
                );
                *acc = _mm512_fmadd_ps(a2, kv, *acc);
            }
        }
    }
    std::array::from_fn(|i| {
        let v = acc[i / 2];
        let half = if i % 2 == 0 {
            _mm512_castps512_ps256(v)
        } else {
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))
        };
        let mut total = reduce(half);
        for e in chunks * 8..n {
            total = a[e].mul_add(b[i][e].widen(), total);
        }
        total
    })
}
