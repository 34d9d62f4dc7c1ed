//! Q2_K (`quantize_row_q2_K_ref`, `quantize_row_q2_K_impl`): sixteen
//! groups of 16 values, each `x ≈ d·s·L − dmin·m` with 2-bit `L` and 4-bit
//! `s`, `m`. Block: `scales[16]` (`s | m << 4`), `qs[64]`, `d`, `dmin`.
//!
//! Both paths search each group's scale and min, quantize those to 4 bits,
//! then requantize every value against the f16-rounded `d`/`dmin` the
//! dequantizer will read (a group whose scale rounds to 0 keeps the levels
//! of its search).

use super::k_common::{QK_K, imatrix_weights, pack_2bit, sum, sum_squares};
use super::scalar::{fp16_bits, fp16_value, nearest_int};
use super::search::{MinMaxSearch, make_qkx_quants, make_qp_quants};

/// Without importance: `make_qkx2_quants(16, 3, …, |x| weights, -0.5, 0.1,
/// 15, use_mad)`, then the largest scale and min set `d`, `dmin` (`/15`).
pub(super) fn q2_k(x: &[f32], out: &mut Vec<u8>) {
    const SEARCH: MinMaxSearch = MinMaxSearch {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for b in x.chunks_exact(QK_K) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let g = &b[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| g[i].abs());
            let lj = &mut l[16 * j..16 * j + 16];
            (scales[j], mins[j]) = make_qkx_quants(3, g, &weights, lj, &mut laux, &SEARCH);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let mut sc = [0u8; 16];
        let d = if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            fp16_bits(max_scale / 15.0)
        } else {
            fp16_bits(0.0)
        };
        let dmin = if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            fp16_bits(max_min / 15.0)
        } else {
            fp16_bits(0.0)
        };
        finish(b, sc, d, dmin, &mut l, out);
    }
}

/// With importance: weights `qw·sqrt(σ² + x²)` (σ² the super-block's mean
/// square), `make_qkx3_quants(16, 3, …, -0.9, 0.05, 36)` per group, and the
/// sixteen scales and mins each quantized by `make_qp_quants(15)` weighted
/// by the groups' total weight.
pub(super) fn q2_k_imatrix(x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    for (b, qw) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut sw = [0.0f32; 16];
        let sigma2 = sum_squares(b) / QK_K as f32;
        for j in 0..16 {
            let g = &b[16 * j..16 * j + 16];
            let mut weight = [0.0f32; 16];
            imatrix_weights(g, &qw[16 * j..16 * j + 16], sigma2, &mut weight);
            sw[j] = sum(&weight);
            let lj = &mut l[16 * j..16 * j + 16];
            (scales[j], mins[j]) =
                make_qkx_quants(3, g, &weight, lj, &mut laux, &super::legacy::QKX3);
        }
        let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        let sc: [u8; 16] = std::array::from_fn(|j| ls[j] | (lm[j] << 4));
        finish(b, sc, fp16_bits(dm), fp16_bits(mm), &mut l, out);
    }
}

/// Requantizes against the stored `d`, `dmin` and writes the block.
fn finish(b: &[f32], sc: [u8; 16], d: u16, dmin: u16, l: &mut [u8; QK_K], out: &mut Vec<u8>) {
    let (df, dminf) = (fp16_value(d), fp16_value(dmin));
    for j in 0..16 {
        let dj = df * (sc[j] & 0xF) as f32;
        if dj == 0.0 {
            continue;
        }
        let mj = dminf * (sc[j] >> 4) as f32;
        for i in 0..16 {
            let q = nearest_int((b[16 * j + i] + mj) / dj);
            l[16 * j + i] = q.clamp(0, 3) as u8;
        }
    }
    out.extend_from_slice(&sc);
    out.extend_from_slice(&pack_2bit(l));
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
}
