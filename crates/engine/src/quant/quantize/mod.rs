//! Quantization: f32 rows to a stored type's bytes, byte for byte what
//! ggml's reference quantizers (`ggml-quants.c`, `quantize_row_*_ref` and
//! `quantize_*` with an importance matrix) write for the same input, so a
//! file `ds4server quantize` makes equals `llama-quantize`'s block for block.
//!
//! [`rows`] is the one entry point: the command (`ds4server quantize`)
//! streams a tensor's rows through it and never looks at a block layout.

use super::types::WeightType;
use half::{bf16, f16};

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
}

/// Quantizes `values` (whole rows of `row_len` values, row-major) to `ty`.
/// `importance` (one weight per column, llama.cpp's imatrix entry for this
/// tensor) steers the types that search their scales with one; types that
/// need one (IQ2_XXS) refuse without it.
pub fn rows(
    ty: WeightType,
    values: &[f32],
    row_len: usize,
    importance: Option<&[f32]>,
) -> Result<Vec<u8>, QuantizeError> {
    let block = ty.block_len();
    if row_len == 0 || row_len % block != 0 || values.len() % row_len != 0 {
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
    match ty {
        WeightType::F32 => Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        WeightType::F16 => Ok(values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect()),
        WeightType::BF16 => Ok(values.iter().flat_map(|&v| bf16_ggml(v)).collect()),
        other => Err(QuantizeError::Unsupported(other)),
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
