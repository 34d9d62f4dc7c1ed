//! The vector kernels' bodies, written once and compiled twice ([`super::avx2`]
//! with `vpmaddwd` + `vpaddd`, [`super::avx512`] with AVX-512 VNNI's
//! `vpdpwssd` on 256-bit vectors): each module defines `dot(acc, p, sc)` =
//! `acc + Σ pairs p·sc` (i32 lanes, exact either way) and expands
//! [`int8_kernels!`] with its target features.
//!
//! Per super-block and weight row, the block is unpacked once into eight
//! vectors of unsigned bytes in value order (32 values each) and integer
//! scale vectors; per activation row the products are `vpmaddubsw` (byte
//! pairs, i16; no pair exceeds 2 · 63 · 127 = 16002, so nothing saturates)
//! then `dot` against the sub-block scales, the offsets (`u − 32` for Q6_K,
//! `u − 4` for Q3_K) and minima through `bsums` and `vpmaddwd`, one
//! horizontal sum per super-block, then [`super::scalar::step`]'s float
//! operations. IQ2_XXS applies its signs to the activation bytes
//! (`vpsignb`) and multiplies the grid magnitudes.

use crate::quant::dequant::iq2::KSIGNS_IQ2XS;

/// `vpshufb` patterns that spread two sub-block scales of 16 values over
/// one vector of 32 values: bytes `2z` (8 times) then `2z + 1`.
pub(super) const SPREAD: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut z = 0;
    while z < 8 {
        let mut i = 0;
        while i < 16 {
            t[z][i] = (2 * z + i / 8) as u8;
            i += 1;
        }
        z += 1;
    }
    t
};

