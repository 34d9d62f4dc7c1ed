//! Pinned bits: the exact logits, MTP rows and checkpoint files the engine
//! produced before the op-inventory refactor, reproduced bit for bit.
//!
//! For the default model and every tiny `qwen4_exp`, `deepseek_v4` and `glm5_next` fixture, one fixed
//! prompt is run as one forward, as uneven chunks and as single steps (all
//! logits rows), plus (qwen4_exp) the MTP head over the trunk's hidden, a
//! verify window with a commit of a prefix, and a seeded MTP turn whose
//! session is written as a checkpoint file. Each logits row, hidden block
//! and file is recorded as an FNV-1a-64 hash of its bytes (plus the first
//! values, to make a failure readable) in
//! `tests/fixtures/bits/{case}.{kernels}.txt`.
//!
//! The default model's bits depend on the CPU kernel set (AVX2 or AVX-512
//! block matmul), so it has one file per set; a set the machine cannot run
//! is skipped. Regenerate (only when a change is *meant* to change bits, and
//! say so in the commit): `DS4_BLESS_BITS=1 cargo nextest run --release -E
//! 'test(/pinned_bits/)'`, once per kernel set (`DS4_CPU_KERNELS=avx2` for
//! the baseline).

#[path = "common/pinned.rs"]
mod pinned;

use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::llama::load_llama;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::{HiddenRows, LogitsRows, Model, ModelState};
use pinned::{Record, fixtures, kernels, prompt, table_bytes, trunk, turn_and_checkpoint};

#[test]
fn pinned_bits_default_model() {
    let path = ds4_models::default_model_path().expect("default model available");
    let model = load_llama(&path).expect("default model loads");
    let p = prompt(model.vocab_size());
    let mut rec = Record::default();
    trunk(&model, &p, &mut rec);
    turn_and_checkpoint(&model, &p, None, &mut rec);
    rec.check(&format!("default_model.{}", kernels()));
}

fn qwen_case(name: &str) {
    let model = Qwen4ExpModel::from_hf_dir(&fixtures().join("qwen4_exp").join(name)).unwrap();
    // qwen4_exp's kernels are compiled for the build baseline: one file for
    // every kernel set.
    family_case(&model, &format!("qwen4_exp_{name}"));
}

fn deepseek_case(name: &str) {
    let model = DeepseekV4Model::from_hf_dir(&fixtures().join("deepseek_v4").join(name)).unwrap();
    family_case(&model, &format!("deepseek_v4_{name}"));
}

fn glm_case(name: &str) {
    let model = Glm5NextModel::from_hf_dir(&fixtures().join("glm5_next").join(name)).unwrap();
    family_case(&model, &format!("glm5_next_{name}"));
}

/// A family written on the op inventory: trunk rows, and (with an MTP
/// head) the head, a verify window, a commit and a seeded MTP turn.
fn family_case<M: Model>(model: &M, case: &str) {
    let p = prompt(model.vocab_size());
    let mut rec = Record::default();
    trunk(model, &p, &mut rec);
    if model.mtp_contract().is_some() {
        // The head over the trunk's hidden of the whole prompt (row t with
        // token t + 1), then a verify window and a commit of two of its rows.
        let mut s = model.new_state();
        let (_, hidden) = model
            .forward_hidden(&p[..p.len() - 4], &mut s, LogitsRows::Last)
            .unwrap();
        let n = p.len() - 5;
        let rows = hidden.narrow(0, n).unwrap();
        let mut h = model.new_mtp_history().unwrap();
        let step = Model::mtp_forward(model, &p[1..=n], &rows, &mut h).unwrap();
        rec.values("mtp.logits", &step.logits);
        rec.values("mtp.hidden", &step.hidden.to_host().unwrap().2);
        let w = Model::forward_window(model, &p[p.len() - 4..], &mut s).unwrap();
        rec.rows("window", &w.logits, p.len() - 4);
        rec.values("window.hidden", &w.hidden.to_host().unwrap().2);
        ModelState::commit(&mut s, &w.record, 2).unwrap();
        for t in s.export().unwrap() {
            rec.bytes(&format!("commit.state.{}", t.name), &table_bytes(&t));
        }
        turn_and_checkpoint(model, &p, Some(3), &mut rec);
    } else {
        turn_and_checkpoint(model, &p, None, &mut rec);
    }
    rec.check(case);
}

#[test]
fn pinned_bits_qwen4_exp_tiny_a() {
    qwen_case("tiny_a");
}

#[test]
fn pinned_bits_qwen4_exp_tiny_b() {
    qwen_case("tiny_b");
}

#[test]
fn pinned_bits_qwen4_exp_tiny_bf16() {
    qwen_case("tiny_bf16");
}

#[test]
fn pinned_bits_deepseek_v4_tiny_a() {
    deepseek_case("tiny_a");
}

#[test]
fn pinned_bits_deepseek_v4_tiny_b() {
    deepseek_case("tiny_b");
}

#[test]
fn pinned_bits_glm5_next_tiny_a() {
    glm_case("tiny_a");
}

#[test]
fn pinned_bits_glm5_next_tiny_b() {
    glm_case("tiny_b");
}
