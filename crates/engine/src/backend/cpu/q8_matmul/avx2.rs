//! AVX2 kernels: one output row per i32 lane, eight lanes per register (a
//! group is two halves), `vpmaddubsw` products summed exactly. The float
//! operations per lane are [`super::scalar`]'s, in its order.
//!
//! `vpmaddubsw` saturates its i16 pair sums, so the bounds matter: Q4_1
//! pairs are at most 2·15·127 = 3810 and eight of them (16 values) are
//! summed in i16 (≤ 30480) before widening; Q8_0 runs `|w| · (q·sign w)`,
//! pairs at most 2·128·127 = 32512, widened at once. Activation quants
//! are within ±127 ([`super::quantize_row`] clamps), so nothing saturates.

use std::arch::x86_64::*;

use super::{Group, LANES, RowsView};
use crate::backend::cpu::block_matmul::{BLOCK, BlockFormat};

/// Activation rows per pass (sixteen registers).
const PASS: usize = 2;

/// Bytes ahead of the quants being read that a pass asks the cache for
/// (as the AVX-512 kernels; the group streams are sequential).
const PREFETCH: usize = 8192;

/// # Safety
/// The CPU has AVX2/FMA/F16C (the build baseline); `g` is a whole group,
/// `a` holds 1..=4 rows and `out` at least `a.rows · LANES` values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_rows(g: &Group<'_>, a: &RowsView<'_>, out: &mut [f32]) {
    debug_assert!(out.len() >= a.rows * LANES);
    let mut r = 0;
    while r < a.rows {
        let rows = PASS.min(a.rows - r);
        for half in 0..2 {
            // SAFETY: forwarded; row `r` onwards of the view.
            unsafe {
                match (g.format, rows) {
                    (BlockFormat::Q4_1, 1) => q4_1::<1>(g, a, r, half, out),
                    (BlockFormat::Q4_1, _) => q4_1::<2>(g, a, r, half, out),
                    (BlockFormat::Q8_0, 1) => q8_0::<1>(g, a, r, half, out),
                    (BlockFormat::Q8_0, _) => q8_0::<2>(g, a, r, half, out),
                }
            }
        }
        r += rows;
    }
}

/// Four activation bytes (values `4i .. 4i + 4` of a block), broadcast.
#[inline(always)]
unsafe fn quad(q: *const i8, i: usize) -> __m256i {
    // SAFETY: the caller's block holds 32 values.
    unsafe { _mm256_set1_epi32(q.cast::<i32>().add(i).read_unaligned()) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1<const R: usize>(
    g: &Group<'_>,
    a: &RowsView<'_>,
    r0: usize,
    half: usize,
    out: &mut [f32],
) {
    let nb = g.blocks;
    let nib = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let (wq, ws) = (g.quants.as_ptr(), g.scales.as_ptr());
    for b in 0..nb {
        // SAFETY: block `b` of the group (256 quant bytes, 32 scales); the
        // rows hold `nb` blocks each.
        unsafe {
            let base = wq.add(b * LANES * 16 + 32 * half);
            let mut lo = [_mm256_setzero_si256(); 4];
            let mut hi = [_mm256_setzero_si256(); 4];
            for c in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * c).cast());
                let v = _mm256_loadu_si256(base.add(64 * c).cast());
                lo[c] = _mm256_and_si256(v, nib);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nib);
            }
            let sc = ws.add(b * 2 * LANES + 8 * half);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(sc.cast()));
            let mw = _mm256_cvtph_ps(_mm_loadu_si128(sc.add(LANES).cast()));
            for (i, acc) in acc.iter_mut().enumerate() {
                let r = r0 + i;
                let q = a.q.as_ptr().add(r * a.k + b * BLOCK);
                let mut p = _mm256_maddubs_epi16(lo[0], quad(q, 0));
                p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi[0], quad(q, 1)));
                for c in 1..4 {
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(lo[c], quad(q, 2 * c)));
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi[c], quad(q, 2 * c + 1)));
                }
                let sumi = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                let da = _mm256_set1_ps(*a.d.get_unchecked(r * nb + b));
                *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), sumi, *acc);
                let sa = _mm256_set1_ps(*a.s.get_unchecked(r * nb + b));
                *acc = _mm256_fmadd_ps(mw, sa, *acc);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: `out` holds the view's rows · LANES values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add((r0 + i) * LANES + 8 * half), *acc) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0<const R: usize>(
    g: &Group<'_>,
    a: &RowsView<'_>,
    r0: usize,
    half: usize,
    out: &mut [f32],
) {
    let nb = g.blocks;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    let (wq, ws) = (g.quants.as_ptr(), g.scales.as_ptr());
    for b in 0..nb {
        // SAFETY: block `b` of the group (512 quant bytes, 16 scales); the
        // rows hold `nb` blocks each.
        unsafe {
            let base = wq.add(b * LANES * 32 + 32 * half);
            let mut w = [_mm256_setzero_si256(); 8];
            for (c, w) in w.iter_mut().enumerate() {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * c).cast());
                *w = _mm256_loadu_si256(base.add(64 * c).cast());
            }
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(ws.add(b * LANES + 8 * half).cast()));
            for (i, acc) in acc.iter_mut().enumerate() {
                let r = r0 + i;
                let q = a.q.as_ptr().add(r * a.k + b * BLOCK);
                let mut s = _mm256_setzero_si256();
                for (c, &w) in w.iter().enumerate() {
                    let p =
                        _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(quad(q, c), w));
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(p, ones));
                }
                let da = _mm256_set1_ps(*a.d.get_unchecked(r * nb + b));
                *acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(s), *acc);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        // SAFETY: `out` holds the view's rows · LANES values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add((r0 + i) * LANES + 8 * half), *acc) };
    }
}
