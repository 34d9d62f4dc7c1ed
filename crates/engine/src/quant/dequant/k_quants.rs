//! GGML's 256-value K-quant super-blocks (`ggml-common.h`,
//! `dequantize_row_q*_K` in `ggml-quants.c`).
//!
//! Each value is the reference's own expression, evaluated in its order:
//! a sub-block scale `d · sc` (an f16 times a small integer, exact in f32),
//! then `· q`, then `− m` for the types with a min. Where a step can round
//! (the subtraction of the min; Q6_K's `(d · sc) · q`; Q8_K's f32 scale) the
//! order decides the bits, so it is kept as written. Rust never contracts
//! `a * b - c` into a fused multiply-add, which matches the C code compiled
//! with `-ffp-contract=off` and gguf-py's NumPy dequantizers.

use half::f16;

/// Values per super-block (`QK_K`).
const QK_K: usize = 256;

/// The little-endian f16 at `at`, widened (exact).
fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `{scales[16], qs[64], d, dmin: f16}`: 16 sub-blocks of 16, each scale
/// byte a 4-bit scale (low) and 4-bit min (high); `dl · q − ml`.
pub(super) fn q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(QK_K)) {
        let (scales, qs) = (&b[..16], &b[16..80]);
        let (d, min) = (h(b, 80), h(b, 82));
        for (s, out) in y.chunks_exact_mut(16).enumerate() {
            let dl = d * (scales[s] & 0xF) as f32;
            let ml = min * (scales[s] >> 4) as f32;
            let (q, shift) = q2_sub_block(qs, s);
            // The four values a 2-bit quant can take, each formed exactly
            // as per value (`dl · q − ml`), then looked up.
            let lut: [f32; 4] = std::array::from_fn(|k| dl * k as f32 - ml);
            for (v, &q) in out.iter_mut().zip(q) {
                *v = lut[((q >> shift) & 3) as usize];
            }
        }
    }
}

/// Where sub-block `s` of Q2_K / Q3_K keeps its 2-bit quants: each half of
/// 128 values reads 32 bytes four times (shifts 0, 2, 4, 6), 16 bytes per
/// sub-block.
fn q2_sub_block(qs: &[u8], s: usize) -> (&[u8], u32) {
    let (half, j, part) = (s / 8, (s % 8) / 2, s % 2);
    (&qs[32 * half + 16 * part..][..16], 2 * j as u32)
}

/// `{hmask[32], qs[64], scales[12], d: f16}`: 3-bit quants (two low bits in
/// `qs`, the third in `hmask`, where a clear bit means `− 4`), 16 signed
/// 6-bit scales; `(d · (sc − 32)) · q`.
pub(super) fn q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
        let d_all = h(b, 108);
        for (s, out) in y.chunks_exact_mut(16).enumerate() {
            let dl = d_all * (q3_scale(scales, s) - 32) as f32;
            let (q, shift) = q2_sub_block(qs, s);
            // The high-bit plane advances once per shift, across both halves.
            let m = 1u8 << ((s / 8) * 4 + (s % 8) / 2);
            let hm = &hmask[16 * (s % 2)..][..16];
            for ((v, &q), &hm) in out.iter_mut().zip(q).zip(hm) {
                let q = ((q >> shift) & 3) as i32 - if hm & m != 0 { 0 } else { 4 };
                *v = dl * q as f32;
            }
        }
    }
}

/// Q3_K's 6-bit scale `s` (0..16): the low 4 bits are nibbles of bytes
/// 0..8 (sub-blocks 8..16 in the high nibbles), the high 2 bits pairs of
/// bytes 8..12 (what `dequantize_row_q3_K`'s `kmask` shuffle unpacks).
fn q3_scale(scales: &[u8], s: usize) -> i32 {
    let low = if s < 8 {
        scales[s] & 0xF
    } else {
        scales[s - 8] >> 4
    };
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    (low | (high << 4)) as i32
}

/// `get_scale_min_k4`: Q4_K / Q5_K's 6-bit scale and min of sub-block `j`
/// (0..8), packed in 12 bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `{d, dmin: f16, scales[12], qs[128]}`: 8 sub-blocks of 32, each 64
/// values the low then the high nibbles of 32 bytes; `d1 · q − m1`.
pub(super) fn q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (h(b, 0), h(b, 2));
        let (scales, qs) = (&b[4..16], &b[16..144]);
        for (s, out) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(s, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let shift = 4 * (s % 2);
            for (v, &q) in out.iter_mut().zip(&qs[32 * (s / 2)..][..32]) {
                *v = d1 * ((q >> shift) & 0xF) as f32 - m1;
            }
        }
    }
}

