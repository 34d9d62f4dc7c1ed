//! The scalar kernel: the set's arithmetic for these types written out one
//! output element at a time from the file's blocks. It is the model the
//! vector kernels are tested against bit for bit, and the kernel of builds
//! without AVX2.

use super::{KFormat, QK, RowsView};
use crate::quant::dequant::iq2::{IQ2XXS_GRID, KSIGNS_IQ2XS};

/// One super-block of weights in integer form: value `i` is
/// `d · sc[i / sub] · w[i] − dmin · m[i / sub]` (exactly what the file
/// format's dequantization computes, up to its rounding; tested).
pub(crate) struct Decoded {
    pub(crate) w: [i8; QK],
    /// Values per sub-block (16 or 32).
    pub(crate) sub: usize,
    pub(crate) sc: [i32; 16],
    /// Sub-block minima (0 for the types without them).
    pub(crate) m: [i32; 16],
    /// The super-block's scale of `sc · w` (IQ2_XXS: its `d / 8`, exact).
    pub(crate) d: f32,
    /// The super-block's scale of `m` (0 for the types without minima).
    pub(crate) dmin: f32,
}

fn h(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `get_scale_min_k4`: Q4_K / Q5_K's 6-bit scale and min of sub-block `j`.
fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    let (s, m) = if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    };
    (s as i32, m as i32)
}

/// Q3_K's 6-bit scale of sub-block `s`, as stored (the caller takes 32 off).
fn q3_scale(scales: &[u8], s: usize) -> i32 {
    let low = if s < 8 {
        scales[s] & 0xF
    } else {
        scales[s - 8] >> 4
    };
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    (low | (high << 4)) as i32
}

/// Decode one block of `format` (`b` holds exactly its bytes).
pub(crate) fn decode(format: KFormat, b: &[u8]) -> Decoded {
    let mut o = Decoded {
        w: [0; QK],
        sub: 16,
        sc: [0; 16],
        m: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
    match format {
        KFormat::Q2K => {
            let (scales, qs) = (&b[..16], &b[16..80]);
            (o.d, o.dmin) = (h(b, 80), h(b, 82));
            for (s, &byte) in scales.iter().enumerate() {
                o.sc[s] = (byte & 0xF) as i32;
                o.m[s] = (byte >> 4) as i32;
            }
            for (v, w) in o.w.iter_mut().enumerate() {
                let (half, j, l) = (v / 128, (v % 128) / 32, v % 32);
                *w = ((qs[32 * half + l] >> (2 * j)) & 3) as i8;
            }
        }
        KFormat::Q3K => {
            let (hmask, qs, scales) = (&b[..32], &b[32..96], &b[96..108]);
            o.d = h(b, 108);
            for s in 0..16 {
                o.sc[s] = q3_scale(scales, s) - 32;
            }
            for (v, w) in o.w.iter_mut().enumerate() {
                let (half, j, l) = (v / 128, (v % 128) / 32, v % 32);
                let low = ((qs[32 * half + l] >> (2 * j)) & 3) as i8;
                let high = hmask[l] & (1 << (4 * half + j)) != 0;
                *w = low - if high { 0 } else { 4 };
            }
        }
        KFormat::Q4K | KFormat::Q5K => {
            (o.d, o.dmin) = (h(b, 0), h(b, 2));
            o.sub = 32;
            let scales = &b[4..16];
            for s in 0..8 {
                (o.sc[s], o.m[s]) = scale_min_k4(s, scales);
            }
            let (qh, qs) = if format == KFormat::Q5K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            for (v, w) in o.w.iter_mut().enumerate() {
                let (s, l) = (v / 32, v % 32);
                let low = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
                let high = qh.map_or(0, |qh| ((qh[l] >> s) & 1) << 4);
                *w = (low | high) as i8;
            }
        }
        KFormat::Q6K => {
            o.d = h(b, 208);
            for s in 0..16 {
                o.sc[s] = b[192 + s] as i8 as i32;
            }
            for (v, w) in o.w.iter_mut().enumerate() {
                let (half, t, l) = (v / 128, (v % 128) / 32, v % 32);
                let ql = b[64 * half + l + 32 * (t % 2)];
                let qh = b[128 + 32 * half + l];
                let u = ((ql >> (4 * (t / 2))) & 0xF) | (((qh >> (2 * t)) & 3) << 4);
                *w = u as i8 - 32;
            }
        }
        KFormat::Iq2Xxs => {
            // d · (0.5 + s) · 0.25 · g = (d / 8) · (2s + 1) · g, every step
            // exact in f32.
            o.d = h(b, 0) * 0.125;
            o.sub = 32;
            for g in 0..8 {
                let at = 2 + 8 * g;
                let aux1 = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
                o.sc[g] = 2 * (aux1 >> 28) as i32 + 1;
                for l in 0..4 {
                    let grid = IQ2XXS_GRID[b[at + l] as usize].to_le_bytes();
                    let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
                    for (j, &mag) in grid.iter().enumerate() {
                        let mag = mag as i8;
                        o.w[32 * g + 8 * l + j] = if signs >> j & 1 != 0 { -mag } else { mag };
                    }
                }
            }
        }
    }
    o
}

/// The integer sums of one super-block: `(Σ_s sc[s] · Σ_{i∈s} w_i q_i,
/// Σ_s m[s] · Σ_{i∈s} q_i)`, exact in i32.
pub(crate) fn sums(blk: &Decoded, q: &[i8]) -> (i32, i32) {
    let (mut sumi, mut summ) = (0i32, 0i32);
    for (s, (w, q)) in blk
        .w
        .chunks_exact(blk.sub)
        .zip(q.chunks_exact(blk.sub))
        .enumerate()
    {
        let dot: i32 = w.iter().zip(q).map(|(&w, &q)| w as i32 * q as i32).sum();
        let qsum: i32 = q.iter().map(|&q| q as i32).sum();
        sumi += blk.sc[s] * dot;
        summ += blk.m[s] * qsum;
    }
    (sumi, summ)
}

/// One super-block's float steps on the accumulator (the definition):
/// `acc = fma(d · da, sumi, acc)`, then for the types with minima
/// `acc = fma(−(dmin · da), summ, acc)`.
#[inline(always)]
pub(crate) fn step(
    format: KFormat,
    d: f32,
    dmin: f32,
    da: f32,
    sumi: i32,
    summ: i32,
    acc: f32,
) -> f32 {
    let acc = (d * da).mul_add(sumi as f32, acc);
    if format.has_min() {
        (-(dmin * da)).mul_add(summ as f32, acc)
    } else {
        acc
    }
}

/// `out[r]` = the weight row `w` (its blocks as stored) times activation
/// row `r` of the view.
pub(crate) fn row(format: KFormat, w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
    let nb = a.k / QK;
    let bb = format.block_bytes();
    for (r, out) in out.iter_mut().enumerate().take(a.rows) {
        let mut acc = 0f32;
        for b in 0..nb {
            let blk = decode(format, &w[b * bb..(b + 1) * bb]);
            let q = &a.q[r * a.k + b * QK..r * a.k + (b + 1) * QK];
            let (sumi, summ) = sums(&blk, q);
            acc = step(format, blk.d, blk.dmin, a.d[r * nb + b], sumi, summ, acc);
        }
        *out = acc;
    }
}
