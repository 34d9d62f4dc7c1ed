//! AVX-512 VNNI kernels: [`super::simd`]'s bodies with `dot` = `vpdpwssd`
//! (AVX512_VNNI with VL, on 256-bit vectors: the unpacking is AVX2's, the
//! accumulation one instruction instead of two). Same integers, same bits.

use std::arch::x86_64::{__m256i, _mm256_dpwssd_epi32};

/// `acc + Σ pairs p·sc` per i32 lane (non-saturating).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
fn dot(acc: __m256i, p: __m256i, sc: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, sc)
}

int8_kernels!("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c");
