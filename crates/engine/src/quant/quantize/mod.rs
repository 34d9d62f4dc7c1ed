//! Quantization: f32 rows to a stored type's bytes, byte for byte what
//! ggml's reference quantizers (`ggml-quants.c`, `quantize_row_*_ref` and
//! `quantize_*` with an importance matrix) write for the same input, so a
//! file `ds4server quantize` makes equals `llama-quantize`'s block for block.
//!
//! [`rows`] is the one entry point: the command (`ds4server quantize`)
//! streams a tensor's rows through it and never looks at a block layout.
//!
//! Each type is a transcription of its C, kept in the C's float operation
//! order (Rust never contracts `a*b + c` into an FMA, and the reference is
//! built without FMA), so every search takes the same branches: see
//! `scalar.rs` for the conversions, `search.rs` for the shared scale
//! searches. Proven against llama.cpp's own functions by
//! `tests/quant_quantize.rs` on the fixtures `tools/oracle/quant/quantize.py`
//! writes.

// The quantizers index their arrays as the C does (`x[16*j + ii]`,
// `L[j + l + 32]`), so each line can be checked against its original.
#[allow(clippy::needless_range_loop)]
mod iq2_grid;
#[allow(clippy::needless_range_loop)]
mod iq2_xxs;
#[allow(clippy::needless_range_loop)]
mod iq4_nl;
mod k_common;
#[allow(clippy::needless_range_loop)]
mod legacy;
#[allow(clippy::needless_range_loop)]
mod q2_k;
#[allow(clippy::needless_range_loop)]
mod q3_k;
#[allow(clippy::needless_range_loop)]
mod q45_k;
#[allow(clippy::needless_range_loop)]
mod q6_k;
mod q8_k;
mod scalar;
#[allow(clippy::needless_range_loop)]
mod search;

use super::types::WeightType;
use half::{bf16, f16};
use q45_k::Kind;

/// Why a tensor could not be quantized to the requested type.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantizeError {
    #[error("quantizing to {0} is not supported")]
    Unsupported(WeightType),
    #[error("{ty}: a row of {row_len} values is not a whole number of {block}-value blocks")]
    PartialBlock {
        ty: WeightType,
        row_len: usize,
        block: usize,
    },
    #[error("{0} needs an importance matrix (llama.cpp's --imatrix file)")]
    NeedsImportance(WeightType),
    #[error("importance matrix has {got} values, the rows have {want}")]
    ImportanceLength { got: usize, want: usize },
    /// NaN or infinity in the input: ggml's searches would turn it into
    /// garbage levels (and llama-quantize's validation rejects the result).
    #[error("{what} {index} is {value} (only finite values can be quantized)")]
    NonFinite {
        what: &'static str,
        index: usize,
        value: f32,
    },
    /// A row on which llama.cpp's quantizer aborts (IQ2_XXS's
    /// `GGML_ASSERT`s: no grid neighbour with a finite error, levels off
    /// the grid, a NaN scale). No tested row reaches one, rows whose
    /// squares overflow f32 included.
    #[error("{ty}: row {row}: {reason}")]
    Search {
        ty: WeightType,
        row: usize,
        reason: &'static str,
    },
}

