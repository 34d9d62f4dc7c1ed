//! IQ4_NL: `quantize_iq4_nl` (what `llama-quantize` calls, with or without
//! an importance matrix), i.e. `quantize_row_iq4_nl_impl` with one 32-value
//! block per super-block and `ntry = 7`. (`quantize_row_iq4_nl_ref` passes
//! `ntry = -1` and writes other bytes; llama-quantize never calls it.)
//!
//! Per block: weights `x²` (or `qw · sqrt(σ² + x²)`, σ² twice the block's
//! mean square), a first scale `max / 127` from the value of largest
//! magnitude, then 15 trial scales `(itry − 127) / max` keeping the one that
//! maximises `(Σ w q x)² / Σ w q²`; the levels are re-picked against the
//! chosen scale before packing.

use super::scalar::fp16_bits;
use crate::quant::dequant::legacy::KVALUES_IQ4NL;

const QK: usize = 32;
/// `GROUP_MAX_EPS`: a block whose largest magnitude is below this gets
/// scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;
/// `ntry` as `quantize_iq4_nl` passes it.
const NTRY: i32 = 7;

fn val(i: usize) -> f32 {
    f32::from(KVALUES_IQ4NL[i])
}

/// `best_index_int8(16, kvalues_iq4nl, x)`: the nearest level by bisection
/// (ties to the upper one; a NaN lands on 15, as the C's comparisons go).
fn best_index(x: f32) -> u8 {
    if x <= val(0) {
        return 0;
    }
    if x >= val(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val(mu - 1) < val(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// `Σ w q x` and `Σ w q²` over the block for the levels nearest `id · x`.
fn sums(x: &[f32], weight: &[f32; QK], id: f32, levels: Option<&mut [u8; QK]>) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    let mut picked = [0u8; QK];
    for j in 0..QK {
        let l = best_index(id * x[j]);
        picked[j] = l;
        let q = val(l as usize);
        let w = weight[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    if let Some(levels) = levels {
        *levels = picked;
    }
    (sumqx, sumq2)
}

/// One row: `{d: f16, qs[16]}` per 32 values; `qw` the row's importance.
pub(super) fn iq4_nl(x: &[f32], qw: Option<&[f32]>, out: &mut Vec<u8>) {
    for (ib, xb) in x.chunks_exact(QK).enumerate() {
        let mut sigma2 = 0f32;
        for &v in xb {
            sigma2 += v * v;
        }
        sigma2 *= 2.0 / QK as f32;
        let mut weight = [0f32; QK];
        for j in 0..QK {
            weight[j] = match qw {
                Some(q) => q[ib * QK + j] * (sigma2 + xb[j] * xb[j]).sqrt(),
                None => xb[j] * xb[j],
            };
        }
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        let scale = if amax < GROUP_MAX_EPS {
            0.0
        } else {
            let d = -max / val(0);
            let (sumqx, sumq2) = sums(xb, &weight, 1.0 / d, None);
            let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
            let mut best = d * sumqx;
            for itry in -NTRY..=NTRY {
                let id = (itry + i32::from(KVALUES_IQ4NL[0])) as f32 / max;
                let (sumqx, sumq2) = sums(xb, &weight, id, None);
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            d
        };
        out.extend_from_slice(&fp16_bits(scale).to_le_bytes());
        // The levels against the chosen (f32) scale, as the C re-picks them.
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        let mut levels = [0u8; QK];
        sums(xb, &weight, id, Some(&mut levels));
        for j in 0..QK / 2 {
            out.push(levels[j] | (levels[QK / 2 + j] << 4));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_index_is_the_nearest_level() {
        assert_eq!(best_index(-500.0), 0);
        assert_eq!(best_index(500.0), 15);
        assert_eq!(best_index(0.0), 8, "1 is nearer than -10");
        assert_eq!(best_index(7.0), 9, "a tie (1 and 13) goes up");
        assert_eq!(best_index(-105.0), 1);
        assert_eq!(best_index(f32::NAN), 15);
    }
}
