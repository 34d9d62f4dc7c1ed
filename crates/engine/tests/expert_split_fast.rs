//! Expert parallel on the fast kernel set (issue 49): ds4's GGUF layout,
//! whose stored stacks (IQ2_XXS, Q2_K, MXFP4, Q8_0) run the int8 products,
//! gives the one-device bits on every plan's CPU group. Every test of this
//! binary chooses the fast set first.

#[path = "common/split.rs"]
mod split;

use ds4_engine::Model;
use ds4_engine::backend::{CpuOps, KernelSet, kernel_set};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use split::{fixture, same_bits_on_every_plan};

#[test]
fn deepseek_v4_gguf_on_a_group_equals_one_device_fast() {
    kernel_set::choose(KernelSet::Fast).expect("every test of this binary runs the fast set");
    let (model, mtp) = (
        fixture("deepseek_v4/ds4_gguf/model.gguf"),
        fixture("deepseek_v4/ds4_gguf/mtp.gguf"),
    );
    let one = DeepseekV4Model::load_gguf(&model, Some(&mtp), CpuOps).unwrap();
    assert!(one.backend().kernels.contains("fast"), "{}", one.backend());
    same_bits_on_every_plan("ds4 gguf fast", &one, |g| {
        DeepseekV4Model::load_gguf(&model, Some(&mtp), g).unwrap()
    });
}
