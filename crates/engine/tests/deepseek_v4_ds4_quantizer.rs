//! A GGUF written by antirez/ds4's own quantizer (`gguf-tools/
//! deepseek4-quantize` at 8d57664, from a tiny checkpoint in DeepSeek-V4's
//! release form: FP8 E4M3 + E8M0 blocks, FP4 experts, BF16; the fixture's
//! README says how) against the same weights dequantized to f32.
//!
//! The f32 twin is gguf-py's: `tools/oracle/deepseek_v4/
//! ds4_quantizer_input.py twin` dequantized every tensor of ds4's file with
//! `gguf.quants.dequantize` and wrote `<recipe>.twin.json` (per GGUF tensor:
//! the upstream names it splits into and the SHA-256 of gguf-py's values,
//! plus the twin's `config.json`). The twin itself (6.6 MB of f32) is not
//! committed: this test dequantizes each tensor with the engine, requires
//! the SHA-256 of gguf-py's values (so the twin is gguf-py's, bit for bit),
//! writes it as a Hugging Face directory in a temporary folder and loads it
//! with `from_hf_dir`.
//!
//! The two loads must agree on the configuration and on the logits, one
//! shot, in chunks and step by step, within 1e-5 of the largest logit: the
//! CPU runs ds4's Q8_0 tensors (attention projections, shared experts,
//! output head) through its block kernel, the f32 copy through the f32
//! kernel, so the bits differ in the last places; every other type (ds4's
//! IQ2_XXS, Q2_K and Q4_K expert stacks, F16, F32) is the f32 kernel over
//! exactly dequantized rows. Within the GGUF model the three feeding modes
//! give identical bits.
//!
//! `DS4_QUANTIZER_FIXTURE=DIR` runs the same checks on another directory
//! laid out alike (`q2.gguf` + `q2.twin.json`, `q4.gguf` + `q4.twin.json`).

mod common;
#[path = "common/stored_vs_f32.rs"]
mod stored_vs_f32;

use std::path::{Path, PathBuf};

use ds4_engine::backend::CpuOps;
use ds4_engine::families::LoadedModel;
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::load::gguf::GgufFile;
use safetensors::Dtype;
use sha2::{Digest, Sha256};

/// GGML's I32 type id (`ffn_gate_tid2eid`).
const GGML_I32: u32 = 26;

fn dir() -> PathBuf {
    match std::env::var_os("DS4_QUANTIZER_FIXTURE") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/deepseek_v4/ds4_quantizer"),
    }
}

/// The recipes present: (name, ds4's GGUF, gguf-py's manifest).
fn recipes() -> Vec<(&'static str, PathBuf, PathBuf)> {
    let d = dir();
    let found: Vec<_> = ["q2", "q4"]
        .into_iter()
        .map(|r| {
            (
                r,
                d.join(format!("{r}.gguf")),
                d.join(format!("{r}.twin.json")),
            )
        })
        .filter(|(_, g, _)| g.exists())
        .collect();
    assert!(!found.is_empty(), "no ds4 GGUF in {}", d.display());
    found
}

/// gguf-py's twin of `gguf` as a Hugging Face directory under `out`: every
/// tensor dequantized by the engine and required to hash like gguf-py's.
fn write_twin(gguf: &Path, manifest: &Path, out: &Path) {
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let mut file = GgufFile::open(gguf).unwrap();
    let raw = std::fs::read(gguf).unwrap();
    let entries = m["tensors"].as_array().unwrap();
    assert_eq!(
        entries.len(),
        file.container().tensors.len(),
        "every tensor of the file is in the manifest"
    );
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for e in entries {
        let name = e["gguf"].as_str().unwrap();
        let dims: Vec<usize> = e["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let info = file.container().tensors[name].clone();
        assert_eq!(info.dims, dims, "{name}: dims");
        let (dtype, bytes) = if info.ggml_type == GGML_I32 {
            let n: usize = dims.iter().product();
            let b = &raw[info.offset..info.offset + 4 * n];
            let v: Vec<u8> = b
                .chunks_exact(4)
                .flat_map(|c| (i32::from_le_bytes(c.try_into().unwrap()) as i64).to_le_bytes())
                .collect();
            (Dtype::I64, v)
        } else {
            let v = file.tensor(name, &dims).unwrap().to_f32_vec();
            let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (Dtype::F32, b)
        };
        let hash: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hash,
            e["sha256"].as_str().unwrap(),
            "{name} ({}): the engine's dequantization differs from gguf-py's",
            e["type"]
        );
        let names = e["upstream"].as_array().unwrap();
        // A routed stack `[E, out, in]` splits into one matrix per expert.
        let (shape, step) = if names.len() > 1 {
            assert_eq!(names.len(), dims[0], "{name}: one name per expert");
            (dims[1..].to_vec(), bytes.len() / dims[0])
        } else {
            (dims.clone(), bytes.len())
        };
        for (i, n) in names.iter().enumerate() {
            tensors.push((
                n.as_str().unwrap().to_string(),
                dtype,
                shape.clone(),
                bytes[i * step..(i + 1) * step].to_vec(),
            ));
        }
    }
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&m["config"]).unwrap(),
    )
    .unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.join("model.safetensors")).unwrap();
}

/// (from ds4's GGUF, from gguf-py's f32 twin)
fn models(gguf: &Path, manifest: &Path) -> (DeepseekV4Model, DeepseekV4Model) {
    let g = DeepseekV4Model::load_gguf(gguf, None, CpuOps)
        .unwrap_or_else(|e| panic!("ds4 GGUF {}: {e}", gguf.display()));
    let tmp = tempfile::tempdir().unwrap();
    write_twin(gguf, manifest, tmp.path());
    let f = DeepseekV4Model::from_hf_dir(tmp.path()).unwrap_or_else(|e| panic!("f32 twin: {e}"));
    (g, f)
}

/// Deterministic tokens over the whole vocabulary.
#[test]
fn ds4_quantizer_gguf_config_equals_the_twin_config() {
    for (r, gguf, manifest) in recipes() {
        let (g, f) = models(&gguf, &manifest);
        assert_eq!(g.config(), f.config(), "{r}");
        let c = g.config();
        println!(
            "{r}: {} layers {:?} {:?}, {} experts (k {}), hc {}, eos {:?}",
            c.num_layers,
            c.attn,
            c.mlp,
            c.n_routed_experts,
            c.num_experts_per_tok,
            c.hc_mult,
            c.eos_token_id
        );
        assert!(!g.has_mtp() && !f.has_mtp(), "{r}: no MTP file here");
        // The family dispatch recognises ds4's file too.
        let m = LoadedModel::load(&gguf).unwrap();
        assert_eq!(m.family_name(), "deepseek_v4");
    }
}

#[test]
fn ds4_quantizer_gguf_logits_equal_f32_one_shot_chunks_and_steps() {
    for (r, gguf, manifest) in recipes() {
        let (g, f) = models(&gguf, &manifest);
        let worst = stored_vs_f32::compare(&format!("{r} "), &g, &f, 1e-5);
        println!("{r}: worst max |Δ|/max|logit| = {worst:.3e}");
    }
}
