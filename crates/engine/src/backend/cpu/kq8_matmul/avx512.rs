//! AVX-512 VNNI kernels: [`super::simd`]'s bodies with `dot` = `vpdpwssd`
//! (AVX512_VNNI with VL, on 256-bit vectors: the unpacking is AVX2's, the
//! accumulation one instruction instead of two). Same integers, same bits.

use std::arch::x86_64::{__m256i, _mm256_dpwssd_epi32};

/// Whether the CPU runs these kernels (checked once).
pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    })
}

/// `acc + Σ pairs p·sc` per i32 lane (non-saturating).
#[inline]
#[target_feature(enable = "avx512f,avx512vl,avx512vnni")]
fn dot(acc: __m256i, p: __m256i, sc: __m256i) -> __m256i {
    _mm256_dpwssd_epi32(acc, p, sc)
}

int8_kernels!("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c");
