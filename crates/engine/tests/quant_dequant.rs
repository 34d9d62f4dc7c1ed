//! Dequantization against the committed oracle fixtures
//! (`tests/fixtures/quant/`, made by `tools/oracle/quant/generate.py`):
//! gguf-py's NumPy dequantizers (checked there against llama.cpp's C) for the
//! GGUF block types, llama.cpp's C for Q8_K, torch for the FP8 / E8M0 codes
//! and the OCP MX table for FP4 pairs. Every value must match bit for bit
//! (any NaN matches any NaN), including blocks whose scales are the largest
//! finite f16, subnormals, zeros and negatives.

use std::path::PathBuf;

use ds4_engine::quant::WeightType;
use ds4_engine::quant::dequant;
use safetensors::SafeTensors;

/// A fixture's stored rows (`blocks`, U8) and expected values (`values`, F32).
struct Fixture {
    rows: usize,
    blocks: Vec<u8>,
    values: Vec<f32>,
}

fn fixture(name: &str) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/quant")
        .join(format!("{name}.safetensors"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let blocks = st.tensor("blocks").unwrap();
    let values = st.tensor("values").unwrap();
    assert_eq!(blocks.dtype(), safetensors::Dtype::U8, "{name}");
    assert_eq!(values.dtype(), safetensors::Dtype::F32, "{name}");
    assert_eq!(blocks.shape()[0], values.shape()[0], "{name}: row counts");
    Fixture {
        rows: blocks.shape()[0],
        blocks: blocks.data().to_vec(),
        values: values
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

/// Asserts bit equality value by value, naming the first mismatches with
/// their row (block or code) and position.
fn assert_bits(what: &str, got: &[f32], want: &[f32], per_row: usize) {
    assert_eq!(got.len(), want.len(), "{what}: value count");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !(g.is_nan() && w.is_nan()) && g.to_bits() != w.to_bits())
        .map(|(i, (g, w))| {
            format!(
                "row {} value {}: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
                i / per_row,
                i % per_row,
                g.to_bits(),
                w.to_bits()
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} values differ:\n{}",
        bad.len(),
        got.len(),
        bad[..bad.len().min(12)].join("\n")
    );
}

/// A GGUF block type: all blocks in one call, then block by block (a row
/// of one block must give the same values as the same block among others).
fn check_blocks(name: &str, ty: WeightType) {
    let f = fixture(name);
    assert_eq!(
        f.blocks.len(),
        f.rows * ty.block_bytes(),
        "{name}: block bytes"
    );
    let mut out = vec![0f32; f.rows * ty.block_len()];
    dequant::blocks(ty, &f.blocks, &mut out);
    assert_bits(name, &out, &f.values, ty.block_len());

    let mut one = vec![0f32; ty.block_len()];
    for (b, want) in f
        .blocks
        .chunks_exact(ty.block_bytes())
        .zip(f.values.chunks_exact(ty.block_len()))
    {
        dequant::blocks(ty, b, &mut one);
        assert_bits(name, &one, want, ty.block_len());
    }
}

#[test]
fn f16() {
    check_blocks("f16", WeightType::F16);
}

#[test]
fn bf16() {
    check_blocks("bf16", WeightType::BF16);
}

#[test]
fn q4_0() {
    check_blocks("q4_0", WeightType::Q4_0);
}

#[test]
fn q4_1() {
    check_blocks("q4_1", WeightType::Q4_1);
}

#[test]
fn q5_0() {
    check_blocks("q5_0", WeightType::Q5_0);
}

#[test]
fn q5_1() {
    check_blocks("q5_1", WeightType::Q5_1);
}

#[test]
fn q8_0() {
    check_blocks("q8_0", WeightType::Q8_0);
}

#[test]
fn mxfp4() {
    check_blocks("mxfp4", WeightType::MXFP4);
}

#[test]
fn q2_k() {
    check_blocks("q2_k", WeightType::Q2_K);
}

#[test]
fn q3_k() {
    check_blocks("q3_k", WeightType::Q3_K);
}

#[test]
fn q4_k() {
    check_blocks("q4_k", WeightType::Q4_K);
}

#[test]
fn q5_k() {
    check_blocks("q5_k", WeightType::Q5_K);
}

#[test]
fn q6_k() {
    check_blocks("q6_k", WeightType::Q6_K);
}

#[test]
fn q8_k() {
    check_blocks("q8_k", WeightType::Q8_K);
}

#[test]
fn iq2_xxs() {
    check_blocks("iq2_xxs", WeightType::IQ2_XXS);
}

#[test]
fn iq4_nl() {
    check_blocks("iq4_nl", WeightType::IQ4_NL);
}

/// All 256 E4M3 codes, decoded directly and through `scaled` with scale 1
/// (an exact product, so the same bits).
#[test]
fn f8_e4m3_codes() {
    let f = fixture("f8_e4m3");
    assert_eq!(f.rows, 256);
    let direct: Vec<f32> = f.blocks.iter().map(|&b| dequant::e4m3_to_f32(b)).collect();
    assert_bits("e4m3_to_f32", &direct, &f.values, 1);
    let mut scaled = vec![0f32; 256];
    dequant::scaled(WeightType::FP8_E4M3, &f.blocks, &[1.0], 256, &mut scaled);
    assert_bits("scaled F8_E4M3", &scaled, &f.values, 1);
}

/// All 256 E8M0 codes (255 is NaN).
#[test]
fn e8m0_codes() {
    let f = fixture("e8m0");
    assert_eq!(f.rows, 256);
    let got: Vec<f32> = f.blocks.iter().map(|&b| dequant::e8m0_to_f32(b)).collect();
    assert_bits("e8m0_to_f32", &got, &f.values, 1);
}

/// All 256 bytes as E2M1 pairs (low nibble the even element), scale 1.
#[test]
fn fp4_e2m1_pairs() {
    let f = fixture("fp4_e2m1");
    assert_eq!(f.rows, 256);
    let mut got = vec![0f32; 512];
    dequant::scaled(WeightType::FP4_E2M1, &f.blocks, &[1.0], 512, &mut got);
    assert_bits("scaled FP4_E2M1", &got, &f.values, 2);
}
