//! AVX2/FMA/F16C kernels for [`super::BlockMatrix`].
//!
//! Every output element is computed by one fixed sequence of operations,
//! whichever path produced it (the formula is in `super`): eight lanes
//! accumulate `fma(d·u, x, acc)` over the row in order, then [`finish`]
//! adds the lanes and the minimum's share. The decode path forms `d·u` in
//! registers as it streams the weights; the prefill path forms it once into
//! an L1 buffer and reuses it for every activation row. `d·u` is exact in
//! f32 (an f16 scale times an integer of at most 8 bits), so both paths
//! feed identical values to identical FMAs.

use std::arch::x86_64::*;

use super::{BLOCK, GroupScratch, RowGroup};

/// How far ahead of use the decode path asks for quant bytes. Decode reads
/// every weight once from DRAM; without this the loads wait on memory
/// latency (measured: +10% decode tok/s on the default model). 3072 bytes
/// (about 50 blocks of one row group) beat 768 by 8% (AVX-512) and 10%
/// (AVX2) on a 2-core Xeon whose two threads read 29 GB/s (2026-12-02);
/// 6144 was no faster.
const PREFETCH: usize = 3072;

/// How one format's quants become four vectors of eight unscaled values.
pub(super) trait Quants {
    /// Quant bytes per block.
    const BYTES: usize;
    /// Whether blocks carry a minimum (`d·u + m`).
    const HAS_MIN: bool;
    /// # Safety
    /// `p` points at `Self::BYTES` readable bytes.
    unsafe fn unpack(p: *const u8) -> [__m256; 4];
}

/// Q4_1: 16 bytes; value `i` is the low nibble of byte `i` for `i < 16`,
/// else the high nibble of byte `i - 16`.
pub(super) struct Q4;
/// Q8_0: 32 signed bytes.
pub(super) struct Q8;

impl Quants for Q4 {
    const BYTES: usize = 16;
    const HAS_MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> [__m256; 4] {
        // Each byte widened once to its own 32-bit lane, then the nibbles
        // separated there (as in the AVX-512 path): eleven vector
        // operations for 32 values instead of thirteen, same integers.
        // SAFETY: the caller guarantees 16 readable bytes.
        let packed = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let bytes = [
            _mm256_cvtepu8_epi32(packed),
            _mm256_cvtepu8_epi32(_mm_srli_si128(packed, 8)),
        ];
        let mask = _mm256_set1_epi32(0x0F);
        [
            _mm256_cvtepi32_ps(_mm256_and_si256(bytes[0], mask)),
            _mm256_cvtepi32_ps(_mm256_and_si256(bytes[1], mask)),
            _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes[0], 4)),
            _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes[1], 4)),
        ]
    }
}

impl Quants for Q8 {
    const BYTES: usize = 32;
    const HAS_MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(p: *const u8) -> [__m256; 4] {
        // SAFETY: the caller guarantees 32 readable bytes.
        std::array::from_fn(|i| unsafe {
            let q = _mm_loadl_epi64(p.add(i * 8) as *const __m128i);
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))
        })
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// f16 bits to f32 (exact).
#[target_feature(enable = "avx2,fma,f16c")]
fn f16s_to_f32(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n <= both lengths.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    for (d, &s) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = half::f16::from_bits(s).to_f32();
    }
}

/// Each 32-value block's sum, the same way for every caller.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn block_sums(x: &[f32], sums: &mut [f32]) {
    for (xb, s) in x.chunks_exact(BLOCK).zip(sums.iter_mut()) {
        // SAFETY: `xb` holds 32 values.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(xb.as_ptr().add(i * 8)) });
        *s = hsum(_mm256_add_ps(
            _mm256_add_ps(v[0], v[1]),
            _mm256_add_ps(v[2], v[3]),
        ));
    }
}

/// `hsum(acc) + Σ_b m_b·sx_b` (the second term for formats with minima).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish<Q: Quants>(acc: __m256, mins: &[u16], sx: &[f32]) -> f32 {
    let dot = hsum(acc);
    if Q::HAS_MIN {
        dot + min_share(mins, sx)
    } else {
        dot
    }
}

/// The minima's share of a row's result: one dot product of the row's
/// minima with the activation's block sums, in a fixed order.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn min_share(mins: &[u16], sx: &[f32]) -> f32 {
    let nb = sx.len();
    let mut macc = _mm256_setzero_ps();
    let mut b = 0;
    while b + 8 <= nb {
        // SAFETY: b + 8 <= nb = len of `mins` and `sx`.
        unsafe {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(mins.as_ptr().add(b) as *const __m128i));
            macc = _mm256_fmadd_ps(m, _mm256_loadu_ps(sx.as_ptr().add(b)), macc);
        }
        b += 8;
    }
    let mut share = hsum(macc);
    for (&m, &s) in mins[b..nb].iter().zip(&sx[b..nb]) {
        share += half::f16::from_bits(m).to_f32() * s;
    }
    share
}

