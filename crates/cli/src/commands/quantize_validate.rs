//! llama.cpp's `ggml_validate_row_data` (`ggml-quants.c`) over the bytes
//! `ds4server quantize` is about to write: every block's f16 scale (and
//! minimum) must be finite, F32/F16/BF16 values must be finite, an MXFP4
//! exponent must not be 0xFF. `llama-quantize` runs the same check on its
//! output and refuses the file; so does `quantize` (a finite input whose
//! block maximum overflows f16, 1e30 → an infinite Q8_0 scale, passes the
//! quantizer but would load as NaN weights).

use ds4_engine::quant::WeightType;

/// The first invalid block of a run of rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// Row within the bytes checked (0-based).
    pub row: usize,
    /// Block within that row.
    pub block: usize,
    /// What was found: `inf scale d`, `NaN value`, `E8M0 exponent 0xFF`.
    pub what: String,
}

/// Byte offsets of the f16 fields ggml checks in one block of `ty`
/// (`d`, and `m` / `dmin` where the block has one), as laid out in
/// `ggml-common.h`.
fn f16_fields(ty: WeightType) -> Option<&'static [(usize, &'static str)]> {
    Some(match ty {
        WeightType::Q4_0
        | WeightType::Q5_0
        | WeightType::Q8_0
        | WeightType::IQ2_XXS
        | WeightType::IQ4_NL => &[(0, "d")],
        WeightType::Q4_1 | WeightType::Q5_1 => &[(0, "d"), (2, "m")],
        WeightType::Q4_K | WeightType::Q5_K => &[(0, "d"), (2, "dmin")],
        // scales[16], qs[64], d, dmin
        WeightType::Q2_K => &[(80, "d"), (82, "dmin")],
        // hmask[32], qs[64], scales[12], d
        WeightType::Q3_K => &[(108, "d")],
        // ql[128], qh[64], scales[16], d
        WeightType::Q6_K => &[(208, "d")],
        _ => return None,
    })
}

fn kind(nan: bool) -> &'static str {
    if nan { "NaN" } else { "inf" }
}

/// An f16's bits: `None` when finite, else whether it is a NaN
/// (ggml's `isinf_fp16` / `isnan_fp16`).
fn f16_bad(h: u16) -> Option<bool> {
    (h & 0x7c00 == 0x7c00).then_some(h & 0x03ff != 0)
}

/// The same for a bf16 (ggml's BF16 case).
fn bf16_bad(h: u16) -> Option<bool> {
    (h & 0x7f80 == 0x7f80).then_some(h & 0x007f != 0)
}

