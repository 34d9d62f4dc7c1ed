//! What the K-quant quantizers share: the super-block size, σ² weights,
//! the 2-bit packing Q2_K and Q3_K use, and the 6-bit scale/min packing of
//! Q4_K and Q5_K (`get_scale_min_k4`'s inverse).

/// Values per super-block (`QK_K`).
pub(super) const QK_K: usize = 256;

/// `sum(x²)` over a super-block, in order.
pub(super) fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// `qw[l] · sqrtf(σ² + x[l]²)`: the importance paths' weights.
pub(super) fn imatrix_weights(x: &[f32], qw: &[f32], sigma2: f32, w: &mut [f32]) {
    for ((w, &v), &q) in w.iter_mut().zip(x).zip(qw) {
        *w = q * (sigma2 + v * v).sqrt();
    }
}

/// `sumw = 0; sumw += w[l]` in order.
pub(super) fn sum(w: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in w {
        s += v;
    }
    s
}

/// Four 2-bit levels per byte: byte `j/4 + l` of each 128-value half holds
/// values `l`, `l + 32`, `l + 64`, `l + 96` (low bits first).
pub(super) fn pack_2bit(l: &[u8; QK_K]) -> [u8; QK_K / 4] {
    let mut qs = [0u8; QK_K / 4];
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
    qs
}

/// Eight 6-bit scales and mins in 12 bytes: the first four of each whole,
/// the last four split into a nibble (bytes 8..12) and two high bits (the
/// top of bytes 0..8). Values over 63 lose their extra bits exactly as the
/// C's `uint8_t` shifts do.
pub(super) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut sc = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            sc[j] = ls[j];
            sc[j + 4] = lm[j];
        } else {
            sc[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            sc[j - 4] |= (ls[j] >> 4) << 6;
            sc[j] |= (lm[j] >> 4) << 6;
        }
    }
    sc
}

/// `get_scale_min_k4`: sub-block `j`'s 6-bit scale and min.
pub(super) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
