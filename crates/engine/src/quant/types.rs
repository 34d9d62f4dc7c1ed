//! [`WeightType`]: the stored element types this engine computes with, and
//! the names of every GGML type id (so an unsupported one is named in an
//! error, `IQ3_S`, never "dtype 21").

use std::fmt;

/// A stored weight type. GGUF block types keep GGML's names and layouts
/// (`ggml-common.h`); the last two are safetensors element types whose
/// scales live in a companion tensor ([`super::ScaleGrid`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    /// GGUF's IQ4_NL block: an f16 scale, then 16 bytes of 4-bit indices
    /// into the non-linear table `kvalues_iq4nl` (low nibble element `j`,
    /// high nibble element `j + 16`).
    IQ4_NL,
    /// GGUF's MXFP4 block: one E8M0 scale, then 16 bytes of E2M1 pairs
    /// (low nibble element `j`, high nibble element `j + 16`).
    MXFP4,
    /// safetensors `F8_E4M3` (one byte per value), scaled per block by a
    /// [`super::ScaleGrid`] (DeepSeek / GLM FP8 releases).
    FP8_E4M3,
    /// DeepSeek-V4's routed experts: E2M1 pairs in `I8` bytes (low nibble
    /// the even element), scaled by an E8M0 [`super::ScaleGrid`] per 32
    /// inputs.
    FP4_E2M1,
}

impl WeightType {
    /// Every type, in GGML id order then the safetensors ones.
    pub const ALL: [WeightType; 19] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
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
        WeightType::Q8_K,
        WeightType::IQ2_XXS,
        WeightType::IQ4_NL,
        WeightType::MXFP4,
        WeightType::FP8_E4M3,
        WeightType::FP4_E2M1,
    ];

    /// The GGML type id (`enum ggml_type`); `None` for the safetensors-only
    /// types.
    pub fn ggml_id(self) -> Option<u32> {
        Some(match self {
            WeightType::F32 => 0,
            WeightType::F16 => 1,
            WeightType::Q4_0 => 2,
            WeightType::Q4_1 => 3,
            WeightType::Q5_0 => 6,
            WeightType::Q5_1 => 7,
            WeightType::Q8_0 => 8,
            WeightType::Q2_K => 10,
            WeightType::Q3_K => 11,
            WeightType::Q4_K => 12,
            WeightType::Q5_K => 13,
            WeightType::Q6_K => 14,
            WeightType::Q8_K => 15,
            WeightType::IQ2_XXS => 16,
            WeightType::IQ4_NL => 20,
            WeightType::BF16 => 30,
            WeightType::MXFP4 => 39,
            WeightType::FP8_E4M3 | WeightType::FP4_E2M1 => return None,
        })
    }

    /// The type of GGML id `id`, when this engine computes with it.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == Some(id))
    }

    /// Values per block (1 for plain element types, 2 for FP4 pairs).
    pub fn block_len(self) -> usize {
        match self {
            WeightType::F32 | WeightType::F16 | WeightType::BF16 | WeightType::FP8_E4M3 => 1,
            WeightType::FP4_E2M1 => 2,
            WeightType::Q4_0
            | WeightType::Q4_1
            | WeightType::Q5_0
            | WeightType::Q5_1
            | WeightType::Q8_0
            | WeightType::IQ4_NL
            | WeightType::MXFP4 => 32,
            WeightType::Q2_K
            | WeightType::Q3_K
            | WeightType::Q4_K
            | WeightType::Q5_K
            | WeightType::Q6_K
            | WeightType::Q8_K
            | WeightType::IQ2_XXS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::F16 | WeightType::BF16 => 2,
            WeightType::FP8_E4M3 | WeightType::FP4_E2M1 => 1,
            WeightType::Q4_0 | WeightType::IQ4_NL => 18,
            WeightType::Q4_1 => 20,
            WeightType::Q5_0 => 22,
            WeightType::Q5_1 => 24,
            WeightType::Q8_0 => 34,
            WeightType::MXFP4 => 17,
            WeightType::Q2_K => 84,
            WeightType::Q3_K => 110,
            WeightType::Q4_K => 144,
            WeightType::Q5_K => 176,
            WeightType::Q6_K => 210,
            WeightType::Q8_K => 292,
            WeightType::IQ2_XXS => 66,
        }
    }

    /// Bytes of one row of `cols` values; `None` when `cols` is not a whole
    /// number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_len())
            .then(|| cols / self.block_len() * self.block_bytes())
    }

    /// Whether the values need a separate scale tensor.
    pub fn needs_scales(self) -> bool {
        matches!(self, WeightType::FP8_E4M3 | WeightType::FP4_E2M1)
    }

    /// The name GGML (or safetensors) uses.
    pub fn name(self) -> &'static str {
        match self {
            WeightType::FP8_E4M3 => "F8_E4M3",
            WeightType::FP4_E2M1 => "FP4_E2M1 (I8 pairs)",
            t => ggml_type_name(t.ggml_id().unwrap_or(u32::MAX)),
        }
    }
}

impl fmt::Display for WeightType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// GGML's name for type id `id` (`ggml.c`'s `type_traits`), for errors
/// about types this engine does not compute with.
pub fn ggml_type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        4 => "Q4_2 (removed)",
        5 => "Q4_3 (removed)",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        31..=33 => "Q4_0_4_4/4_8/8_8 (removed)",
        34 => "TQ1_0",
        35 => "TQ2_0",
        36..=38 => "IQ4_NL_4_4/4_8/8_8 (removed)",
        39 => "MXFP4",
        _ => "an unknown GGML type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_names_match_ggml() {
        for t in WeightType::ALL {
            if let Some(id) = t.ggml_id() {
                assert_eq!(WeightType::from_ggml_id(id), Some(t));
                assert_eq!(ggml_type_name(id), format!("{t:?}"));
            }
        }
        assert_eq!(WeightType::from_ggml_id(21), None);
        assert_eq!(ggml_type_name(21), "IQ3_S");
    }

    #[test]
    fn block_geometry_is_ggml_s() {
        // sizeof(block_*) in ggml-common.h.
        let want = [
            (WeightType::Q2_K, 84),
            (WeightType::Q3_K, 110),
            (WeightType::Q4_K, 144),
            (WeightType::Q5_K, 176),
            (WeightType::Q6_K, 210),
            (WeightType::IQ2_XXS, 66),
            (WeightType::MXFP4, 17),
            (WeightType::IQ4_NL, 18),
        ];
        for (t, b) in want {
            assert_eq!(t.block_bytes(), b, "{t}");
        }
        assert_eq!(WeightType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(WeightType::Q4_K.row_bytes(100), None);
    }
}
