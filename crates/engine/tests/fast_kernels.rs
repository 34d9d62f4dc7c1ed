//! The fast CPU kernel set (`--kernels fast`: activations rounded to int8
//! per 32 values before every Q4_1 / Q8_0 product) keeps every contract the
//! reference set keeps, on its own bits:
//!
//! - the conformance suite (`common/conformance.rs`) on the default model
//!   with its MTP head — chunkings, single steps and verify windows give
//!   the same bits, warm == cold, export / import, window commits, greedy
//!   MTP == AR, cancellation — and on antirez/ds4's DeepSeek-V4 GGUF
//!   layout (its Q8_0 attention and its IQ2_XXS / Q2_K expert gate/up run
//!   the fast products);
//! - pinned bits of the default model under this set
//!   (`tests/fixtures/bits/default_model.{isa}-fast.txt`);
//! - a checkpoint written by one set is refused by the other;
//! - the tiny ds4 GGUF fixture stays within a stated bound of the
//!   dequantized-f32 model (which runs f32 products in both sets).
//!
//! One process runs one kernel set (weights are laid out for it at load):
//! every test here chooses the fast set first, so the binary runs it
//! whatever the runner (nextest runs each test in a process of its own).

#[macro_use]
#[path = "common/conformance.rs"]
mod checks;
mod common;
#[path = "common/pinned.rs"]
mod pinned;
#[path = "common/stored_vs_f32.rs"]
mod stored_vs_f32;

use checks::*;
use ds4_engine::backend::kernel_set::{self, KernelSet};
use ds4_engine::backend::{Backend, CpuOps};

/// Fix this process's kernel set to fast (before any load).
fn fast() {
    kernel_set::choose(KernelSet::Fast).expect("every test of this binary runs the fast set");
    assert!(CpuOps.id().kernels.ends_with("-fast"));
}

fn default_model_with_head() -> ds4_engine::families::llama::LlamaModel {
    fast();
    let path = ds4_models::default_model_path().expect("default model available");
    let head = ds4_models::mtp_head_for(&path)
        .expect("the default model has a head")
        .expect("the head file checks out");
    let mut m = ds4_engine::families::llama::load_llama(&path).unwrap();
    m.attach_mtp_head(&head).unwrap();
    m
}

conformance!(
    llama_mtp_default_model_fast,
    super::default_model_with_head,
    {}
);

conformance_state!(deepseek_v4_ds4_gguf_fast, || {
    super::fast();
    let dir = super::fixtures().join("deepseek_v4/ds4_gguf");
    ds4_engine::families::deepseek_v4::DeepseekV4Model::load_gguf(
        &dir.join("model.gguf"),
        Some(&dir.join("mtp.gguf")),
        ds4_engine::backend::CpuOps,
    )
    .unwrap()
});

#[test]
fn pinned_bits_default_model_fast() {
    use pinned::{Record, kernels, prompt, trunk, turn_and_checkpoint};
    fast();
    let path = ds4_models::default_model_path().expect("default model available");
    let model = ds4_engine::families::llama::load_llama(&path).expect("default model loads");
    let p = prompt(ds4_engine::Model::vocab_size(&model));
    let mut rec = Record::default();
    trunk(&model, &p, &mut rec);
    turn_and_checkpoint(&model, &p, None, &mut rec);
    let case = format!("default_model.{}", kernels());
    assert!(case.ends_with("-fast"), "{case}");
    rec.check(&case);
}

#[test]
fn checkpoints_of_one_kernel_set_are_refused_by_the_other_default_model() {
    use ds4_engine::state::checkpoint::{self, format};
    let model = default_model_with_head();
    let path = ds4_models::default_model_path().unwrap();
    let family = ds4_engine::Model::descriptor(&model).name;
    let fast_id = CpuOps::id_for(KernelSet::Fast);
    assert_eq!(fast_id, ds4_engine::Model::backend(&model));
    let reference_id = CpuOps::id_for(KernelSet::Reference);
    let fast_identity = checkpoint::identity(&path, family, &fast_id).unwrap();
    let reference_identity = checkpoint::identity(&path, family, &reference_id).unwrap();
    assert_ne!(fast_identity.model, reference_identity.model);

    let prompt: Vec<u32> = (0..24u32).map(|i| 100 + 37 * i).collect();
    let image = cold(&model, &prompt, 0).export().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (written, other) in [
        (&fast_identity, &reference_identity),
        (&reference_identity, &fast_identity),
    ] {
        let file = dir.path().join("set.ckpt");
        format::write(&file, written, &image).unwrap();
        assert!(format::read(&file, written).is_ok());
        let refused = format::read(&file, other).expect_err("the other set's checkpoint");
        assert!(refused.to_string().contains("model"), "{refused}");
    }
}

#[test]
fn ds4_gguf_fixture_stays_within_the_activation_rounding_of_f32() {
    fast();
    let dir = fixtures().join("deepseek_v4/ds4_gguf");
    let g = ds4_engine::families::deepseek_v4::DeepseekV4Model::load_gguf(
        &dir.join("model.gguf"),
        Some(&dir.join("mtp.gguf")),
        CpuOps,
    )
    .unwrap();
    let f =
        ds4_engine::families::deepseek_v4::DeepseekV4Model::from_hf_dir(&dir.join("f32")).unwrap();
    // The reference set matches the dequantized model to 1e-4 of the
    // largest logit (`deepseek_v4_gguf.rs`). Here the Q8_0 products and
    // the IQ2_XXS / Q2_K expert gate/up products (`kq8_matmul`, rows of 256)
    // see activations rounded to int8 (each moves by at most 1/254 of its
    // block's or super-block's largest value), through three layers of a
    // random model whose routing the rounding may flip (a flipped expert is
    // a large local change): measured 2.09e-2 of the largest logit (2.05e-2
    // with the Q8_0 products alone), top-1 equal at every position. Stated
    // bounds: 5e-2, and top-1 equal at ≥ 90 % of them.
    use ds4_engine::{LogitsRows, Model};
    let ids = stored_vs_f32::tokens(g.vocab_size());
    let og = g
        .forward(&ids, &mut g.new_state(), LogitsRows::All)
        .unwrap();
    let of = f
        .forward(&ids, &mut f.new_state(), LogitsRows::All)
        .unwrap();
    let err = stored_vs_f32::close("fast vs f32 one shot", &og.logits, &of.logits, 5e-2);
    let v = g.vocab_size();
    let same_top = og
        .logits
        .chunks(v)
        .zip(of.logits.chunks(v))
        .filter(|(a, b)| common::argmax(a) == common::argmax(b))
        .count();
    eprintln!(
        "fast vs f32: max error {err:e} of the largest logit, top-1 equal at {same_top}/{}",
        ids.len()
    );
    assert!(
        same_top * 10 >= ids.len() * 9,
        "top-1 equal at {same_top}/{}",
        ids.len()
    );
}
