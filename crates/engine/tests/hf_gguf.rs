//! GGUF files in Hugging Face names (`docs/GGUF-LAYOUTS.md`, written by
//! `tools/oracle/hf_gguf/write.py` from the tiny fixtures with every 32-block
//! type, F16 and BF16): they load through the same family loaders as the
//! directories, stay in their stored types, and give the bits of the same
//! weights dequantized to f32 — one shot, in chunks and step by step: to
//! 1e-5 of the largest logit (Q4_1 and Q8_0 run the block kernels, whose
//! factored sums `Σ d·u·x + Σ m·Σx` round differently from the f32 kernel;
//! every other stored type runs the f32 kernel over its dequantized rows, so
//! a file without those two gives the same bits), and bit-identical across
//! the three ways of feeding the tokens.

use std::path::PathBuf;

use ds4_engine::families::LoadedModel;
use ds4_engine::{LogitsRows, Model};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hf_gguf")
        .join(name)
}

const TOKENS: [u32; 13] = [1, 5, 9, 17, 33, 2, 40, 11, 7, 3, 25, 6, 14];

/// Logits of every position: one shot, chunks of 3 and single steps.
fn runs<M: Model>(m: &M) -> [Vec<f32>; 3] {
    let mut st = m.new_state();
    let one = m.forward(&TOKENS, &mut st, LogitsRows::All).unwrap().logits;
    let mut st = m.new_state();
    let chunks = TOKENS
        .chunks(3)
        .flat_map(|c| m.forward(c, &mut st, LogitsRows::All).unwrap().logits)
        .collect();
    let mut st = m.new_state();
    let steps = TOKENS
        .chunks(1)
        .flat_map(|c| m.forward(c, &mut st, LogitsRows::All).unwrap().logits)
        .collect();
    [one, chunks, steps]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check(family: &str) {
    let gguf = LoadedModel::load(&fixture(&format!("{family}_tiny_a.gguf"))).unwrap();
    let f32s = LoadedModel::load(&fixture(&format!("{family}_tiny_a_dequantized"))).unwrap();
    assert_eq!(gguf.descriptor().name, family);
    let a = ds4_engine::with_model!(&gguf, m => runs(m));
    let b = ds4_engine::with_model!(&f32s, m => runs(m));
    let scale = b[0].iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, what) in ["one shot", "chunks of 3", "steps"].iter().enumerate() {
        assert!(a[i].iter().all(|v| v.is_finite()), "{family} {what}");
        let worst = a[i]
            .iter()
            .zip(&b[i])
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        eprintln!("{family} {what}: max |GGUF − f32| {worst:e}, largest logit {scale}");
        assert!(
            worst <= 1e-5 * scale,
            "{family} {what}: GGUF vs dequantized f32 differ by {worst} (largest logit {scale})"
        );
    }
    // Row independence inside the stored model, too.
    assert_eq!(bits(&a[0]), bits(&a[1]), "{family}: chunks");
    assert_eq!(bits(&a[0]), bits(&a[2]), "{family}: steps");
}

#[test]
fn qwen4_exp_gguf_in_hf_names_equals_its_dequantized_weights() {
    check("qwen4_exp");
}

#[test]
fn glm5_next_gguf_in_hf_names_equals_its_dequantized_weights() {
    check("glm5_next");
}

/// The file really keeps its block types (nothing was upcast by the writer).
#[test]
fn hf_gguf_fixture_keeps_block_types() {
    let info = ds4_engine::inspect::inspect(&fixture("qwen4_exp_tiny_a.gguf")).unwrap();
    for t in [
        "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "F16", "BF16",
    ] {
        assert!(info.dtype_histogram.contains_key(t), "{t} missing");
    }
    assert_eq!(info.family, Some("qwen4_exp"));
}

/// A GGUF without the embedded configuration or family is refused, naming
/// the key.
#[test]
fn hf_gguf_without_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    let mut f = b"GGUF".to_vec();
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&0u64.to_le_bytes());
    f.extend_from_slice(&1u64.to_le_bytes());
    let key = "general.architecture";
    f.extend_from_slice(&(key.len() as u64).to_le_bytes());
    f.extend_from_slice(key.as_bytes());
    f.extend_from_slice(&8u32.to_le_bytes());
    let v = "qwen4_exp_text";
    f.extend_from_slice(&(v.len() as u64).to_le_bytes());
    f.extend_from_slice(v.as_bytes());
    std::fs::write(&p, f).unwrap();
    let err = LoadedModel::load(&p).err().expect("refused").to_string();
    assert!(
        err.contains("not a supported family") || err.contains("ds4server.hf_config"),
        "{err}"
    );
}