/// IQ2_XXS sign patterns as `vpsignb` multipliers: byte `j` of entry `i`
/// is −1 where bit `j` of `KSIGNS_IQ2XS[i]` is set, else 1.
pub(super) const SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let mut j = 0;
        while j < 8 {
            let byte: u64 = if (KSIGNS_IQ2XS[i] >> j) & 1 != 0 {
                0xFF
            } else {
                0x01
            };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// The kernels (see the module documentation); expanded where `dot` and
/// the target features are defined.
macro_rules! int8_kernels {
    ($features:literal) => {
        use std::arch::x86_64::*;

        use super::scalar::step;
        use super::simd::{SIGNS, SPREAD};
        use super::{KFormat, QK, RowsView};
        use crate::quant::dequant::iq2::IQ2XXS_GRID;

        /// The little-endian f16 at `p`, widened.
        ///
        /// # Safety
        /// `p` points at two readable bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn f16_at(p: *const u8) -> f32 {
            // SAFETY: forwarded.
            unsafe { half::f16::from_le_bytes([*p, *p.add(1)]).to_f32() }
        }

        /// # Safety
        /// `p` points at 32 readable bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn load(p: *const u8) -> __m256i {
            // SAFETY: forwarded.
            unsafe { _mm256_loadu_si256(p.cast()) }
        }

        /// `(Σ a, Σ b)` over the i32 lanes (wrapping adds: exact whenever the
        /// true sums fit, which the module's bounds guarantee).
        #[inline]
        #[target_feature(enable = $features)]
        fn hsum2(a: __m256i, b: __m256i) -> (i32, i32) {
            let t = _mm256_hadd_epi32(a, b);
            let t = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256::<1>(t));
            let t = _mm_hadd_epi32(t, t);
            (_mm_cvtsi128_si32(t), _mm_extract_epi32::<1>(t))
        }

        /// Q4_K / Q5_K's 12 scale bytes unpacked (`get_scale_min_k4` for the
        /// eight sub-blocks at once, ggml's `utmp` shuffle): `(scales, minima)`,
        /// eight bytes each.
        ///
        /// # Safety
        /// `p` points at 12 readable bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn k4_scales(p: *const u8) -> (u64, u64) {
            const KMASK1: u32 = 0x3f3f_3f3f;
            const KMASK2: u32 = 0x0f0f_0f0f;
            const KMASK3: u32 = 0x0303_0303;
            // SAFETY: 12 bytes.
            let u: [u32; 3] =
                unsafe { std::array::from_fn(|i| p.cast::<u32>().add(i).read_unaligned()) };
            let sc = (u[0] & KMASK1) as u64
                | (((u[2] & KMASK2) | (((u[0] >> 6) & KMASK3) << 4)) as u64) << 32;
            let mn = (u[1] & KMASK1) as u64
                | ((((u[2] >> 4) & KMASK2) | (((u[1] >> 6) & KMASK3) << 4)) as u64) << 32;
            (sc, mn)
        }

        /// Q3_K's 12 scale bytes unpacked to the sixteen 6-bit scales minus 32
        /// (`dequantize_row_q3_K`'s `kmask` shuffle), as i8.
        ///
        /// # Safety
        /// `p` points at 12 readable bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn q3_scales(p: *const u8) -> __m128i {
            const KMASK1: u32 = 0x0303_0303;
            const KMASK2: u32 = 0x0f0f_0f0f;
            // SAFETY: 12 bytes.
            let a: [u32; 3] =
                unsafe { std::array::from_fn(|i| p.cast::<u32>().add(i).read_unaligned()) };
            let tmp = a[2];
            let w = [
                (a[0] & KMASK2) | ((tmp & KMASK1) << 4),
                (a[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
                ((a[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
                ((a[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
            ];
            let v = _mm_set_epi32(w[3] as i32, w[2] as i32, w[1] as i32, w[0] as i32);
            _mm_sub_epi8(v, _mm_set1_epi8(32))
        }

        /// Two scales per vector of 32 values (sub-blocks of 16), from 16 i8
        /// scales.
        #[inline]
        #[target_feature(enable = $features)]
        fn spread16(sc: __m128i, signed: bool) -> [__m256i; 8] {
            std::array::from_fn(|z| {
                // SAFETY: a 16-byte table row.
                let pat = unsafe { _mm_loadu_si128(SPREAD[z].as_ptr().cast()) };
                let b = _mm_shuffle_epi8(sc, pat);
                if signed {
                    _mm256_cvtepi8_epi16(b)
                } else {
                    _mm256_cvtepu8_epi16(b)
                }
            })
        }

        /// `out[r]` = the weight row `w` times activation row `r`.
        ///
        /// # Safety
        /// The CPU has these target features; `w` holds the row's `k / 256`
        /// blocks and `out` the view's rows.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn row(format: KFormat, w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            macro_rules! by_rows {
                ($f:ident) => {
                    match a.rows {
                        1 => $f::<1>(w, a, out),
                        2 => $f::<2>(w, a, out),
                        3 => $f::<3>(w, a, out),
                        _ => $f::<4>(w, a, out),
                    }
                };
            }
            // SAFETY: forwarded.
            unsafe {
                match format {
                    KFormat::Q2K => by_rows!(q2k),
                    KFormat::Q3K => by_rows!(q3k),
                    KFormat::Q4K => by_rows!(q4k),
                    KFormat::Q5K => by_rows!(q5k),
                    KFormat::Q6K => by_rows!(q6k),
                    KFormat::Iq2Xxs => by_rows!(iq2xxs),
                }
            }
        }

        /// Activation row `r`'s quants, `da` and `bsums` (16 i16) of
        /// super-block `b`.
        ///
        /// # Safety
        /// `r < a.rows`, `b < k / 256`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn act(a: &RowsView<'_>, r: usize, b: usize) -> (*const u8, f32, __m256i) {
            // SAFETY: in bounds by the caller's contract.
            unsafe {
                let q = a.q.as_ptr().add(r * a.k + b * QK).cast::<u8>();
                let da = *a.d.get_unchecked(r * (a.k / QK) + b);
                let bs = _mm256_loadu_si256(a.bsums.as_ptr().add(r * a.k / 16 + b * 16).cast());
                (q, da, bs)
            }
        }

        /// `Σ_z dot(maddubs(u[z], q[z]), sc[z])` over the eight vectors.
        ///
        /// # Safety
        /// `q` points at 256 readable bytes.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dots(u: &[__m256i; 8], sc: &[__m256i; 8], q: *const u8) -> __m256i {
            let mut s = _mm256_setzero_si256();
            for z in 0..8 {
                // SAFETY: 32 of the 256 bytes.
                let p = _mm256_maddubs_epi16(u[z], unsafe { load(q.add(32 * z)) });
                s = dot(s, p, sc[z]);
            }
            s
        }

        #[target_feature(enable = $features)]
        unsafe fn q2k<const R: usize>(w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            let m3 = _mm256_set1_epi8(3);
            let m4 = _mm_set1_epi8(0x0F);
            let mut acc = [0f32; R];
            for b in 0..a.k / QK {
                // SAFETY: block `b` of the row (84 bytes); rows of the view.
                unsafe {
                    let blk = w.as_ptr().add(b * 84);
                    let raw = _mm_loadu_si128(blk.cast());
                    let sc = spread16(_mm_and_si128(raw, m4), false);
                    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
                    let (d, dmin) = (f16_at(blk.add(80)), f16_at(blk.add(82)));
                    let mut u = [_mm256_setzero_si256(); 8];
                    for h in 0..2 {
                        let v = load(blk.add(16 + 32 * h));
                        u[4 * h] = _mm256_and_si256(v, m3);
                        u[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<2>(v), m3);
                        u[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m3);
                        u[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16::<6>(v), m3);
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let (q, da, bs) = act(a, r, b);
                        let s = dots(&u, &sc, q);
                        let (sumi, summ) = hsum2(s, _mm256_madd_epi16(mins, bs));
                        *acc = step(KFormat::Q2K, d, dmin, da, sumi, summ, *acc);
                    }
                }
            }
            out[..R].copy_from_slice(&acc);
        }

        #[target_feature(enable = $features)]
        unsafe fn q3k<const R: usize>(w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
            let mut acc = [0f32; R];
            for b in 0..a.k / QK {
                // SAFETY: block `b` of the row (110 bytes); rows of the view.
                unsafe {
                    let blk = w.as_ptr().add(b * 110);
                    let raw = q3_scales(blk.add(96));
                    let sc = spread16(raw, true);
                    let all = _mm256_cvtepi8_epi16(raw);
                    let d = f16_at(blk.add(108));
                    let mut hm = load(blk);
                    let mut u = [_mm256_setzero_si256(); 8];
                    for h in 0..2 {
                        let v = load(blk.add(32 + 32 * h));
                        let low = [
                            v,
                            _mm256_srli_epi16::<2>(v),
                            _mm256_srli_epi16::<4>(v),
                            _mm256_srli_epi16::<6>(v),
                        ];
                        for j in 0..4 {
                            // The high bit of vector `4h + j` is bit
                            // `4h + j` of `hmask`: one shift per vector.
                            let high = _mm256_slli_epi16::<2>(_mm256_and_si256(hm, one));
                            hm = _mm256_srli_epi16::<1>(hm);
                            u[4 * h + j] = _mm256_or_si256(_mm256_and_si256(low[j], m3), high);
                        }
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let (q, da, bs) = act(a, r, b);
                        // Σ sc·(u − 4)·q = Σ sc·u·q − 4 · Σ sc · bsum.
                        let s = dots(&u, &sc, q);
                        let off = _mm256_slli_epi32::<2>(_mm256_madd_epi16(all, bs));
                        let (sumi, _) = hsum2(_mm256_sub_epi32(s, off), _mm256_setzero_si256());
                        *acc = step(KFormat::Q3K, d, 0.0, da, sumi, 0, *acc);
                    }
                }
            }
            out[..R].copy_from_slice(&acc);
        }

        /// Q4_K (`HIGH = false`) and Q5_K (`HIGH = true`).
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn k4<const R: usize, const HIGH: bool>(
            w: &[u8],
            a: &RowsView<'_>,
            out: &mut [f32],
        ) {
            let (m4, one) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(1));
            let (bb, qs) = if HIGH { (176, 48) } else { (144, 16) };
            let format = if HIGH { KFormat::Q5K } else { KFormat::Q4K };
            let mut acc = [0f32; R];
            for b in 0..a.k / QK {
                // SAFETY: block `b` of the row; rows of the view.
                unsafe {
                    let blk = w.as_ptr().add(b * bb);
                    let (d, dmin) = (f16_at(blk), f16_at(blk.add(2)));
                    let (scales, mins) = k4_scales(blk.add(4));
                    let sc: [__m256i; 8] = std::array::from_fn(|s| {
                        _mm256_set1_epi16((scales >> (8 * s)) as u8 as i16)
                    });
                    let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mins as i64));
                    let mut hb = if HIGH {
                        load(blk.add(16))
                    } else {
                        _mm256_setzero_si256()
                    };
                    let mut u = [_mm256_setzero_si256(); 8];
                    for p in 0..4 {
                        let v = load(blk.add(qs + 32 * p));
                        u[2 * p] = _mm256_and_si256(v, m4);
                        u[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    }
                    if HIGH {
                        // Bit `s` of `qh[l]` is the fifth bit of value `l`
                        // of sub-block `s`: one shift per sub-block.
                        for u in u.iter_mut() {
                            let high = _mm256_slli_epi16::<4>(_mm256_and_si256(hb, one));
                            hb = _mm256_srli_epi16::<1>(hb);
                            *u = _mm256_or_si256(*u, high);
                        }
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let (q, da, bs) = act(a, r, b);
                        let s = dots(&u, &sc, q);
                        let bs32 = _mm_hadd_epi16(
                            _mm256_castsi256_si128(bs),
                            _mm256_extracti128_si256::<1>(bs),
                        );
                        let mm = _mm256_set_m128i(_mm_setzero_si128(), _mm_madd_epi16(mins, bs32));
                        let (sumi, summ) = hsum2(s, mm);
                        *acc = step(format, d, dmin, da, sumi, summ, *acc);
                    }
                }
            }
            out[..R].copy_from_slice(&acc);
        }

        #[target_feature(enable = $features)]
        unsafe fn q4k<const R: usize>(w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            // SAFETY: forwarded.
            unsafe { k4::<R, false>(w, a, out) }
        }

        #[target_feature(enable = $features)]
        unsafe fn q5k<const R: usize>(w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            // SAFETY: forwarded.
            unsafe { k4::<R, true>(w, a, out) }
        }

        #[target_feature(enable = $features)]
        unsafe fn q6k<const R: usize>(w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
            let mut acc = [0f32; R];
            for b in 0..a.k / QK {
                // SAFETY: block `b` of the row (210 bytes); rows of the view.
                unsafe {
                    let blk = w.as_ptr().add(b * 210);
                    let raw = _mm_loadu_si128(blk.add(192).cast());
                    let sc = spread16(raw, true);
                    let all = _mm256_cvtepi8_epi16(raw);
                    let d = f16_at(blk.add(208));
                    let mut u = [_mm256_setzero_si256(); 8];
                    for h in 0..2 {
                        let ql0 = load(blk.add(64 * h));
                        let ql1 = load(blk.add(64 * h + 32));
                        let qh = load(blk.add(128 + 32 * h));
                        let hi = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, m2));
                        u[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), hi(qh));
                        u[4 * h + 1] = _mm256_or_si256(
                            _mm256_and_si256(ql1, m4),
                            hi(_mm256_srli_epi16::<2>(qh)),
                        );
                        u[4 * h + 2] = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                            hi(_mm256_srli_epi16::<4>(qh)),
                        );
                        u[4 * h + 3] = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                            hi(_mm256_srli_epi16::<6>(qh)),
                        );
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let (q, da, bs) = act(a, r, b);
                        // Σ sc·(u − 32)·q = Σ sc·u·q − 32 · Σ sc · bsum.
                        let s = dots(&u, &sc, q);
                        let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(all, bs));
                        let (sumi, _) = hsum2(_mm256_sub_epi32(s, off), _mm256_setzero_si256());
                        *acc = step(KFormat::Q6K, d, 0.0, da, sumi, 0, *acc);
                    }
                }
            }
            out[..R].copy_from_slice(&acc);
        }

        #[target_feature(enable = $features)]
        unsafe fn iq2xxs<const R: usize>(w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
            let mut acc = [0f32; R];
            for b in 0..a.k / QK {
                // SAFETY: block `b` of the row (66 bytes); rows of the view;
                // table indices are masked to the tables' lengths.
                unsafe {
                    let blk = w.as_ptr().add(b * 66);
                    let d = f16_at(blk) * 0.125;
                    let mut u = [_mm256_setzero_si256(); 8];
                    let mut sg = [_mm256_setzero_si256(); 8];
                    let mut sc = [_mm256_setzero_si256(); 8];
                    for g in 0..8 {
                        let at = blk.add(2 + 8 * g);
                        let aux1 = at.add(4).cast::<u32>().read_unaligned();
                        let grid =
                            |l: usize| *IQ2XXS_GRID.get_unchecked(*at.add(l) as usize) as i64;
                        let sign = |l: usize| {
                            *SIGNS.get_unchecked(((aux1 >> (7 * l)) & 127) as usize) as i64
                        };
                        u[g] = _mm256_set_epi64x(grid(3), grid(2), grid(1), grid(0));
                        sg[g] = _mm256_set_epi64x(sign(3), sign(2), sign(1), sign(0));
                        sc[g] = _mm256_set1_epi16(2 * (aux1 >> 28) as i16 + 1);
                    }
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let (q, da, _) = act(a, r, b);
                        let mut s = _mm256_setzero_si256();
                        for g in 0..8 {
                            let qs = _mm256_sign_epi8(load(q.add(32 * g)), sg[g]);
                            s = dot(s, _mm256_maddubs_epi16(u[g], qs), sc[g]);
                        }
                        let (sumi, _) = hsum2(s, _mm256_setzero_si256());
                        *acc = step(KFormat::Iq2Xxs, d, 0.0, da, sumi, 0, *acc);
                    }
                }
            }
            out[..R].copy_from_slice(&acc);
        }
    };
}