/// Checks `bytes`, rows of `row_len` values of `ty`. `Err` names the first
/// offending row and block.
pub fn validate(ty: WeightType, bytes: &[u8], row_len: usize) -> Result<(), Invalid> {
    let bb = ty.block_bytes();
    let blocks_per_row = (row_len / ty.block_len().max(1)).max(1);
    let at = |i: usize, what: String| Invalid {
        row: i / blocks_per_row,
        block: i % blocks_per_row,
        what,
    };
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    match ty {
        WeightType::F32 => {
            for (i, c) in bytes.chunks_exact(4).enumerate() {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                if !v.is_finite() {
                    return Err(at(i, format!("{} value", kind(v.is_nan()))));
                }
            }
        }
        WeightType::F16 => {
            for (i, c) in bytes.chunks_exact(2).enumerate() {
                if let Some(nan) = f16_bad(u16_at(c, 0)) {
                    return Err(at(i, format!("{} value", kind(nan))));
                }
            }
        }
        WeightType::BF16 => {
            for (i, c) in bytes.chunks_exact(2).enumerate() {
                if let Some(nan) = bf16_bad(u16_at(c, 0)) {
                    return Err(at(i, format!("{} value", kind(nan))));
                }
            }
        }
        WeightType::Q8_K => {
            for (i, c) in bytes.chunks_exact(bb).enumerate() {
                let d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                if !d.is_finite() {
                    return Err(at(i, format!("{} scale d", kind(d.is_nan()))));
                }
            }
        }
        WeightType::MXFP4 => {
            for (i, c) in bytes.chunks_exact(bb).enumerate() {
                if c[0] == 0xff {
                    return Err(at(i, "E8M0 exponent 0xFF (NaN scale)".into()));
                }
            }
        }
        _ => {
            if let Some(fields) = f16_fields(ty) {
                for (i, c) in bytes.chunks_exact(bb).enumerate() {
                    for &(o, name) in fields {
                        if let Some(nan) = f16_bad(u16_at(c, o)) {
                            return Err(at(i, format!("{} scale {name}", kind(nan))));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_engine::quant::quantize::rows;

    /// Every written type: an ordinary row passes; a row whose block
    /// maximum overflows the type's scale is caught at that row and block.
    #[test]
    fn finite_rows_pass_and_overflowing_scales_are_found() {
        let n = 512;
        let ordinary: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let ones = vec![1.0f32; n];
        for ty in [
            WeightType::F16,
            WeightType::BF16,
            WeightType::F32,
            WeightType::Q4_0,
            WeightType::Q4_1,
            WeightType::Q5_0,
            WeightType::Q5_1,
            WeightType::Q8_0,
            WeightType::Q2_K,
            WeightType::Q3_K,
            WeightType::Q4_K,
            WeightType::Q5_K,
            WeightType::Q6_K,
            WeightType::IQ2_XXS,
        ] {
            let imp = (ty == WeightType::IQ2_XXS).then_some(&ones[..]);
            let ok = rows(ty, &ordinary, n, imp).unwrap();
            assert_eq!(validate(ty, &ok, n), Ok(()), "{ty}");
            // Row 1 of 3 holds one huge value in its second block.
            let mut v = [ordinary.clone(), ordinary.clone(), ordinary.clone()].concat();
            let big = if matches!(ty, WeightType::F32 | WeightType::BF16) {
                f32::INFINITY
            } else {
                1e30
            };
            let col = ty.block_len().max(1) + 3;
            v[n + col] = big;
            let bytes = match rows(ty, &v, n, imp) {
                Ok(b) => b,
                // The quantizer itself refuses non-finite input for block
                // types; F32/BF16 copy it, which validation catches.
                Err(e) => panic!("{ty}: {e}"),
            };
            if matches!(
                ty,
                WeightType::Q3_K | WeightType::Q6_K | WeightType::IQ2_XXS
            ) {
                // ggml's Q3_K / Q6_K / IQ2_XXS searches give this block a
                // finite scale (the huge value is not represented; the
                // bytes are llama.cpp's): its check passes it, so does ours.
                assert_eq!(validate(ty, &bytes, n), Ok(()), "{ty}");
                continue;
            }
            let e = validate(ty, &bytes, n).expect_err(&format!("{ty}"));
            assert_eq!(e.row, 1, "{ty}: {e:?}");
            let want_block = if ty.block_len() == 1 { col } else { 1 };
            assert_eq!(e.block, want_block, "{ty}: {e:?}");
        }
    }

    #[test]
    fn half_bits_are_classified_as_ggml_does() {
        assert_eq!(f16_bad(0x3c00), None); // 1.0
        assert_eq!(f16_bad(0x7bff), None); // 65504, the largest finite
        assert_eq!(f16_bad(0x7c00), Some(false)); // +inf
        assert_eq!(f16_bad(0xfc00), Some(false)); // -inf
        assert_eq!(f16_bad(0x7e00), Some(true)); // NaN
        assert_eq!(bf16_bad(0x7f7f), None);
        assert_eq!(bf16_bad(0xff80), Some(false));
        assert_eq!(bf16_bad(0x7fc0), Some(true));
    }

    #[test]
    fn mxfp4_nan_exponent_is_refused() {
        let mut b = vec![0u8; 17 * 2];
        assert!(validate(WeightType::MXFP4, &b, 64).is_ok());
        b[17] = 0xff;
        let e = validate(WeightType::MXFP4, &b, 64).unwrap_err();
        assert_eq!((e.row, e.block), (0, 1));
    }
}
