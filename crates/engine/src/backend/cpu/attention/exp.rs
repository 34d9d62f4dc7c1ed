//! `exp` of softmax arguments, many lanes at a time, bit-identical to the
//! scalar `f32::exp` the attention kernel has always used.
//!
//! `f32::exp` is the C library's `expf`. On glibc (2.28 and later; x86_64
//! selects the build compiled with FMA on any CPU with AVX2) that is
//! Szabolcs Nagy's table method, evaluated in double:
//!
//! ```text
//! kd = fma(N/ln2, x, 0x1.8p52)            // round x·N/ln2 to an integer k
//! r  = fma(N/ln2, x, -(kd - 0x1.8p52))    // remainder, |r| <= 1/2
//! s  = asdouble(T[k % 32] + (k << 47))    // 2^(k/N), N = 32
//! y  = fma(fma(C0, r, C1), r·r, fma(C2, r, 1)) · s
//! expf(x) = (float) y
//! ```
//!
//! with glibc's table `T` and coefficients `C` (`__exp2f_data`). Written
//! here with AVX-512 and AVX2 double lanes, it gives the same bits as
//! `expf` for every argument it is used on: every `x` in
//! `[-0x1.9fe368p6, 0]` (below that `expf` returns `+0`, and so does this).
//! That was checked exhaustively against this machine's glibc 2.36 (all
//! 1.1·10⁹ floats of the range; the `#[ignore]`d test
//! `vector_exp_equals_libm_on_every_float` repeats it) and a dense sample
//! is checked on every test run. Arguments outside the range (NaN, `x > 0`:
//! never produced by `s - max`) take the scalar `f32::exp` itself.
//! Softmax spends one `exp` per (query, key); the scalar call was a third of
//! a long prefill.

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
use std::arch::x86_64::*;

/// glibc's `__exp2f_data.tab`: `asuint64(2^(i/32)) - (i << 47)`.
pub(super) const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `N / ln 2` (`invln2_scaled`).
const INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
/// `poly_scaled`: the cubic's coefficients scaled by `N^-3, N^-2, N^-1`.
const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
/// `0x1.8p52`: adding it rounds to an integer held in the low bits.
const SHIFT: f64 = f64::from_bits(0x4338000000000000);
/// `-0x1.9fe368p6 ≈ log(0x1p-150)`: below it `expf` is `+0`.
pub(super) const UNDERFLOW: f32 = f32::from_bits(0xc2cf_f1b4);

/// The algorithm above in scalar code (what the lanes compute; tests).
#[cfg(test)]
pub(super) fn model(x: f32) -> f32 {
    if x < UNDERFLOW {
        return 0.0;
    }
    let xd = x as f64;
    let kd = INV_LN2_N.mul_add(xd, SHIFT);
    let ki = kd.to_bits();
    let kd = kd - SHIFT;
    let r = INV_LN2_N.mul_add(xd, -kd);
    let s = f64::from_bits(TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let y = C0.mul_add(r, C1).mul_add(r * r, C2.mul_add(r, 1.0));
    (y * s) as f32
}

/// `x[i] = x[i].exp()` for every element, bit for bit.
#[inline(always)]
pub(super) fn exp_slice(isa: super::Isa, x: &mut [f32]) {
    match isa {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        // SAFETY: `Isa::Avx512` is only chosen when the CPU has AVX-512F.
        super::Isa::Avx512 => unsafe { exp_avx512(x) },
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        ))]
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        super::Isa::Avx2 => unsafe { exp_avx2(x) },
        _ => x.iter_mut().for_each(|v| *v = v.exp()),
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline]
#[target_feature(enable = "avx512f")]
fn exp_avx512(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: 16 floats in bounds.
        unsafe {
            let v = _mm512_loadu_ps(c.as_ptr());
            // Lanes outside [UNDERFLOW, 0] or NaN: the libm call itself.
            let odd = _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(v, _mm512_setzero_ps());
            if odd != 0 {
                c.iter_mut().for_each(|v| *v = v.exp());
                continue;
            }
            let lo = _mm256_castpd_ps(_mm512_castpd512_pd256(_mm512_castps_pd(v)));
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let a = _mm256_castps_pd(exp8(_mm512_cvtps_pd(lo)));
            let b = _mm256_castps_pd(exp8(_mm512_cvtps_pd(hi)));
            let y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(a), b));
            let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, _mm512_set1_ps(UNDERFLOW));
            let y = _mm512_mask_blend_ps(under, y, _mm512_setzero_ps());
            _mm512_storeu_ps(c.as_mut_ptr(), y);
        }
    }
    chunks
        .into_remainder()
        .iter_mut()
        .for_each(|v| *v = v.exp());
}

