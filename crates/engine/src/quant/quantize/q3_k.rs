//! Q3_K (`quantize_row_q3_K_ref`, `quantize_row_q3_K_impl`): sixteen
//! symmetric groups of 16, `x ≈ d·(s − 32)·(L − 4)` with 3-bit `L` and
//! 6-bit `s`. Block: `hmask[32]` (bit 2 of `L`; value `j`'s at bit `j/32` of
//! byte `j%32`), `qs[64]` (the low two bits), `scales[12]`, `d`.

use super::k_common::{QK_K, imatrix_weights, pack_2bit, sum, sum_squares};
use super::scalar::{fp16_bits, fp16_value, nearest_int};
use super::search::{make_q3_quants, make_qx_quants};

/// Without importance: `make_q3_quants(16, 4, x, L, do_rmse)` per group;
/// the scale of largest magnitude maps to −32 (`iscale = −32/max_scale`).
pub(super) fn q3_k(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK_K) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &b[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        let mut levels = [0u8; 16];
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // `int8_t l = nearest_int(…)`: wraps before the clamp.
                let q = nearest_int(iscale * scales[j]) as i8 as i32;
                levels[j] = (q.clamp(-32, 31) + 32) as u8;
            }
            fp16_bits(1.0 / iscale)
        } else {
            fp16_bits(0.0)
        };
        finish(b, &levels, d, &mut l, out);
    }
}

/// With importance: weights `qw·sqrt(σ² + x²)` (σ² twice the super-block's
/// mean square), `make_qx_quants(16, 4, …)` per group, the scales by
/// `make_qx_quants(16, 32, …)` weighted by each group's total weight.
pub(super) fn q3_k_imatrix(x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    for (b, qw) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut sw = [0.0f32; 16];
        let sigma2 = 2.0 * sum_squares(b) / QK_K as f32;
        for j in 0..16 {
            let g = &b[16 * j..16 * j + 16];
            let mut weight = [0.0f32; 16];
            imatrix_weights(g, &qw[16 * j..16 * j + 16], sigma2, &mut weight);
            sw[j] = sum(&weight);
            scales[j] = make_qx_quants(4, g, &mut l[16 * j..16 * j + 16], Some(&weight));
        }
        let mut ls = [0i8; 16];
        let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
        finish(b, &ls.map(|v| v as u8), fp16_bits(d_block), &mut l, out);
    }
}

/// Packs the 6-bit scale levels, requantizes every group against the stored
/// `d·(s − 32)` (a group whose product is 0 keeps its search's levels) and
/// writes the block.
fn finish(b: &[f32], levels: &[u8; 16], d: u16, l: &mut [i8; QK_K], out: &mut Vec<u8>) {
    let mut sc = [0u8; 12];
    for (j, &lv) in levels.iter().enumerate() {
        if j < 8 {
            sc[j] = lv & 0xF;
        } else {
            sc[j - 8] |= (lv & 0xF) << 4;
        }
        sc[j % 4 + 8] |= (lv >> 4) << (2 * (j / 4));
    }
    let df = fp16_value(d);
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
        let dj = df * s as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            let q = nearest_int(b[16 * j + i] / dj).clamp(-4, 3);
            l[16 * j + i] = (q + 4) as i8;
        }
    }
    let mut hmask = [0u8; QK_K / 8];
    let mut low = [0u8; QK_K];
    for j in 0..QK_K {
        let mut v = l[j];
        if v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        low[j] = v as u8;
    }
    out.extend_from_slice(&hmask);
    out.extend_from_slice(&pack_2bit(&low));
    out.extend_from_slice(&sc);
    out.extend_from_slice(&d.to_le_bytes());
}
