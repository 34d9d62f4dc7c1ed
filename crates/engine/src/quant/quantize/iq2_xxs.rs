//! IQ2_XXS (`quantize_row_iq2_xxs_impl`, what `quantize_iq2_xxs` runs per
//! row): eight groups of 32, each four 8-value grid points (magnitudes
//! `2l + 1`, `l ∈ 0..=2`), seven sign bits per eight (the eighth completes
//! even parity), and a 4-bit group scale under one f16 `d`.
//!
//! Needs the importance matrix (llama.cpp asserts on NULL). Per group: make
//! the sign parity even by flipping the value of least weighted square,
//! seed a scale with `make_qp_quants`, try thirteen scales around it,
//! snapping each 8-value pattern to the grid (the nearest weighted neighbour
//! when off it), then refit once more at the best scale.

use super::iq2_grid::{Iq2Grid, tables};
use super::k_common::QK_K;
use super::scalar::{c_max, fp16_bits, nearest_int};
use super::search::{GROUP_MAX_EPS, make_qp_quants};

/// `kMaxQ`: levels 0..kMaxQ−1 per value.
const K_MAX_Q: i32 = 3;

/// Where the C aborts (`GGML_ASSERT` / `GGML_ABORT`); no tested row gets
/// there, not even one whose squares overflow f32.
pub(super) type Abort = &'static str;

