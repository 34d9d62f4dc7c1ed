//! Scalar kernels for CPUs without AVX2/FMA/F16C: the same formula as the
//! AVX2 path, with its own (fixed) order of additions. Decode and prefill
//! share this one code path, so they agree bit for bit here too.

use super::{BLOCK, BlockFormat, GroupScratch, RowGroup};

pub(super) fn block_sums(x: &[f32], sums: &mut [f32]) {
    for (xb, s) in x.chunks_exact(BLOCK).zip(sums.iter_mut()) {
        *s = xb.iter().sum();
    }
}

/// Unscaled value `i` of row `c`, block `b` of the group.
fn quant(g: &RowGroup, c: usize, b: usize, i: usize) -> f32 {
    let at = b * g.cols + c;
    match g.format {
        BlockFormat::Q4_1 => {
            let q = &g.quants[at * 16..][..16];
            if i < 16 {
                (q[i] & 0x0F) as f32
            } else {
                (q[i - 16] >> 4) as f32
            }
        }
        BlockFormat::Q8_0 => g.quants[at * 32 + i] as i8 as f32,
    }
}

/// The group's rows times `m` activation rows: `out[r * cols + c]`.
pub(super) fn rows(
    g: &RowGroup,
    x: &[f32],
    sx: &[f32],
    m: usize,
    _scratch: &mut GroupScratch,
    out: &mut [f32],
) {
    let (k, nb, cols) = (g.k, g.k / BLOCK, g.cols);
    for r in 0..m {
        let (xr, sxr) = (&x[r * k..(r + 1) * k], &sx[r * nb..(r + 1) * nb]);
        for c in 0..cols {
            let mut acc = 0f32;
            for b in 0..nb {
                let d = half::f16::from_bits(g.scales[b * cols + c]).to_f32();
                for i in 0..BLOCK {
                    acc += d * quant(g, c, b, i) * xr[b * BLOCK + i];
                }
            }
            if g.format == BlockFormat::Q4_1 {
                for (&mn, &s) in g.mins_of(c).iter().zip(sxr) {
                    acc += half::f16::from_bits(mn).to_f32() * s;
                }
            }
            out[r * cols + c] = acc;
        }
    }
}
