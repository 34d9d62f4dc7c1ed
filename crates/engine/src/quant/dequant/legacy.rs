//! GGML's 32-value blocks (`ggml-common.h`, `dequantize_row_*` in
//! `ggml-quants.c`) and GGUF's MXFP4.

use half::f16;

fn h(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `{d: f16, qs[16]}`: `(q − 8)·d`, low nibbles first.
pub(super) fn q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = h(b, 0);
        for j in 0..16 {
            y[j] = ((b[2 + j] & 0xF) as i32 - 8) as f32 * d;
            y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// `{d, m: f16, qs[16]}`: `q·d + m` (`q·d` is exact, so fused or not is the
/// same value).
pub(super) fn q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (h(b, 0), h(b, 2));
        for j in 0..16 {
            y[j] = (b[4 + j] & 0xF) as f32 * d + m;
            y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
        }
    }
}

/// `{d: f16, qh: u32, qs[16]}`: 5-bit `q − 16`, the fifth bits in `qh`.
pub(super) fn q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
        let d = h(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for j in 0..16 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((b[6 + j] & 0xF) as u32 | xh0) as i32 - 16;
            let x1 = ((b[6 + j] >> 4) as u32 | xh1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

/// `{d, m: f16, qh: u32, qs[16]}`: `q·d + m` with 5-bit `q`.
pub(super) fn q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(32)) {
        let (d, m) = (h(b, 0), h(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for j in 0..16 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = (b[8 + j] & 0xF) as u32 | xh0;
            let x1 = (b[8 + j] >> 4) as u32 | xh1;
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }
}

/// `{d: f16, qs: i8[32]}`: `q·d`.
pub(super) fn q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = h(b, 0);
        for j in 0..32 {
            y[j] = (b[2 + j] as i8) as f32 * d;
        }
    }
}

/// GGML's doubled E2M1 values (`kvalues_mxfp4`), paired with half the E8M0
/// scale (`GGML_E8M0_TO_FP32_HALF`): the same products as `e2m1 · 2^(e−127)`.
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `GGML_E8M0_TO_FP32_HALF`: `2^(e − 128)` (subnormal below e = 2).
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        ((e as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// `{e: u8, qs[16]}`: low nibble element `j`, high nibble `j + 16`.
pub(super) fn mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for j in 0..16 {
            y[j] = KVALUES_MXFP4[(b[1 + j] & 0xF) as usize] as f32 * d;
            y[j + 16] = KVALUES_MXFP4[(b[1 + j] >> 4) as usize] as f32 * d;
        }
    }
}

/// `kvalues_iq4nl` (`ggml-common.h`): IQ4_NL's 16 non-linear levels.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `{d: f16, qs[16]}`: `d·kvalues_iq4nl[q]`, low nibble element `j`, high
/// nibble `j + 16` (`dequantize_row_iq4_nl`).
pub(super) fn iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = h(b, 0);
        for j in 0..16 {
            y[j] = d * KVALUES_IQ4NL[(b[2 + j] & 0xF) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(b[2 + j] >> 4) as usize] as f32;
        }
    }
}