/// The `R` rows of `g` times `m` activation rows: `out[r * R + c]`.
///
/// # Safety
/// `g` holds exactly `R` rows whose quants are `Q`'s; `x` is `m` rows of
/// `g.k` values and `sx` their block sums; `out` holds `m * R` values.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows<const R: usize, Q: Quants>(
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
    f16s_to_f32(&g.scales[..R * nb], scales);
    let scales: &[f32] = scales;
    let quants = g.quants.as_ptr();
    if fused {
        // Two activation rows at a time share each unpacked, scaled block
        // in registers (2 × R accumulators + 4 weight vectors fit the 16
        // registers; activations are FMA memory operands).
        let mut r = 0;
        while r < m {
            let n = (m - r).min(2);
            let (xs, sxs) = (&x[r * k..(r + n) * k], &sx[r * nb..(r + n) * nb]);
            let o = &mut out[r * R..(r + n) * R];
            // SAFETY: as this function's contract, for rows r .. r + n.
            unsafe {
                if n == 2 {
                    fused_rows::<R, 2, Q>(g, scales, xs, sxs, o)
                } else {
                    fused_rows::<R, 1, Q>(g, scales, xs, sxs, o)
                }
            }
            r += n;
        }
        return;
    }
    for b in 0..nb {
        for c in 0..R {
            let d = _mm256_set1_ps(scales[b * R + c]);
            // SAFETY: block b of row c is inside the group; the buffer
            // holds R rows of k values.
            unsafe {
                let u = Q::unpack(quants.add((b * R + c) * Q::BYTES));
                let dst = weights.as_mut_ptr().add(c * k + b * BLOCK);
                for (i, u) in u.into_iter().enumerate() {
                    _mm256_storeu_ps(dst.add(i * 8), _mm256_mul_ps(d, u));
                }
            }
        }
    }
    let weights: &[f32] = weights;
    // Two activation rows at a time: each weight vector loaded feeds two
    // FMAs, and 2·R accumulators hide the FMA latency.
    let mut r = 0;
    while r + 2 <= m {
        let (x0, x1) = (&x[r * k..(r + 1) * k], &x[(r + 1) * k..(r + 2) * k]);
        let mut acc0 = [_mm256_setzero_ps(); R];
        let mut acc1 = [_mm256_setzero_ps(); R];
        let mut i = 0;
        while i < k {
            // SAFETY: i + 8 <= k for the rows of x and of the buffer.
            unsafe {
                let xv0 = _mm256_loadu_ps(x0.as_ptr().add(i));
                let xv1 = _mm256_loadu_ps(x1.as_ptr().add(i));
                for c in 0..R {
                    let w = _mm256_loadu_ps(weights.as_ptr().add(c * k + i));
                    acc0[c] = _mm256_fmadd_ps(w, xv0, acc0[c]);
                    acc1[c] = _mm256_fmadd_ps(w, xv1, acc1[c]);
                }
            }
            i += 8;
        }
        for c in 0..R {
            out[r * R + c] = finish::<Q>(acc0[c], g.mins_of(c), &sx[r * nb..(r + 1) * nb]);
            out[(r + 1) * R + c] =
                finish::<Q>(acc1[c], g.mins_of(c), &sx[(r + 1) * nb..(r + 2) * nb]);
        }
        r += 2;
    }
    if r < m {
        let xr = &x[r * k..(r + 1) * k];
        let mut acc = [_mm256_setzero_ps(); R];
        let mut i = 0;
        while i < k {
            // SAFETY: as above.
            unsafe {
                let xv = _mm256_loadu_ps(xr.as_ptr().add(i));
                for (c, a) in acc.iter_mut().enumerate() {
                    let w = _mm256_loadu_ps(weights.as_ptr().add(c * k + i));
                    *a = _mm256_fmadd_ps(w, xv, *a);
                }
            }
            i += 8;
        }
        for (c, a) in acc.into_iter().enumerate() {
            out[r * R + c] = finish::<Q>(a, g.mins_of(c), &sx[r * nb..(r + 1) * nb]);
        }
    }
}

/// `N` activation rows times the `R` rows of `g`, each block's quants
/// unpacked and scaled once in registers and used for every activation
/// row: per output element the same operations in the same order as one
/// row alone.
///
/// # Safety
/// As [`rows`], with `x` holding `N` rows, `sx` their block sums, `scales`
/// the group's `R · k / 32` scales as f32 and `out` `N · R` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fused_rows<const R: usize, const N: usize, Q: Quants>(
    g: &RowGroup,
    scales: &[f32],
    x: &[f32],
    sx: &[f32],
    out: &mut [f32],
) {
    let (k, nb) = (g.k, g.k / BLOCK);
    let quants = g.quants.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); R]; N];
    for b in 0..nb {
        for c in 0..R {
            let at = quants.wrapping_add((b * R + c) * Q::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH) as *const i8);
            // SAFETY: block b of row c is inside the group.
            let u = unsafe { Q::unpack(at) };
            let d = _mm256_set1_ps(scales[b * R + c]);
            let w = u.map(|u| _mm256_mul_ps(d, u));
            for (r, a) in acc.iter_mut().enumerate() {
                for (i, w) in w.iter().enumerate() {
                    // SAFETY: block b of row r of x.
                    let xv = unsafe { _mm256_loadu_ps(x.as_ptr().add(r * k + b * BLOCK + i * 8)) };
                    a[c] = _mm256_fmadd_ps(*w, xv, a[c]);
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
