//! Q4_K and Q5_K (`quantize_row_q{4,5}_K_ref`, `quantize_row_q{4,5}_K_impl`):
//! eight groups of 32, `x ≈ d·s·L − dmin·m` with 4- or 5-bit `L` and 6-bit
//! `s`, `m`. Blocks: `d`, `dmin`, `scales[12]`, then Q5_K's `qh[32]`, then
//! `qs[128]` (low nibbles of values `l` and `l + 32` of each 64).
//!
//! The two types differ only in `nmax` (15, 31), the no-importance search
//! range and the high-bit plane, so one routine serves both.

use super::k_common::{QK_K, imatrix_weights, pack_scale_min_k4, scale_min_k4, sum, sum_squares};
use super::scalar::{fp16_bits, fp16_value, nearest_int};
use super::search::{MinMaxSearch, make_qkx_quants, make_qp_quants};

/// Which of the two: the level range and the `_ref` search
/// (`make_qkx2_quants(32, nmax, …, rmin, 0.1, nstep)`).
#[derive(Clone, Copy)]
pub(super) enum Kind {
    Q4,
    Q5,
}

impl Kind {
    fn nmax(self) -> i32 {
        match self {
            Kind::Q4 => 15,
            Kind::Q5 => 31,
        }
    }

    fn ref_search(self) -> MinMaxSearch {
        let (rmin, nstep) = match self {
            Kind::Q4 => (-1.0, 20),
            Kind::Q5 => (-0.5, 15),
        };
        MinMaxSearch {
            rmin,
            rdelta: 0.1,
            nstep,
            use_mad: false,
        }
    }
}

/// Without importance: per group weights `sqrt(mean x²) + |x|`, the
/// largest scale and min map to 63 (`d = max/63`).
pub(super) fn q45_k(kind: Kind, x: &[f32], out: &mut Vec<u8>) {
    let search = kind.ref_search();
    for b in x.chunks_exact(QK_K) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 32];
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..8 {
            let g = &b[32 * j..32 * j + 32];
            let av_x = (sum_squares(g) / 32.0).sqrt();
            let weights: [f32; 32] = std::array::from_fn(|i| av_x + g[i].abs());
            let lj = &mut l[32 * j..32 * j + 32];
            (scales[j], mins[j]) =
                make_qkx_quants(kind.nmax(), g, &weights, lj, &mut laux, &search);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let inv_scale = if max_scale > 0.0 {
            63.0 / max_scale
        } else {
            0.0
        };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        // `uint8_t ls = nearest_int(…)` wraps, then `MIN(63, ls)`.
        let ls = scales.map(|s| (nearest_int(inv_scale * s) as u8).min(63));
        let lm = mins.map(|m| (nearest_int(inv_min * m) as u8).min(63));
        let d = fp16_bits(max_scale / 63.0);
        let dmin = fp16_bits(max_min / 63.0);
        finish(kind, b, &pack_scale_min_k4(&ls, &lm), d, dmin, &mut l, out);
    }
}

/// With importance: weights `qw·sqrt(σ² + x²)` (σ² twice the super-block's
/// mean square), `make_qkx3_quants(32, nmax, …, -0.9, 0.05, 36)` per group,
/// scales and mins by `make_qp_quants(63)` weighted by the groups' totals.
/// Q5_K clamps the levels to 63, Q4_K does not (they cannot exceed it
/// unless a negative one wrapped).
pub(super) fn q45_k_imatrix(kind: Kind, x: &[f32], qw: &[f32], out: &mut Vec<u8>) {
    for (b, qw) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 32];
        let mut scales = [0.0f32; 8];
        let mut mins = [0.0f32; 8];
        let mut sw = [0.0f32; 8];
        let sigma2 = 2.0 * sum_squares(b) / QK_K as f32;
        for j in 0..8 {
            let g = &b[32 * j..32 * j + 32];
            let mut weights = [0.0f32; 32];
            imatrix_weights(g, &qw[32 * j..32 * j + 32], sigma2, &mut weights);
            sw[j] = sum(&weights);
            let lj = &mut l[32 * j..32 * j + 32];
            (scales[j], mins[j]) = make_qkx_quants(
                kind.nmax(),
                g,
                &weights,
                lj,
                &mut laux,
                &super::legacy::QKX3,
            );
        }
        let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
        let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
        let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
        if let Kind::Q5 = kind {
            ls = ls.map(|v| v.min(63));
            lm = lm.map(|v| v.min(63));
        }
        let sc = pack_scale_min_k4(&ls, &lm);
        finish(
            kind,
            b,
            &sc,
            fp16_bits(d_block),
            fp16_bits(m_block),
            &mut l,
            out,
        );
    }
}

/// Requantizes every group against the stored `d·s` and `dmin·m` (a group
/// whose scale is 0 keeps its search's levels) and writes the block.
fn finish(
    kind: Kind,
    b: &[f32],
    sc: &[u8; 12],
    d: u16,
    dmin: u16,
    l: &mut [u8; QK_K],
    out: &mut Vec<u8>,
) {
    let (df, dminf) = (fp16_value(d), fp16_value(dmin));
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, sc);
        let dj = df * s as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * m as f32;
        for i in 0..32 {
            let q = nearest_int((b[32 * j + i] + dm) / dj);
            l[32 * j + i] = q.clamp(0, kind.nmax()) as u8;
        }
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(sc);
    let mut qs = [0u8; QK_K / 2];
    match kind {
        Kind::Q4 => {
            for (n, q) in (0..QK_K).step_by(64).zip(qs.chunks_exact_mut(32)) {
                for i in 0..32 {
                    q[i] = l[n + i] | (l[n + i + 32] << 4);
                }
            }
        }
        Kind::Q5 => {
            let mut qh = [0u8; QK_K / 8];
            let (mut m1, mut m2) = (1u8, 2u8);
            for (n, q) in (0..QK_K).step_by(64).zip(qs.chunks_exact_mut(32)) {
                for i in 0..32 {
                    let mut l1 = l[n + i];
                    if l1 > 15 {
                        l1 -= 16;
                        qh[i] |= m1;
                    }
                    let mut l2 = l[n + i + 32];
                    if l2 > 15 {
                        l2 -= 16;
                        qh[i] |= m2;
                    }
                    q[i] = l1 | (l2 << 4);
                }
                m1 <<= 2;
                m2 <<= 2;
            }
            out.extend_from_slice(&qh);
        }
    }
    out.extend_from_slice(&qs);
}
