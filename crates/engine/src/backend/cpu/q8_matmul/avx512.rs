//! AVX-512 VNNI kernels: one output row per i32 lane, `vpdpbusd` over four
//! values at a time (weights as the unsigned operand, the activation's
//! four bytes broadcast as the signed one). The float operations per lane
//! are [`super::scalar`]'s, in its order.

use std::arch::x86_64::*;

use super::{Group, LANES, RowsView};
use crate::backend::cpu::block_matmul::{BLOCK, BlockFormat};

/// Bytes ahead of the quants being read that a decode step asks the cache
/// for (the group streams are sequential, but the hardware prefetcher
/// alone leaves a single-row step short of the memory's bandwidth).
const PREFETCH: usize = 8192;

/// # Safety
/// The CPU has AVX-512 F/BW/VNNI; `g` is a whole group, `a` holds 1..=8
/// rows and `out` at least `a.rows · LANES` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn group_rows(g: &Group<'_>, a: &RowsView<'_>, out: &mut [f32]) {
    debug_assert!(out.len() >= a.rows * LANES);
    // SAFETY: forwarded.
    unsafe {
        match (g.format, a.rows) {
            (BlockFormat::Q4_1, 1) => q4_1::<1>(g, a, out),
            (BlockFormat::Q4_1, 2) => q4_1::<2>(g, a, out),
            (BlockFormat::Q4_1, 3) => q4_1::<3>(g, a, out),
            (BlockFormat::Q4_1, 4) => q4_1::<4>(g, a, out),
            (BlockFormat::Q4_1, 5) => q4_1::<5>(g, a, out),
            (BlockFormat::Q4_1, 6) => q4_1::<6>(g, a, out),
            (BlockFormat::Q4_1, 7) => q4_1::<7>(g, a, out),
            (BlockFormat::Q4_1, _) => q4_1::<8>(g, a, out),
            (BlockFormat::Q8_0, 1) => q8_0::<1>(g, a, out),
            (BlockFormat::Q8_0, 2) => q8_0::<2>(g, a, out),
            (BlockFormat::Q8_0, 3) => q8_0::<3>(g, a, out),
            (BlockFormat::Q8_0, 4) => q8_0::<4>(g, a, out),
            (BlockFormat::Q8_0, 5) => q8_0::<5>(g, a, out),
            (BlockFormat::Q8_0, 6) => q8_0::<6>(g, a, out),
            (BlockFormat::Q8_0, 7) => q8_0::<7>(g, a, out),
            (BlockFormat::Q8_0, _) => q8_0::<8>(g, a, out),
        }
    }
}

/// Four activation bytes (values `4i .. 4i + 4` of a block), broadcast.
#[inline(always)]
unsafe fn quad(q: *const i8, i: usize) -> __m512i {
    // SAFETY: the caller's block holds 32 values.
    unsafe { _mm512_set1_epi32(q.cast::<i32>().add(i).read_unaligned()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_1<const R: usize>(g: &Group<'_>, a: &RowsView<'_>, out: &mut [f32]) {
    let nb = g.blocks;
    let nib = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    let (wq, ws) = (g.quants.as_ptr(), g.scales.as_ptr());
    for b in 0..nb {
        // SAFETY: block `b` of the group: 256 quant bytes (4 lines) and
        // 32 scales; each activation row holds `nb` blocks.
        unsafe {
            let base = wq.add(b * LANES * 16);
            let mut lo = [_mm512_setzero_si512(); 4];
            let mut hi = [_mm512_setzero_si512(); 4];
            for c in 0..4 {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * c).cast());
                let v = _mm512_loadu_si512(base.add(64 * c).cast());
                lo[c] = _mm512_and_si512(v, nib);
                hi[c] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(ws.add(b * 2 * LANES).cast()));
            let mw = _mm512_cvtph_ps(_mm256_loadu_si256(ws.add(b * 2 * LANES + LANES).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let q = a.q.as_ptr().add(r * a.k + b * BLOCK);
                let mut s0 = _mm512_setzero_si512();
                let mut s1 = _mm512_setzero_si512();
                for c in 0..4 {
                    s0 = _mm512_dpbusd_epi32(s0, lo[c], quad(q, 2 * c));
                    s1 = _mm512_dpbusd_epi32(s1, hi[c], quad(q, 2 * c + 1));
                }
                let sumi = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                let da = _mm512_set1_ps(*a.d.get_unchecked(r * nb + b));
                *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), sumi, *acc);
                let sa = _mm512_set1_ps(*a.s.get_unchecked(r * nb + b));
                *acc = _mm512_fmadd_ps(mw, sa, *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: `out` holds `R · LANES` values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(r * LANES), *acc) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0<const R: usize>(g: &Group<'_>, a: &RowsView<'_>, out: &mut [f32]) {
    let nb = g.blocks;
    // `w + 128` as the unsigned operand; the 128·Σq it adds is taken off.
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); R];
    let (wq, ws) = (g.quants.as_ptr(), g.scales.as_ptr());
    for b in 0..nb {
        // SAFETY: block `b` of the group: 512 quant bytes (8 lines) and
        // 16 scales; each activation row holds `nb` blocks.
        unsafe {
            let base = wq.add(b * LANES * 32);
            let mut w = [_mm512_setzero_si512(); 8];
            for (c, w) in w.iter_mut().enumerate() {
                _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + 64 * c).cast());
                *w = _mm512_xor_si512(_mm512_loadu_si512(base.add(64 * c).cast()), flip);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(ws.add(b * LANES).cast()));
            for (r, acc) in acc.iter_mut().enumerate() {
                let q = a.q.as_ptr().add(r * a.k + b * BLOCK);
                let mut s0 = _mm512_setzero_si512();
                let mut s1 = _mm512_setzero_si512();
                for c in (0..8).step_by(2) {
                    s0 = _mm512_dpbusd_epi32(s0, w[c], quad(q, c));
                    s1 = _mm512_dpbusd_epi32(s1, w[c + 1], quad(q, c + 1));
                }
                let offset = _mm512_set1_epi32(128 * *a.qsum.get_unchecked(r * nb + b));
                let sumi = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), offset);
                let da = _mm512_set1_ps(*a.d.get_unchecked(r * nb + b));
                *acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(sumi), *acc);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        // SAFETY: `out` holds `R · LANES` values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(r * LANES), *acc) };
    }
}