/// Quantizes `values` (whole rows of `row_len` values, row-major) to `ty`.
/// `importance` (one weight per column, llama.cpp's imatrix entry for this
/// tensor) steers the types that search their scales with one; types that
/// need one (IQ2_XXS) refuse without it.
///
/// Byte for byte `ggml_quantize_chunk`: without importance the
/// `quantize_row_*_ref` functions (what `quantize_q4_K(…, NULL)` and the
/// like call), with it the `_impl` searches, row by row; IQ4_NL is
/// `quantize_iq4_nl` either way (its `_ref` is not what llama-quantize
/// writes). Q8_0, MXFP4 and Q8_K have no importance path and ignore one.
pub fn rows(
    ty: WeightType,
    values: &[f32],
    row_len: usize,
    importance: Option<&[f32]>,
) -> Result<Vec<u8>, QuantizeError> {
    let block = ty.block_len();
    if row_len == 0 || !row_len.is_multiple_of(block) || !values.len().is_multiple_of(row_len) {
        return Err(QuantizeError::PartialBlock { ty, row_len, block });
    }
    if let Some(w) = importance
        && w.len() != row_len
    {
        return Err(QuantizeError::ImportanceLength {
            got: w.len(),
            want: row_len,
        });
    }
    if ty.block_len() > 1 {
        check_finite("value", values)?;
        if let Some(w) = importance {
            check_finite("importance", w)?;
        }
    }
    let block_rows = |f: &dyn Fn(&[f32], &mut Vec<u8>)| {
        let mut out = Vec::with_capacity(values.len() / block * ty.block_bytes());
        for row in values.chunks_exact(row_len) {
            f(row, &mut out);
        }
        out
    };
    match (ty, importance) {
        (WeightType::Q4_0, None) => Ok(block_rows(&legacy::q4_0)),
        (WeightType::Q4_0, Some(w)) => Ok(block_rows(&|x, o| legacy::q4_0_imatrix(x, w, o))),
        (WeightType::Q4_1, None) => Ok(block_rows(&legacy::q4_1)),
        (WeightType::Q4_1, Some(w)) => Ok(block_rows(&|x, o| legacy::q4_1_imatrix(x, w, o))),
        (WeightType::Q5_0, None) => Ok(block_rows(&legacy::q5_0)),
        (WeightType::Q5_0, Some(w)) => Ok(block_rows(&|x, o| legacy::q5_0_imatrix(x, w, o))),
        (WeightType::Q5_1, None) => Ok(block_rows(&legacy::q5_1)),
        (WeightType::Q5_1, Some(w)) => Ok(block_rows(&|x, o| legacy::q5_1_imatrix(x, w, o))),
        (WeightType::Q8_0, _) => Ok(block_rows(&legacy::q8_0)),
        (WeightType::MXFP4, _) => Ok(block_rows(&legacy::mxfp4)),
        (WeightType::Q2_K, None) => Ok(block_rows(&q2_k::q2_k)),
        (WeightType::Q2_K, Some(w)) => Ok(block_rows(&|x, o| q2_k::q2_k_imatrix(x, w, o))),
        (WeightType::Q3_K, None) => Ok(block_rows(&q3_k::q3_k)),
        (WeightType::Q3_K, Some(w)) => Ok(block_rows(&|x, o| q3_k::q3_k_imatrix(x, w, o))),
        (WeightType::Q4_K, None) => Ok(block_rows(&|x, o| q45_k::q45_k(Kind::Q4, x, o))),
        (WeightType::Q4_K, Some(w)) => {
            Ok(block_rows(&|x, o| q45_k::q45_k_imatrix(Kind::Q4, x, w, o)))
        }
        (WeightType::Q5_K, None) => Ok(block_rows(&|x, o| q45_k::q45_k(Kind::Q5, x, o))),
        (WeightType::Q5_K, Some(w)) => {
            Ok(block_rows(&|x, o| q45_k::q45_k_imatrix(Kind::Q5, x, w, o)))
        }
        (WeightType::Q6_K, w) => Ok(block_rows(&|x, o| q6_k::q6_k(x, w, o))),
        (WeightType::Q8_K, _) => Ok(block_rows(&q8_k::q8_k)),
        (WeightType::IQ4_NL, w) => Ok(block_rows(&|x, o| iq4_nl::iq4_nl(x, w, o))),
        (WeightType::IQ2_XXS, None) => Err(QuantizeError::NeedsImportance(ty)),
        (WeightType::IQ2_XXS, Some(w)) => {
            let mut out = Vec::with_capacity(values.len() / block * ty.block_bytes());
            for (row, x) in values.chunks_exact(row_len).enumerate() {
                iq2_xxs::iq2_xxs(x, w, &mut out).map_err(|reason| QuantizeError::Search {
                    ty,
                    row,
                    reason,
                })?;
            }
            Ok(out)
        }
        (WeightType::F32, _) => Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        (WeightType::F16, _) => Ok(values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect()),
        (WeightType::BF16, _) => Ok(values.iter().flat_map(|&v| bf16_ggml(v)).collect()),
        (other, _) => Err(QuantizeError::Unsupported(other)),
    }
}

fn check_finite(what: &'static str, v: &[f32]) -> Result<(), QuantizeError> {
    match v.iter().position(|x| !x.is_finite()) {
        Some(index) => Err(QuantizeError::NonFinite {
            what,
            index,
            value: v[index],
        }),
        None => Ok(()),
    }
}

/// ggml's `GGML_FP32_TO_BF16`: round to nearest even, NaN kept quiet (not
/// `half`'s conversion, which differs for NaN payloads).
fn bf16_ggml(v: f32) -> [u8; 2] {
    let u = v.to_bits();
    let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        ((u >> 16) | 64) as u16
    } else {
        ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
    };
    bf16::from_bits(h).to_le_bytes()
}
