//! Issue 49 on one GPU: the expert-parallel group (`backend/split`) over
//! logical shards of one device — every part a clone of the same
//! `CudaOps`, the rows and slot outputs copied through the host — gives
//! that device's own bits for every family and plan: the CUDA
//! `experts_slots`, `sum_slots` and `routing_upload`, and a group's pure
//! units run eagerly against the one device's replayed graphs.

#[allow(dead_code)]
#[path = "../common/split.rs"]
mod split;

use ds4_engine::Model;
use ds4_engine::backend::{Backend, CudaOps, KernelSet};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use split::{fixture, same_bits_on_every_plan_of};

use crate::ops::kq8::fast_gpu;
use crate::support::gpu;

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_deepseek_v4_on_a_group_equals_one_device() {
    let g = gpu();
    for case in ["tiny_a", "tiny_b"] {
        let dir = fixture(&format!("deepseek_v4/{case}"));
        let one = DeepseekV4Model::load(&dir, g.clone()).unwrap();
        same_bits_on_every_plan_of(case, &one, &g, |s| DeepseekV4Model::load(&dir, s).unwrap());
    }
}

/// ds4's GGUF stacks (IQ2_XXS, Q2_K, MXFP4, Q8_0) cut in place, on both
/// kernel sets (the fast set's int8 gathers included).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_deepseek_v4_gguf_on_a_group_equals_one_device() {
    let (model, mtp) = (
        fixture("deepseek_v4/ds4_gguf/model.gguf"),
        fixture("deepseek_v4/ds4_gguf/mtp.gguf"),
    );
    let sets: [(CudaOps, KernelSet); 2] =
        [(gpu(), KernelSet::Reference), (fast_gpu(), KernelSet::Fast)];
    for (g, set) in sets {
        assert_eq!(g.kernel_set(), set);
        let one = DeepseekV4Model::load_gguf(&model, Some(&mtp), g.clone()).unwrap();
        assert_eq!(one.backend(), g.id());
        same_bits_on_every_plan_of(&format!("ds4 gguf {set:?}"), &one, &g, |s| {
            DeepseekV4Model::load_gguf(&model, Some(&mtp), s).unwrap()
        });
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_glm5_next_on_a_group_equals_one_device() {
    let g = gpu();
    let dir = fixture("glm5_next/tiny_a");
    let one = Glm5NextModel::load(&dir, g.clone()).unwrap();
    same_bits_on_every_plan_of("glm5_next", &one, &g, |s| {
        Glm5NextModel::load(&dir, s).unwrap()
    });
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_qwen4_exp_on_a_group_equals_one_device() {
    let g = gpu();
    let dir = fixture("qwen4_exp/tiny_a");
    let one = Qwen4ExpModel::load(&dir, g.clone()).unwrap();
    same_bits_on_every_plan_of("qwen4_exp", &one, &g, |s| {
        Qwen4ExpModel::load(&dir, s).unwrap()
    });
}

/// `--devices cuda:0,cuda:0`'s load: the group variant, the home's
/// backend id; a family without routed experts is refused, saying why.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_a_device_list_loads_a_group() {
    use ds4_engine::families::{Device, LoadedModel};
    let shards = "cuda:0,cuda:0".parse().unwrap();
    let dir = fixture("deepseek_v4/tiny_a");
    let group = LoadedModel::load_on(&dir, Device::CudaGroup(shards)).unwrap();
    assert!(matches!(group, LoadedModel::DeepseekV4CudaGroup(_)));
    let one = LoadedModel::load_on(&dir, Device::Cuda(0)).unwrap();
    assert_eq!(group.backend(), one.backend());
    match LoadedModel::load_on(&fixture("llama/tiny/f32_tied"), Device::CudaGroup(shards)) {
        Err(e) => assert!(e.to_string().contains("has none"), "{e}"),
        Ok(_) => panic!("a llama model has no routed experts to split"),
    }
}
