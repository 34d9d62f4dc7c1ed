//! The 32-value block types (`quantize_row_q{4,5}_{0,1}_ref`,
//! `quantize_row_q8_0_ref`, `quantize_row_mxfp4_ref`, and with importance
//! `quantize_row_q{4,5}_{0,1}_impl`), one row at a time.
//!
//! The `_ref` paths round with C float-to-integer casts (`(int8_t)(x +
//! 8.5f)`, `roundf`), not `nearest_int`; a scale whose reciprocal overflows
//! (an all-subnormal block) sends inf/NaN into those casts, which x86-64
//! turns into `INT_MIN` and so the low byte 0 ([`cvtt`]). The importance
//! paths weigh each value by `qw · sqrt(σ² + x²)` with σ² the mean square of
//! the *whole row* (the K-quants use their super-block's instead).

use super::scalar::{c_max, cvtt, fp16_bits};
use super::search::{MinMaxSearch, make_qkx_quants, make_qx_quants};

const QK: usize = 32;

/// `(int8_t)f` then `MIN(hi, ·)` into a `uint8_t`, as the `_ref` paths write
/// each level.
fn level_i8(f: f32, hi: i32) -> u8 {
    hi.min(cvtt(f) as i8 as i32) as u8
}

/// `{d, qs[16]}`, levels `0..=15` for `x/d + 8` with `d = max / -8` (`max`
/// the value of largest magnitude, so it maps to level 0).
pub(super) fn q4_0(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let max = signed_absmax(b);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&fp16_bits(d).to_le_bytes());
        for j in 0..QK / 2 {
            let xi0 = level_i8(b[j] * id + 8.5, 15);
            let xi1 = level_i8(b[QK / 2 + j] * id + 8.5, 15);
            out.push(xi0 | (xi1 << 4));
        }
    }
}

/// `{d, m, qs[16]}`, levels `0..=15` for `(x − min)/d`, `d = (max − min)/15`.
pub(super) fn q4_1(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let (min, max) = min_max(b);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&fp16_bits(d).to_le_bytes());
        out.extend_from_slice(&fp16_bits(min).to_le_bytes());
        for j in 0..QK / 2 {
            let xi0 = level_i8((b[j] - min) * id + 0.5, 15);
            let xi1 = level_i8((b[QK / 2 + j] - min) * id + 0.5, 15);
            out.push(xi0 | (xi1 << 4));
        }
    }
}

/// `{d, qh[4], qs[16]}`, levels `0..=31` for `x/d + 16`, `d = max / -16`.
pub(super) fn q5_0(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let max = signed_absmax(b);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut l = [0u8; QK];
        for j in 0..QK {
            l[j] = level_i8(b[j] * id + 16.5, 31);
        }
        push_q5(fp16_bits(d), None, &l, out);
    }
}

/// `{d, m, qh[4], qs[16]}`, levels for `(x − min)/d`, `d = (max − min)/31`;
/// the cast is `(uint8_t)` with no clamp (the largest value lands on 31 by
/// construction).
pub(super) fn q5_1(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let (min, max) = min_max(b);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut l = [0u8; QK];
        for j in 0..QK {
            l[j] = cvtt((b[j] - min) * id + 0.5) as u8;
        }
        push_q5(fp16_bits(d), Some(fp16_bits(min)), &l, out);
    }
}

/// `{d, qs[32]}`: `roundf(x/d)` (ties away from zero) as `int8_t`, `d =
/// amax/127`. Q8_0 has no importance path (`quantize_q8_0` ignores it).
pub(super) fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let mut amax = 0.0f32;
        for &v in b {
            amax = c_max(amax, v.abs());
        }
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend_from_slice(&fp16_bits(d).to_le_bytes());
        out.extend(b.iter().map(|&v| cvtt((v * id).round()) as u8));
    }
}

