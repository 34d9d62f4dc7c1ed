//! The scalar kernel: the fast set's arithmetic written out one output
//! element at a time. It is the model the vector kernels are tested
//! against bit for bit, and the kernel of builds without AVX2.

use super::{Group, LANES, RowsView, quant_bytes};
use crate::backend::cpu::block_matmul::{BLOCK, BlockFormat};

/// The weight quant of `lane`'s row at value `v` of block `b` (Q4_1: the
/// nibble `u`, 0..16; Q8_0: the signed quant).
fn weight_quant(g: &Group<'_>, b: usize, lane: usize, v: usize) -> i32 {
    let base = b * LANES * quant_bytes(g.format);
    match g.format {
        BlockFormat::Q4_1 => {
            let (c, i) = (v / 8, v % 8);
            let byte = g.quants[base + c * 64 + lane * 4 + i % 4];
            if i < 4 {
                (byte & 0x0F) as i32
            } else {
                (byte >> 4) as i32
            }
        }
        BlockFormat::Q8_0 => {
            let (c, i) = (v / 4, v % 4);
            g.quants[base + c * 64 + lane * 4 + i] as i8 as i32
        }
    }
}

fn f16(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// `out[r · LANES + lane]` = the group's row `lane` times activation row
/// `r`, for the view's rows.
pub(crate) fn group_rows(g: &Group<'_>, a: &RowsView<'_>, out: &mut [f32]) {
    let nb = g.blocks;
    let per_block = match g.format {
        BlockFormat::Q4_1 => 2 * LANES,
        BlockFormat::Q8_0 => LANES,
    };
    for r in 0..a.rows {
        for lane in 0..LANES {
            let mut acc = 0f32;
            for b in 0..nb {
                let q = &a.q[r * a.k + b * BLOCK..r * a.k + (b + 1) * BLOCK];
                let sumi: i32 = (0..BLOCK)
                    .map(|v| weight_quant(g, b, lane, v) * q[v] as i32)
                    .sum();
                let dw = f16(g.scales[b * per_block + lane]);
                let da = a.d[r * nb + b];
                acc = (dw * da).mul_add(sumi as f32, acc);
                if g.format == BlockFormat::Q4_1 {
                    let mw = f16(g.scales[b * per_block + LANES + lane]);
                    acc = mw.mul_add(a.s[r * nb + b], acc);
                }
            }
            out[r * LANES + lane] = acc;
        }
    }
}