/// One row; `qw` is the row's importance (as long as `x`).
pub(super) fn iq2_xxs(x: &[f32], qw: &[f32], out: &mut Vec<u8>) -> Result<(), Abort> {
    let t = tables();
    for (xbl, qwbl) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)) {
        let mut q2 = [0u32; 2 * QK_K / 32];
        let mut scales = [0.0f32; QK_K / 32];
        let mut max_scale = 0.0f32;
        let mut sumx2 = 0.0f32;
        for &v in xbl {
            sumx2 += v * v;
        }
        let sigma2 = sumx2 / QK_K as f32;
        for ib in 0..QK_K / 32 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let qwb = &qwbl[32 * ib..32 * ib + 32];
            let weight: [f32; 32] =
                std::array::from_fn(|i| qwb[i] * (sigma2 + xb[i] * xb[i]).sqrt());
            let waux = weight.map(f32::sqrt);
            let mut xval = [0.0f32; 32];
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                let mut nflip = 0;
                let mut s = 0u8;
                for i in 0..8 {
                    if xb[8 * k + i] >= 0.0 {
                        xval[8 * k + i] = xb[8 * k + i];
                    } else {
                        xval[8 * k + i] = -xb[8 * k + i];
                        nflip += 1;
                        s |= 1 << i;
                    }
                }
                if nflip % 2 == 1 {
                    let sq = |i: usize| weight[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                    let mut imin = 0;
                    let mut min = sq(0);
                    for i in 1..8 {
                        let ax = sq(i);
                        if ax < min {
                            min = ax;
                            imin = i;
                        }
                    }
                    xval[8 * k + imin] = -xval[8 * k + imin];
                    s ^= 1 << imin;
                }
                block_signs[k] = s & 127;
            }
            let mut max = xval[0];
            for &v in &xval[1..] {
                max = c_max(max, v);
            }
            if max < GROUP_MAX_EPS {
                continue; // scales[ib] = 0, nothing stored
            }
            // `make_qp_quants` writes `uint8_t`s into the `int8_t` levels.
            let mut lq = [0u8; 32];
            let mut scale = make_qp_quants(K_MAX_Q + 1, &xval, &mut lq, &weight);
            let mut l = lq.map(|v| v as i8);
            let eff_max = scale * K_MAX_Q as f32;
            if eff_max <= 0.0 {
                continue;
            }
            let mut best = 0.0f32;
            let mut laux = [0i8; 32];
            for is in -6..=6i32 {
                let id = ((2 * K_MAX_Q - 1) as f32 + is as f32 * 0.1) / eff_max;
                let this_scale = 1.0 / id;
                for k in 0..4 {
                    let mut u = 0usize;
                    for i in 0..8 {
                        let q = nearest_int(0.5 * (id * xval[8 * k + i] - 1.0));
                        laux[8 * k + i] = q.clamp(0, K_MAX_Q - 1) as i8;
                        u |= (laux[8 * k + i] as usize) << (2 * i);
                    }
                    if t.map[u] < 0 {
                        let r = 8 * k..8 * k + 8;
                        let (xs, ws) = (&xval[r.clone()], &waux[r.clone()]);
                        best_neighbour(t, t.map[u], xs, ws, this_scale, &mut laux[r])?;
                    }
                }
                let (sumqx, sumq2) = fit(&weight, &xval, &laux);
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    scale = sumqx / sumq2;
                    best = scale * sumqx;
                    l = laux;
                }
            }
            if scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..4 {
                    let mut u = 0usize;
                    for i in 0..8 {
                        let q = nearest_int(0.5 * (id * xval[8 * k + i] - 1.0));
                        u |= (q.clamp(0, K_MAX_Q - 1) as usize) << (2 * i);
                    }
                    let r = 8 * k..8 * k + 8;
                    let mut grid_index = t.map[u];
                    if grid_index < 0 {
                        let (xs, ws) = (&xval[r.clone()], &waux[r.clone()]);
                        grid_index =
                            best_neighbour(t, grid_index, xs, ws, scale, &mut l[r.clone()])?;
                    }
                    for (lv, &p) in l[r].iter_mut().zip(&t.grid[grid_index as usize]) {
                        *lv = (p - 1) / 2;
                    }
                }
                let (sumqx, sumq2) = fit(&weight, &xval, &l);
                if sumq2 > 0.0 {
                    scale = sumqx / sumq2;
                }
            }
            if scale < 0.0 {
                // "This should never happen": flip the scale positive and the
                // signs with it.
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..4 {
                // `uint16_t u |= L << 2i`: a level outside 0..=2 (only left
                // by an unfinished search) lands off the map; the C reads
                // out of bounds or aborts there.
                let mut u = 0u16;
                for i in 0..8 {
                    u |= ((l[8 * k + i] as i32) << (2 * i)) as u16;
                }
                let grid_index = match t.map.get(u as usize) {
                    Some(&g) if g >= 0 => g as u32,
                    _ => return Err("a group's levels are off the IQ2_XXS grid"),
                };
                q2[2 * ib] |= grid_index << (8 * k);
                q2[2 * ib + 1] |= (block_signs[k] as u32) << (7 * k);
            }
            // `GGML_ASSERT(scale >= 0)`: negatives were flipped above.
            if scale.is_nan() {
                return Err("a group's scale is NaN");
            }
            scales[ib] = scale;
            max_scale = c_max(max_scale, scale);
        }
        if max_scale == 0.0 {
            out.extend_from_slice(&[0u8; 66]);
            continue;
        }
        let d = max_scale / 31.0;
        let id = 1.0 / d;
        for ib in 0..QK_K / 32 {
            let l = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            q2[2 * ib + 1] |= (l as u32) << 28;
        }
        out.extend_from_slice(&fp16_bits(d).to_le_bytes());
        for w in q2 {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    Ok(())
}

/// `Σ w·x·q` and `Σ w·q²` for levels `q = 2L + 1`.
fn fit(weight: &[f32; 32], xval: &[f32; 32], l: &[i8; 32]) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for i in 0..32 {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// `iq2_find_best_neighbour`: the neighbour of least `Σ w·(scale·q − x)²`
/// (the first on ties), its levels written to `l`.
fn best_neighbour(
    t: &Iq2Grid,
    m: i32,
    xval: &[f32],
    weight: &[f32],
    scale: f32,
    l: &mut [i8],
) -> Result<i32, Abort> {
    let mut best_d2 = f32::MAX;
    let mut grid_index = -1i32;
    for &j in t.neighbours_of(m) {
        let pg = &t.grid[j as usize];
        let mut d2 = 0.0f32;
        for i in 0..8 {
            let diff = scale * pg[i] as f32 - xval[i];
            d2 += weight[i] * diff * diff;
        }
        if d2 < best_d2 {
            best_d2 = d2;
            grid_index = j as i32;
        }
    }
    if grid_index < 0 {
        return Err("no IQ2_XXS grid neighbour has a finite error");
    }
    for (lv, &p) in l.iter_mut().zip(&t.grid[grid_index as usize]) {
        *lv = (p - 1) / 2;
    }
    Ok(grid_index)
}