/// GGML's doubled E2M1 values (`kvalues_mxfp4`).
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `{e, qs[16]}`: the E8M0 exponent `floor(log2 amax) − 2 + 127` (so the
/// largest value lands near the top of the doubled table, scaled by half
/// the exponent's power), each value the nearest table entry (first on
/// ties). No importance path (`quantize_mxfp4` ignores it). `log2f` is the
/// platform's libm, as in the C.
pub(super) fn mxfp4(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK) {
        let mut amax = 0.0f32;
        for &v in b {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        let e = if amax > 0.0 {
            cvtt(amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        // `GGML_E8M0_TO_FP32_HALF`: 2^(e − 128), subnormal for e < 2.
        let d = f32::from_bits(if e < 2 {
            0x0020_0000 << e
        } else {
            (e as u32 - 1) << 23
        });
        out.push(e);
        let best = |v: f32| {
            let mut best_index = 0u8;
            let mut best_err = (KVALUES_MXFP4[0] as f32 * d - v).abs();
            for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
                let err = (k as f32 * d - v).abs();
                if err < best_err {
                    best_index = i as u8;
                    best_err = err;
                }
            }
            best_index
        };
        for j in 0..QK / 2 {
            out.push(best(b[j]) | (best(b[QK / 2 + j]) << 4));
        }
    }
}

/// `quantize_row_q4_0_impl` / `q5_0_impl`: [`make_qx_quants`] per block
/// with `nmax` 8 or 16 and the row's σ²-weighted importance.
pub(super) fn q4_0_imatrix(x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    let sigma2 = row_sigma2(x);
    for (b, q) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)) {
        let weight = weights(b, q, sigma2);
        let mut l = [0i8; QK];
        let d = make_qx_quants(8, b, &mut l, Some(&weight));
        out.extend_from_slice(&fp16_bits(d).to_le_bytes());
        for j in 0..QK / 2 {
            out.push(l[j] as u8 | ((l[j + 16] as u8) << 4));
        }
    }
}

pub(super) fn q5_0_imatrix(x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    let sigma2 = row_sigma2(x);
    for (b, q) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)) {
        let weight = weights(b, q, sigma2);
        let mut l = [0i8; QK];
        let d = make_qx_quants(16, b, &mut l, Some(&weight));
        push_q5(fp16_bits(d), None, &l.map(|v| v as u8), out);
    }
}

/// `quantize_row_q4_1_impl` / `q5_1_impl`: [`make_qkx_quants`] (as
/// `make_qkx3_quants`: 37 trial scales from `nmax − 0.9` by 0.05) per block.
pub(super) fn q4_1_imatrix(x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    let sigma2 = row_sigma2(x);
    for (b, q) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)) {
        let weight = weights(b, q, sigma2);
        let (mut l, mut laux) = ([0u8; QK], [0u8; QK]);
        let (d, min) = make_qkx_quants(15, b, &weight, &mut l, &mut laux, &QKX3);
        out.extend_from_slice(&fp16_bits(d).to_le_bytes());
        out.extend_from_slice(&fp16_bits(-min).to_le_bytes());
        for j in 0..QK / 2 {
            out.push(l[j] | (l[j + 16] << 4));
        }
    }
}

pub(super) fn q5_1_imatrix(x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    let sigma2 = row_sigma2(x);
    for (b, q) in x.chunks_exact(QK).zip(qw.chunks_exact(QK)) {
        let weight = weights(b, q, sigma2);
        let (mut l, mut laux) = ([0u8; QK], [0u8; QK]);
        let (d, min) = make_qkx_quants(31, b, &weight, &mut l, &mut laux, &QKX3);
        push_q5(fp16_bits(d), Some(fp16_bits(-min)), &l, out);
    }
}

/// The trial scales every `_impl` passes to `make_qkx3_quants`.
pub(super) const QKX3: MinMaxSearch = MinMaxSearch {
    rmin: -0.9,
    rdelta: 0.05,
    nstep: 36,
    use_mad: false,
};

/// `sum(x²)/n_per_row` over the whole row, summed in order.
fn row_sigma2(x: &[f32]) -> f32 {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    sum_x2 / x.len() as f32
}

/// `qw[j] · sqrtf(σ² + x[j]²)`.
fn weights(b: &[f32], qw: &[f32], sigma2: f32) -> [f32; QK] {
    std::array::from_fn(|j| qw[j] * (sigma2 + b[j] * b[j]).sqrt())
}

/// The value of largest magnitude (the first one on ties), 0 for an
/// all-zero block.
fn signed_absmax(b: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in b {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(b: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in b {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// The Q5 layouts: `d`, `m` (Q5_1), `qh` (bit 4 of level `j` at bit `j`,
/// little-endian u32), `qs` (low nibbles, `j` and `j + 16` in one byte).
fn push_q5(d: u16, m: Option<u16>, l: &[u8; QK], out: &mut Vec<u8>) {
    out.extend_from_slice(&d.to_le_bytes());
    if let Some(m) = m {
        out.extend_from_slice(&m.to_le_bytes());
    }
    let mut qh = 0u32;
    let mut qs = [0u8; QK / 2];
    for j in 0..QK / 2 {
        let (xi0, xi1) = (l[j], l[j + QK / 2]);
        qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= (((xi0 & 0x10) >> 4) as u32) << j;
        qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK / 2);
    }
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend_from_slice(&qs);
}
