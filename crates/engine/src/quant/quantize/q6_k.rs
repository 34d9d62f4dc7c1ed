//! Q6_K (`quantize_row_q6_K_ref`, `quantize_row_q6_K_impl`): sixteen
//! symmetric groups of 16, `x ≈ d·s·(L − 32)` with 6-bit `L` and signed
//! 8-bit `s`. Block: `ql[128]`, `qh[64]`, `scales[16]`, `d`.
//!
//! The importance path differs from the reference only in weighting each
//! group's `make_qx_quants(16, 32, …)` by the raw importance (the σ² weights
//! are commented out in the C).

use super::k_common::QK_K;
use super::scalar::{fp16_bits, fp16_value, nearest_int};
use super::search::{GROUP_MAX_EPS, make_qx_quants};

/// One row; `qw` (as long as `x`) weights the group searches.
pub(super) fn q6_k(x: &[f32], qw: Option<&[f32]>, out: &mut Vec<u8>) {
    for (ibl, b) in x.chunks_exact(QK_K).enumerate() {
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..16 {
            let g = &b[16 * ib..16 * ib + 16];
            let w = qw.map(|q| &q[QK_K * ibl + 16 * ib..QK_K * ibl + 16 * ib + 16]);
            scales[ib] = make_qx_quants(32, g, &mut l[16 * ib..16 * ib + 16], w);
            let abs_scale = scales[ib].abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scales[ib];
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            out.extend_from_slice(&[0u8; 210]);
            continue;
        }
        let iscale = -128.0 / max_scale;
        let d = fp16_bits(1.0 / iscale);
        // `MIN(127, nearest_int(…))` stored as `int8_t`.
        let sc = scales.map(|s| nearest_int(iscale * s).min(127) as i8);
        let df = fp16_value(d);
        for j in 0..16 {
            let dj = df * sc[j] as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 0..16 {
                let q = nearest_int(b[16 * j + i] / dj).clamp(-32, 31);
                l[16 * j + i] = (q + 32) as i8;
            }
        }
        let mut ql = [0u8; QK_K / 2];
        let mut qh = [0u8; QK_K / 4];
        for (h, j) in (0..QK_K).step_by(128).enumerate() {
            let (ql, qh) = (&mut ql[64 * h..64 * h + 64], &mut qh[32 * h..32 * h + 32]);
            for i in 0..32 {
                let v = [0, 32, 64, 96].map(|o| l[j + i + o] as u8);
                ql[i] = (v[0] & 0xF) | ((v[2] & 0xF) << 4);
                ql[i + 32] = (v[1] & 0xF) | ((v[3] & 0xF) << 4);
                qh[i] = (v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6);
            }
        }
        out.extend_from_slice(&ql);
        out.extend_from_slice(&qh);
        out.extend(sc.map(|s| s as u8));
        out.extend_from_slice(&d.to_le_bytes());
    }
}
