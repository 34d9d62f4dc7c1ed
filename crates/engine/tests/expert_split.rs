//! Expert parallel on one machine (issue 49): every family's tiny fixture
//! on a group of CPU devices ([`Split`], the host-copy transport) gives the
//! one-device bits, for every plan: prefill, decode steps, a verify window
//! and the MTP head. Each run asserts that the experts really were split
//! (slots computed on more than one device, buffers exchanged).

#[path = "common/split.rs"]
mod split;

use std::sync::Arc;

use ds4_engine::Model;
use ds4_engine::backend::CpuOps;
use ds4_engine::backend::split::{ExpertSplit, HostCopy, Split};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use split::{fixture, same_bits_on_every_plan};

#[test]
fn deepseek_v4_on_a_group_equals_one_device() {
    for case in ["tiny_a", "tiny_b"] {
        let dir = fixture(&format!("deepseek_v4/{case}"));
        let one = DeepseekV4Model::load(&dir, CpuOps).unwrap();
        assert!(one.mtp_contract().is_some());
        same_bits_on_every_plan(case, &one, |g| DeepseekV4Model::load(&dir, g).unwrap());
    }
}

/// ds4's GGUF layout: stored stacks cut by expert rows in place.
#[test]
fn deepseek_v4_gguf_stacks_split_in_place() {
    let (model, mtp) = (
        fixture("deepseek_v4/ds4_gguf/model.gguf"),
        fixture("deepseek_v4/ds4_gguf/mtp.gguf"),
    );
    let one = DeepseekV4Model::load_gguf(&model, Some(&mtp), CpuOps).unwrap();
    same_bits_on_every_plan("ds4 gguf", &one, |g| {
        DeepseekV4Model::load_gguf(&model, Some(&mtp), g).unwrap()
    });
}

#[test]
fn glm5_next_on_a_group_equals_one_device() {
    let dir = fixture("glm5_next/tiny_a");
    let one = Glm5NextModel::load(&dir, CpuOps).unwrap();
    same_bits_on_every_plan("glm5_next", &one, |g| Glm5NextModel::load(&dir, g).unwrap());
}

#[test]
fn qwen4_exp_on_a_group_equals_one_device() {
    let dir = fixture("qwen4_exp/tiny_a");
    let one = Qwen4ExpModel::load(&dir, CpuOps).unwrap();
    same_bits_on_every_plan("qwen4_exp", &one, |g| Qwen4ExpModel::load(&dir, g).unwrap());
}

/// Devices whose kernels differ cannot form a group; the plan's device
/// count must match.
#[test]
fn a_group_is_refused_when_its_parts_disagree() {
    let err = Split::new(
        vec![CpuOps; 3],
        ExpertSplit::even(2).unwrap(),
        Arc::new(HostCopy),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("over 2 devices was given 3"), "{err}");
}
