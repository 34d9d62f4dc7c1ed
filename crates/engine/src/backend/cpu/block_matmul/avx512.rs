//! AVX-512 kernels for [`super::BlockMatrix`], chosen at run time on CPUs
//! that have AVX-512F (the build targets x86-64-v3, so this path is never
//! assumed). Per output element: for each block, sixteen lanes take
//! `Σ u·x` over the block's values `l` and `l + 16` (one multiply, one
//! FMA), the lanes accumulate `fma(d, that, acc)` over the blocks in order,
//! then they are added in a fixed tree and the minimum's share is added.
//! Scaling once per block instead of once per value saves a quarter of the
//! floating-point work of decode (+7% decode tok/s on the default model;
//! prefill pays 10% for it and stays far ahead). Decode unpacks the quants
//! in registers; prefill unpacks them once into an L1 buffer and reuses
//! them for four activation rows at a time; both run the same operations in
//! the same order, so one-row and window results agree bit for bit.
//! Results differ from the AVX2 path in the last bits (another summation
//! order), which is why one process uses one path for every matrix
//! ([`super::isa`]).

use std::arch::x86_64::*;

use super::avx2::{Q4, Q8, min_share};
use super::{BLOCK, GroupScratch, RowGroup};

/// See the AVX2 path: decode streams every weight once from DRAM.
const PREFETCH: usize = 3072;

/// One format's quants as two vectors of sixteen unscaled values.
pub(super) trait Quants512 {
    const BYTES: usize;
    const HAS_MIN: bool;
    /// # Safety
    /// `p` points at `Self::BYTES` readable bytes; the CPU has AVX-512F.
    unsafe fn unpack(p: *const u8) -> [__m512; 2];
}

impl Quants512 for Q4 {
    const BYTES: usize = 16;
    const HAS_MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> [__m512; 2] {
        // Each byte widened once to its own 32-bit lane, then the low
        // nibble masked and the high one shifted down there: five vector
        // operations for 32 values where masking both nibbles as bytes and
        // widening each took seven. A decode step gained less than that
        // count says (+6% on the 2-core Xeon VM, whose 480 MiB L3, shared
        // with other tenants, may or may not keep the 96 MB model between
        // steps); the extra rows of an MTP verify window, bound by these
        // operations, gained most (bench/README.md). The values are the
        // same integers, so every product keeps its bits.
        // SAFETY: the caller guarantees 16 readable bytes.
        let bytes = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(p as *const __m128i) });
        let lo = _mm512_and_si512(bytes, _mm512_set1_epi32(0x0F));
        let hi = _mm512_srli_epi32(bytes, 4);
        [_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi)]
    }
}

impl Quants512 for Q8 {
    const BYTES: usize = 32;
    const HAS_MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> [__m512; 2] {
        // SAFETY: the caller guarantees 32 readable bytes.
        std::array::from_fn(|i| unsafe {
            let q = _mm_loadu_si128(p.add(i * 16) as *const __m128i);
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))
        })
    }
}

/// # Safety
/// `p` points at 32 readable f32; the CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn load_block(p: *const f32) -> [__m512; 2] {
    // SAFETY: the caller guarantees 32 values.
    unsafe { [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))] }
}

/// `Σ u·x` over one block as sixteen partial sums (scaled by `d` after).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn block_dot(u: [__m512; 2], x: [__m512; 2]) -> __m512 {
    _mm512_fmadd_ps(u[1], x[1], _mm512_mul_ps(u[0], x[0]))
}