/// Eight lanes of the double-precision algorithm.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline]
#[target_feature(enable = "avx512f")]
fn exp8(xd: __m512d) -> __m256 {
    let inv = _mm512_set1_pd(INV_LN2_N);
    let shift = _mm512_set1_pd(SHIFT);
    let kd = _mm512_fmadd_pd(inv, xd, shift);
    let ki = _mm512_castpd_si512(kd);
    let kd = _mm512_sub_pd(kd, shift);
    let r = _mm512_fmsub_pd(inv, xd, kd);
    // T[k % 32]: two 16-entry permutes (index bits 0..3) and bit 4 picks.
    // SAFETY: TABLE holds 32 u64, read as four vectors of eight.
    let (t0, t1, t2, t3) = unsafe {
        let p = TABLE.as_ptr() as *const __m512i;
        (
            _mm512_loadu_si512(p),
            _mm512_loadu_si512(p.add(1)),
            _mm512_loadu_si512(p.add(2)),
            _mm512_loadu_si512(p.add(3)),
        )
    };
    let low = _mm512_permutex2var_epi64(t0, ki, t1);
    let high = _mm512_permutex2var_epi64(t2, ki, t3);
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let t = _mm512_mask_blend_epi64(upper, low, high);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let z = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
    let y = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp_avx2(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: 8 floats in bounds.
        unsafe {
            let v = _mm256_loadu_ps(c.as_ptr());
            let odd = _mm256_cmp_ps::<_CMP_NLE_UQ>(v, _mm256_setzero_ps());
            if _mm256_movemask_ps(odd) != 0 {
                c.iter_mut().for_each(|v| *v = v.exp());
                continue;
            }
            let a = exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            let b = exp4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
            let y = _mm256_set_m128(b, a);
            let under = _mm256_cmp_ps::<_CMP_LT_OQ>(v, _mm256_set1_ps(UNDERFLOW));
            let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
            _mm256_storeu_ps(c.as_mut_ptr(), y);
        }
    }
    chunks
        .into_remainder()
        .iter_mut()
        .for_each(|v| *v = v.exp());
}

/// Four lanes of the double-precision algorithm.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp4(xd: __m256d) -> __m128 {
    let inv = _mm256_set1_pd(INV_LN2_N);
    let shift = _mm256_set1_pd(SHIFT);
    let kd = _mm256_fmadd_pd(inv, xd, shift);
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, shift);
    let r = _mm256_fmsub_pd(inv, xd, kd);
    let index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    // SAFETY: every index is in 0..32, TABLE's length.
    let t = unsafe { _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, index) };
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    let z = _mm256_fmadd_pd(_mm256_set1_pd(C0), r, _mm256_set1_pd(C1));
    let y = _mm256_fmadd_pd(_mm256_set1_pd(C2), r, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r), y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

#[cfg(test)]
mod tests {
    use super::super::Isa;
    use super::*;

    fn sets() -> Vec<Isa> {
        let mut out = vec![Isa::Portable];
        if cfg!(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma"
        )) {
            out.push(Isa::Avx2);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f") {
                out.push(Isa::Avx512);
            }
        }
        out
    }

    /// Every `step`-th float from `-0` down to just past the underflow
    /// threshold, plus the special values, through every kernel set.
    fn check(step: u32) {
        let specials = [
            0.0,
            -0.0,
            UNDERFLOW,
            f32::from_bits(UNDERFLOW.to_bits() + 1),
            f32::NEG_INFINITY,
            -1e30,
            f32::NAN,
            1.5,
            f32::INFINITY,
            -88.5,
            -87.0,
        ];
        let range = (0x8000_0000u32..=0xc2d0_0010).step_by(step as usize);
        let all: Box<dyn Iterator<Item = f32>> =
            Box::new(specials.into_iter().chain(range.map(f32::from_bits)));
        let mut xs = Vec::with_capacity(1 << 20);
        let mut all = all.peekable();
        while all.peek().is_some() {
            xs.clear();
            xs.extend(all.by_ref().take(1 << 20));
            let want: Vec<u32> = xs.iter().map(|x| x.exp().to_bits()).collect();
            for isa in sets() {
                let mut got = xs.clone();
                exp_slice(isa, &mut got);
                for ((x, w), g) in xs.iter().zip(&want).zip(&got) {
                    assert_eq!(*w, g.to_bits(), "{isa:?}: exp({x:e})");
                }
            }
            // The scalar model states the algorithm; it agrees on the range.
            for (x, w) in xs.iter().zip(&want).filter(|(x, _)| **x <= 0.0) {
                assert_eq!(model(*x).to_bits(), *w, "model exp({x:e})");
            }
        }
    }

    #[test]
    fn vector_exp_equals_libm_on_a_dense_sample() {
        // ~1.1M arguments spread over the whole range.
        check(997);
    }

    #[test]
    #[ignore = "exhaustive: ~1.1e9 arguments, a minute or more"]
    fn vector_exp_equals_libm_on_every_float() {
        check(1);
    }
}