/// `{d, dmin: f16, scales[12], qh[32], qs[128]}`: Q4_K's nibbles plus a
/// fifth bit, bit `s` of `qh[l]` for sub-block `s`; `d1 · q − m1`.
pub(super) fn q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (h(b, 0), h(b, 2));
        let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
        for (s, out) in y.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min_k4(s, scales);
            let (d1, m1) = (d * sc as f32, min * m as f32);
            let shift = 4 * (s % 2);
            let ql = &qs[32 * (s / 2)..][..32];
            for ((v, &ql), &qh) in out.iter_mut().zip(ql).zip(qh) {
                let high = if qh & (1 << s) != 0 { 16 } else { 0 };
                *v = d1 * (((ql >> shift) & 0xF) as i32 + high) as f32 - m1;
            }
        }
    }
}

/// `{ql[128], qh[64], scales: i8[16], d: f16}`: 6-bit quants `− 32` (4 low
/// bits in `ql`, 2 high in `qh`), 16 sub-blocks of 16; `(d · sc) · q`,
/// whose last product rounds, so the order is the reference's.
pub(super) fn q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let d = h(b, 208);
        for (half, out) in y.chunks_exact_mut(128).enumerate() {
            let ql = &b[64 * half..][..64];
            let qh = &b[128 + 32 * half..][..32];
            let sc = &b[192 + 8 * half..][..8];
            // By runs of 16 values sharing a scale, so `d · sc` is formed
            // once per run (the same value) and the run vectorizes.
            for (run, o) in out.chunks_exact_mut(16).enumerate() {
                let (t, l0) = (run / 2, 16 * (run % 2));
                let ds = d * (sc[l0 / 16 + 2 * t] as i8) as f32;
                let (ql, qh) = (&ql[l0 + 32 * (t % 2)..][..16], &qh[l0..][..16]);
                let (sl, sh) = (4 * (t / 2), 2 * t);
                for ((v, &lo), &hi) in o.iter_mut().zip(ql).zip(qh) {
                    let q = (((lo >> sl) & 0xF) | (((hi >> sh) & 3) << 4)) as i32 - 32;
                    *v = ds * q as f32;
                }
            }
        }
    }
}

/// `{d: f32, qs: i8[256], bsums: i16[16]}` (the sums only serve dot
/// products): `d · q`, one rounding product.
pub(super) fn q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(292).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        for (v, &q) in y.iter_mut().zip(&b[4..260]) {
            *v = d * (q as i8) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Q3_K scale unpacking agrees with `dequantize_row_q3_K`'s word
    /// shuffle (`kmask1`/`kmask2` over `aux[0..4]`) for every byte pattern
    /// position.
    #[test]
    fn q3_scales_match_the_kmask_shuffle() {
        let scales: [u8; 12] = [
            0x1F, 0xE2, 0x73, 0x84, 0x95, 0xA6, 0xB7, 0xC8, 0x1B, 0xE4, 0x72, 0x9D,
        ];
        let mut aux = [0u32; 4];
        for (i, w) in aux.iter_mut().take(3).enumerate() {
            *w = u32::from_le_bytes(scales[4 * i..4 * i + 4].try_into().unwrap());
        }
        let (kmask1, kmask2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
        let tmp = aux[2];
        aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
        aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
        aux[0] = (aux[0] & kmask2) | ((tmp & kmask1) << 4);
        aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
        let want: Vec<u8> = aux.iter().flat_map(|w| w.to_le_bytes()).collect();
        for (s, &w) in want.iter().enumerate() {
            assert_eq!(q3_scale(&scales, s), w as i32, "scale {s}");
        }
    }

    /// A Q8_K block is `d · q` with `d` a plain f32.
    #[test]
    fn q8_k_scales_by_its_f32() {
        let mut b = vec![0u8; 292];
        b[..4].copy_from_slice(&0.1f32.to_le_bytes());
        b[4] = (-128i8) as u8;
        b[5] = 127;
        let mut y = [0f32; 256];
        q8_k(&b, &mut y);
        assert_eq!(y[0], 0.1f32 * -128.0);
        assert_eq!(y[1], 0.1f32 * 127.0);
        assert_eq!(y[2], 0.0);
    }
}