/// Lanes added in a fixed tree: halves, then the AVX2 path's 8-lane tree.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    let s = _mm256_add_ps(lo, hi);
    let lo = _mm256_castps256_ps128(s);
    let hi = _mm256_extractf128_ps(s, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn finish<Q: Quants512>(acc: __m512, mins: &[u16], sx: &[f32]) -> f32 {
    let dot = hsum(acc);
    if Q::HAS_MIN {
        dot + min_share(mins, sx)
    } else {
        dot
    }
}

/// The `R` rows of `g` times `m` activation rows: `out[r * R + c]`.
///
/// # Safety
/// The CPU has AVX-512F, AVX2, FMA and F16C; otherwise as
/// [`super::avx2::rows`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(super) unsafe fn rows<const R: usize, Q: Quants512>(
    g: &RowGroup,
    x: &[f32],
    sx: &[f32],
    m: usize,
    fused: bool,
    scratch: &mut GroupScratch,
    out: &mut [f32],
) {
    debug_assert_eq!(g.cols, R);
    let (k, nb) = (g.k, g.k / BLOCK);
    let (scales, weights) = scratch.buffers(R * nb, if fused { 0 } else { R * k });
    for (d, &s) in scales.iter_mut().zip(&g.scales[..R * nb]) {
        *d = half::f16::from_bits(s).to_f32();
    }
    let scales: &[f32] = scales;
    let quants = g.quants.as_ptr();
    if fused {
        // Up to four activation rows share each unpacked block in
        // registers (4 × R accumulators + 4 × 2 activation vectors fit the
        // 32 registers): an MTP verify window pays the unpacking once.
        let mut r = 0;
        while r < m {
            let n = (m - r).min(4);
            let (xs, sxs) = (&x[r * k..(r + n) * k], &sx[r * nb..(r + n) * nb]);
            let o = &mut out[r * R..(r + n) * R];
            // SAFETY: as this function's contract, for rows r .. r + n.
            unsafe {
                match n {
                    4 => fused_rows::<R, 4, Q>(g, scales, xs, sxs, o),
                    3 => fused_rows::<R, 3, Q>(g, scales, xs, sxs, o),
                    2 => fused_rows::<R, 2, Q>(g, scales, xs, sxs, o),
                    _ => fused_rows::<R, 1, Q>(g, scales, xs, sxs, o),
                }
            }
            r += n;
        }
        return;
    }
    for b in 0..nb {
        for c in 0..R {
            // SAFETY: block b of row c is inside the group; the buffer
            // holds R rows of k values.
            unsafe {
                let u = Q::unpack(quants.add((b * R + c) * Q::BYTES));
                let dst = weights.as_mut_ptr().add(c * k + b * BLOCK);
                for (i, u) in u.into_iter().enumerate() {
                    _mm512_storeu_ps(dst.add(i * 16), u);
                }
            }
        }
    }
    let weights: &[f32] = weights;
    // Four activation rows per pass over the buffer (4 × R accumulators,
    // 4 × 2 activation vectors), then pairs, then one: per output element
    // the same operations in the same order whatever the pass.
    let mut r = 0;
    while r < m {
        let n = match m - r {
            4.. => 4,
            2 | 3 => 2,
            _ => 1,
        };
        let (xs, sxs) = (&x[r * k..(r + n) * k], &sx[r * nb..(r + n) * nb]);
        let o = &mut out[r * R..(r + n) * R];
        // SAFETY: as this function's contract, for rows r .. r + n; the
        // buffer holds the group's R rows of k unpacked values.
        unsafe {
            match n {
                4 => buffered_rows::<R, 4, Q>(g, scales, weights, xs, sxs, o),
                2 => buffered_rows::<R, 2, Q>(g, scales, weights, xs, sxs, o),
                _ => buffered_rows::<R, 1, Q>(g, scales, weights, xs, sxs, o),
            }
        }
        r += n;
    }
}

/// `N` activation rows times the `R` rows of `g` from their unpacked
/// weights (`weights`: `R` rows of `k` values): per output element the
/// operations of [`fused_rows`], in the same order.
///
/// # Safety
/// As [`rows`], with `x` holding `N` rows, `sx` their block sums, `scales`
/// the group's `R · k / 32` scales as f32 and `out` `N · R` values.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn buffered_rows<const R: usize, const N: usize, Q: Quants512>(
    g: &RowGroup,
    scales: &[f32],
    weights: &[f32],
    x: &[f32],
    sx: &[f32],
    out: &mut [f32],
) {
    let (k, nb) = (g.k, g.k / BLOCK);
    let mut acc = [[_mm512_setzero_ps(); R]; N];
    for b in 0..nb {
        // SAFETY: block b of each of the N rows of x and of the buffer's
        // R rows.
        unsafe {
            let xv: [[__m512; 2]; N] =
                std::array::from_fn(|r| load_block(x.as_ptr().add(r * k + b * BLOCK)));
            for c in 0..R {
                let u = load_block(weights.as_ptr().add(c * k + b * BLOCK));
                let d = _mm512_set1_ps(*scales.get_unchecked(b * R + c));
                for (a, xr) in acc.iter_mut().zip(&xv) {
                    a[c] = _mm512_fmadd_ps(d, block_dot(u, *xr), a[c]);
                }
            }
        }
    }
    for (r, a) in acc.into_iter().enumerate() {
        for (c, a) in a.into_iter().enumerate() {
            out[r * R + c] = finish::<Q>(a, g.mins_of(c), &sx[r * nb..(r + 1) * nb]);
        }
    }
}

/// `N` activation rows times the `R` rows of `g`, each block's quants
/// unpacked once in registers and used for every activation row: per
/// output element the same operations in the same order as one row alone.
///
/// # Safety
/// As [`rows`], with `x` holding `N` rows, `sx` their block sums, `scales`
/// the group's `R · k / 32` scales as f32 and `out` `N · R` values.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn fused_rows<const R: usize, const N: usize, Q: Quants512>(
    g: &RowGroup,
    scales: &[f32],
    x: &[f32],
    sx: &[f32],
    out: &mut [f32],
) {
    let (k, nb) = (g.k, g.k / BLOCK);
    let quants = g.quants.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); R]; N];
    for b in 0..nb {
        // SAFETY: block b of each of the N rows of x.
        let xv: [[__m512; 2]; N] =
            std::array::from_fn(|r| unsafe { load_block(x.as_ptr().add(r * k + b * BLOCK)) });
        for c in 0..R {
            let at = quants.wrapping_add((b * R + c) * Q::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH) as *const i8);
            // SAFETY: block b of row c is inside the group.
            let u = unsafe { Q::unpack(at) };
            let d = _mm512_set1_ps(scales[b * R + c]);
            for (a, xr) in acc.iter_mut().zip(&xv) {
                a[c] = _mm512_fmadd_ps(d, block_dot(u, *xr), a[c]);
            }
        }
    }
    for (r, a) in acc.into_iter().enumerate() {
        for (c, a) in a.into_iter().enumerate() {
            out[r * R + c] = finish::<Q>(a, g.mins_of(c), &sx[r * nb..(r + 1) * nb]);
        }
    }
}
