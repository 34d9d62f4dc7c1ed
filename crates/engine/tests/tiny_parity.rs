//! Tiny random Hugging Face llama checkpoints against transformers' f32
//! logits (full rows; the vocabulary is 96).
//!
//! Tolerance 1e-4 absolute on logits of magnitude up to ~10: both sides run
//! the same f32 arithmetic in a different order (candle's gemm vs torch's
//! MKL/oneDNN blocking, fused RMSNorm/softmax kernels, RoPE tables), each
//! operation adding ~1e-7 relative error over a 2-layer, 32-wide network;
//! observed differences are around 1e-6. A wrong RoPE pairing, a scaling
//! rule off by one branch or a mis-bound tensor moves logits by 1e-2 or more.
//! The bf16 checkpoint is held to the same bound: its reference is the f32
//! forward of the same bf16-rounded weights, which is what we compute after
//! upcasting on load (a bf16-activation reference would need ~1e-2).

mod common;

use common::{Reference, max_abs_diff, tiny};
use ds4_engine::families::llama::load_llama;
use ds4_engine::{LogitsRows, Model, ModelState};

const TOL: f32 = 1e-4;

fn check_variant(variant: &str) -> f32 {
    let model = load_llama(&tiny(variant)).expect("tiny checkpoint loads");
    let reference = Reference::open(
        &common::fixtures()
            .join("tiny")
            .join(format!("{variant}.logits.safetensors")),
    );
    let mut worst = 0f32;
    for p in 0.. {
        let key = format!("p{p}.tokens");
        if !reference.has(&key) {
            assert!(p >= 2, "{variant}: expected at least two prompts");
            break;
        }
        let tokens = reference.ids(&key);
        let (shape, want) = reference.f32(&format!("p{p}.logits"));
        let mut state = model.new_state();
        let out = model.forward(&tokens, &mut state, LogitsRows::All).unwrap();
        assert_eq!((out.rows, out.vocab), (shape[0], shape[1]));
        assert_eq!(state.len(), tokens.len());
        let d = max_abs_diff(&out.logits, &want);
        assert!(d <= TOL, "{variant} prompt {p}: max |Δlogit| {d} > {TOL}");
        worst = worst.max(d);
    }
    eprintln!("{variant}: max |Δlogit| = {worst:e}");
    worst
}

#[test]
fn f32_untied_matches_transformers() {
    check_variant("f32_untied");
}

#[test]
fn f32_tied_matches_transformers() {
    check_variant("f32_tied");
}

#[test]
fn f32_sharded_matches_transformers() {
    check_variant("f32_sharded");
}

#[test]
fn bf16_matches_transformers() {
    check_variant("bf16");
}

#[test]
fn rope_llama3_matches_transformers() {
    check_variant("rope_llama3");
}

#[test]
fn rope_linear_legacy_config_matches_transformers() {
    check_variant("rope_linear");
}

#[test]
fn sharded_checkpoint_lists_every_shard_tensor() {
    // Same architecture as the single-file variant: the three shards together
    // must hold exactly the single file's tensor set.
    let sharded = ds4_engine::inspect::inspect(&tiny("f32_sharded")).unwrap();
    let single = ds4_engine::inspect::inspect(&tiny("f32_untied")).unwrap();
    let names = |i: &ds4_engine::inspect::ModelInfo| {
        i.tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&sharded), names(&single));
    assert_eq!(sharded.parameter_count, single.parameter_count);
}
