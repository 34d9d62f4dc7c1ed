//! Dequantization, one function per stored type, each value exactly as the
//! format's reference defines it (`ggml-quants.c`'s `dequantize_row_*`, the
//! OCP MX and FP8 definitions). Where a definition multiplies more than two
//! factors the order is the reference's (`(d · sc) · q` for Q6_K); every
//! other product is exact in f32, so no order question arises there.

mod float;
pub(crate) mod iq2;
mod k_quants;
pub(crate) mod legacy;

pub use float::{e4m3_to_f32, e8m0_to_f32};

use super::types::WeightType;

/// Whole blocks of a self-contained type: `src` holds `dst.len() /
/// ty.block_len()` blocks. Panics on a type that needs separate scales or
/// on lengths that do not match (callers check shapes at load).
pub fn blocks(ty: WeightType, src: &[u8], dst: &mut [f32]) {
    let n = dst.len() / ty.block_len();
    assert_eq!(n * ty.block_len(), dst.len(), "{ty}: partial block");
    assert_eq!(src.len(), n * ty.block_bytes(), "{ty}: byte count");
    match ty {
        WeightType::F32 => float::f32s(src, dst),
        WeightType::F16 => float::f16s(src, dst),
        WeightType::BF16 => float::bf16s(src, dst),
        WeightType::Q4_0 => legacy::q4_0(src, dst),
        WeightType::Q4_1 => legacy::q4_1(src, dst),
        WeightType::Q5_0 => legacy::q5_0(src, dst),
        WeightType::Q5_1 => legacy::q5_1(src, dst),
        WeightType::Q8_0 => legacy::q8_0(src, dst),
        WeightType::MXFP4 => legacy::mxfp4(src, dst),
        WeightType::IQ4_NL => legacy::iq4_nl(src, dst),
        WeightType::Q2_K => k_quants::q2_k(src, dst),
        WeightType::Q3_K => k_quants::q3_k(src, dst),
        WeightType::Q4_K => k_quants::q4_k(src, dst),
        WeightType::Q5_K => k_quants::q5_k(src, dst),
        WeightType::Q6_K => k_quants::q6_k(src, dst),
        WeightType::Q8_K => k_quants::q8_k(src, dst),
        WeightType::IQ2_XXS => iq2::iq2_xxs(src, dst),
        WeightType::FP8_E4M3 | WeightType::FP4_E2M1 => {
            panic!("{ty} needs its scale tensor (dequant::scaled)")
        }
    }
}

/// One row of a type with separate scales: `scales[c / block_cols]` scales
/// value `c` (`v = decoded · scale`, one f32 product).
pub fn scaled(ty: WeightType, src: &[u8], scales: &[f32], block_cols: usize, dst: &mut [f32]) {
    match ty {
        WeightType::FP8_E4M3 => {
            assert_eq!(src.len(), dst.len(), "F8_E4M3: one byte per value");
            let lut = float::e4m3_table();
            for ((d, b), &s) in dst
                .chunks_mut(block_cols)
                .zip(src.chunks(block_cols))
                .zip(scales)
            {
                for (d, &b) in d.iter_mut().zip(b) {
                    *d = lut[b as usize] * s;
                }
            }
        }
        WeightType::FP4_E2M1 => {
            assert_eq!(src.len() * 2, dst.len(), "FP4: two values per byte");
            assert!(
                block_cols.is_multiple_of(2),
                "FP4 scale blocks hold whole pairs"
            );
            for ((d, b), &s) in dst
                .chunks_mut(block_cols)
                .zip(src.chunks(block_cols / 2))
                .zip(scales)
            {
                for (pair, &b) in d.chunks_exact_mut(2).zip(b) {
                    pair[0] = float::E2M1[(b & 0xF) as usize] * s;
                    pair[1] = float::E2M1[(b >> 4) as usize] * s;
                }
            }
        }
        _ => panic!("{ty} has no separate scales (dequant::blocks)"),
    }
}
