//! Q8_K (`quantize_row_q8_K_ref`): the activation type of the K-quant dot
//! products, `x ≈ d·q` with an f32 `d = max/−127` and per-16 sums. Block:
//! `d` (f32), `qs[256]`, `bsums[16]` (i16). There is no importance path
//! (`ggml_quantize_chunk` does not offer Q8_K); an importance matrix is
//! ignored.

use super::k_common::QK_K;
use super::scalar::nearest_int;
use super::search::signed_max;

pub(super) fn q8_k(x: &[f32], out: &mut Vec<u8>) {
    for b in x.chunks_exact(QK_K) {
        let (max, amax) = signed_max(b);
        if amax == 0.0 {
            // The C zeroes `d` and `qs` and leaves `bsums` as it was; the
            // sums of zero levels are zero, so zero them too.
            out.extend_from_slice(&[0u8; 292]);
            continue;
        }
        // −127 rather than −128 keeps every level in ±127 (ggml: "else the
        // AVX implementation [of IQ2_XXS] becomes very awkward").
        let iscale = -127.0 / max;
        let qs: [i8; QK_K] = std::array::from_fn(|j| nearest_int(iscale * b[j]).min(127) as i8);
        out.extend_from_slice(&(1.0 / iscale).to_le_bytes());
        out.extend(qs.map(|q| q as u8));
        for g in qs.chunks_exact(16) {
            let s: i32 = g.iter().map(|&q| q as i32).sum();
            out.extend_from_slice(&(s as i16).to_le_bytes());
        }
    }
}
