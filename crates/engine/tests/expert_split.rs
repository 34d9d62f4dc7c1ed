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
use ds4_engine::decode::{self, LiveSession, TurnConfig, TurnRequest};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_sampling::{Law, Sampler};
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

/// One turn of `depth` on `session` (the ds4 law, seeded; `temperature` 0
/// is greedy).
fn turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    depth: usize,
    temperature: f64,
) -> Vec<u32> {
    let mut params = Law::Ds4.default_params();
    params.temperature = temperature;
    let mut sampler = Sampler::new(Law::Ds4, params, 11).unwrap();
    let config = TurnConfig {
        max_tokens: 9,
        stop_token_ids: vec![],
        prefill_chunk: 2048,
        logprobs: None,
        cancel: Default::default(),
    };
    let request = TurnRequest {
        prompt,
        sampler: &mut sampler,
        config,
        mtp_depth: Some(depth),
    };
    decode::generate(model, session, request, &mut ())
        .unwrap()
        .tokens
}

/// Sessions on a group: greedy MTP emits AR's tokens; a sampled MTP turn
/// emits one device's; a session made on the group moves to one device
/// (same backend id, the same export) and its next turn there is the one
/// the group would have run, and a warm turn equals a cold one.
#[test]
fn group_sessions_move_to_one_device_and_stay_exact() {
    let dir = fixture("deepseek_v4/tiny_a");
    let one = DeepseekV4Model::load(&dir, CpuOps).unwrap();
    let plan = ExpertSplit::even(2).unwrap();
    let group = split::group_of(&plan, &CpuOps);
    let split = DeepseekV4Model::load(&dir, group.clone()).unwrap();
    let v = one.vocab_size() as u32;
    let prompt: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % v).collect();

    let ar = turn(&split, &mut LiveSession::new(&split), &prompt, 0, 0.0);
    let mtp = turn(&split, &mut LiveSession::new(&split), &prompt, 2, 0.0);
    assert_eq!(mtp, ar, "greedy MTP on a group emits AR's tokens");

    let mut on_group = LiveSession::new(&split);
    let first = turn(&split, &mut on_group, &prompt, 2, 0.8);
    let mut alone = LiveSession::new(&one);
    assert_eq!(turn(&one, &mut alone, &prompt, 2, 0.8), first);

    // The group's session, exported and imported on one device.
    let image = on_group.export().unwrap();
    let mut moved = LiveSession::import(&one, image.clone()).unwrap();
    let next: Vec<u32> = on_group.tokens().iter().copied().chain([3, 4]).collect();
    let warm_group = turn(&split, &mut on_group, &next, 2, 0.8);
    let warm_moved = turn(&one, &mut moved, &next, 2, 0.8);
    assert_eq!(warm_moved, warm_group);
    let cold = turn(&split, &mut LiveSession::new(&split), &next, 2, 0.8);
    assert_eq!(cold, warm_group, "warm == cold on a group");
    assert!(group.stats().slots_on(1) > 0);
}
