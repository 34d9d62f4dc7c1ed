//! AVX2 kernels (x86-64-v3, the build baseline): [`super::simd`]'s bodies
//! with `dot` = `vpmaddwd` then `vpaddd`.

use std::arch::x86_64::{__m256i, _mm256_add_epi32, _mm256_madd_epi16};

/// `acc + Σ pairs p·sc` per i32 lane.
#[inline]
#[target_feature(enable = "avx2")]
fn dot(acc: __m256i, p: __m256i, sc: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc))
}

int8_kernels!("avx2,fma,f16c");
