//! Warm reuse never changes a logit: a turn continued from a banked or
//! checkpointed session (memory bank, disk store, store reopened as after a
//! restart) is bit-identical to the same turn continued from the live
//! session, for AR and MTP turns; cancel-then-continue equals an
//! uncancelled run.

use std::path::PathBuf;

use ds4_engine::Model;
use ds4_engine::decode::{
    self, CallerStop, FinalState, Flow, LiveSession, TurnConfig, TurnRequest, TurnResult, on_tokens,
};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::state::bank::SessionBank;
use ds4_engine::state::checkpoint::{CheckpointStore, Identity, STATE_FORMAT_VERSION};
use ds4_sampling::{Law, Sampler, SamplingParams};

fn qwen(name: &str) -> Qwen4ExpModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen4_exp")
        .join(name);
    Qwen4ExpModel::from_hf_dir(&dir).unwrap()
}

fn prompt(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6364136223846793005) | 1;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % (vocab as u64 - 3)) as u32 + 3
        })
        .collect()
}

fn identity(model: &str) -> Identity {
    Identity {
        model: model.into(),
        tokenizer: "tok".into(),
        family: "test".into(),
        state_version: STATE_FORMAT_VERSION,
    }
}

/// What a turn produced, with every logit-derived value as raw bits.
#[derive(Debug, PartialEq)]
struct Trace {
    tokens: Vec<u32>,
    logprob_bits: Vec<Vec<u32>>,
    last_logits: Vec<u32>,
    reused: usize,
}

fn run_turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    depth: usize,
    max_tokens: usize,
    cancel_at: Option<usize>,
) -> (TurnResult, Trace) {
    let params = SamplingParams {
        temperature: 0.8,
        ..Law::Nucleus.default_params()
    };
    let mut sampler = Sampler::new(Law::Nucleus, params, 7).unwrap();
    let cfg = TurnConfig {
        max_tokens,
        stop_token_ids: vec![],
        prefill_chunk: 2048,
        logprobs: Some(4),
        cancel: Default::default(),
    };
    let mut lp = Vec::new();
    let r = decode::generate(
        model,
        session,
        TurnRequest {
            prompt,
            sampler: &mut sampler,
            config: cfg.clone(),
            mtp_depth: Some(depth),
        },
        &mut on_tokens(|e| {
            let l = e.logprobs.expect("logprobs requested");
            let mut bits = vec![l.logprob.to_bits()];
            bits.extend(l.top.iter().flat_map(|&(t, p)| [t, p.to_bits()]));
            lp.push(bits);
            match cancel_at {
                Some(i) if i == e.index => Flow::Stop(CallerStop::Cancelled),
                _ => Flow::Continue,
            }
        }),
    )
    .unwrap();
    let trace = Trace {
        tokens: r.tokens.clone(),
        logprob_bits: lp,
        last_logits: session
            .last_logits()
            .map(|l| l.iter().map(|x| x.to_bits()).collect())
            .unwrap_or_default(),
        reused: r.reused_tokens,
    };
    (r, trace)
}

/// Turn 1, then turn 2 four ways: continued live, from the memory bank,
/// from the disk store, from a reopened store. All must agree bit for bit
/// (the reuse count included: every warm path reuses all of turn 1).
fn warm_equals_cold<M: Model>(model: &M, depth: usize, vocab: u32) {
    let p1 = prompt(1, 48, vocab);
    let mut live = LiveSession::new(model);
    let (r1, _) = run_turn(model, &mut live, &p1, depth, 6, None);
    assert_eq!(r1.final_state, FinalState::Complete);
    let mut p2 = live.tokens().to_vec();
    p2.extend(prompt(2, 17, vocab));

    let mut bank = SessionBank::new(usize::MAX);
    assert!(bank.insert(&live));
    let dir = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(dir.path(), identity("m"), u64::MAX).unwrap();
    store.save(&live).unwrap();

    let (_, cold) = run_turn(model, &mut live, &p2, depth, 8, None);
    assert_eq!(cold.reused, p1.len() + r1.tokens.len());
    assert_eq!(cold.tokens.len(), 8);

    let hit = bank.fetch(model, &p2).expect("bank hit");
    assert_eq!(hit.reused, cold.reused);
    let mut warm = hit.session;
    assert_eq!(run_turn(model, &mut warm, &p2, depth, 8, None).1, cold);

    let mut disk = store.lookup(model, &p2).expect("disk hit");
    assert_eq!(run_turn(model, &mut disk, &p2, depth, 8, None).1, cold);

    // A restart: nothing in memory but the directory.
    drop(store);
    let mut store = CheckpointStore::open(dir.path(), identity("m"), u64::MAX).unwrap();
    assert_eq!(store.entries().len(), 1);
    let mut restarted = store.lookup(model, &p2).expect("hit after restart");
    assert_eq!(run_turn(model, &mut restarted, &p2, depth, 8, None).1, cold);
    assert!(store.rejections().is_empty());
}

#[test]
fn qwen4_exp_warm_equals_cold_ar() {
    warm_equals_cold(&qwen("tiny_a"), 0, 128);
}

#[test]
fn qwen4_exp_warm_equals_cold_mtp() {
    warm_equals_cold(&qwen("tiny_a"), 2, 128);
}

#[test]
fn default_model_warm_equals_cold_ar() {
    let path = ds4_models::default_model_path().expect("default model available");
    let model = ds4_engine::families::llama::load_llama(&path).unwrap();
    warm_equals_cold(&model, 0, 49152);
}

/// A hybrid state cannot be rewound: a prompt that diverges inside a banked
/// session is a miss; an attention-only (llama) state is truncated and hit.
#[test]
fn recurrent_states_restore_only_at_boundaries() {
    let model = qwen("tiny_a");
    let p = prompt(3, 30, 128);
    let mut live = LiveSession::new(&model);
    run_turn(&model, &mut live, &p, 0, 4, None);
    let mut bank = SessionBank::new(usize::MAX);
    bank.insert(&live);
    let mut diverged = p[..20].to_vec();
    diverged.push(1);
    assert!(bank.fetch(&model, &diverged).is_none());
    let mut extended = live.tokens().to_vec();
    extended.push(5);
    assert_eq!(
        bank.fetch(&model, &extended).unwrap().reused,
        live.tokens().len()
    );
}

/// Cancel after N tokens, bank the consistent partial session, continue
/// from it: the continuation equals the uncancelled run's tail and ends in
/// the same state (greedy, so the sampler's draws do not depend on the
/// split).
fn cancel_then_continue<M: Model>(model: &M, depth: usize, vocab: u32) {
    let p = prompt(4, 40, vocab);
    let greedy = |model: &M, s: &mut LiveSession<M>, p: &[u32], n, cancel| {
        let mut sampler = Sampler::new(
            Law::Nucleus,
            SamplingParams {
                temperature: 0.0,
                ..Law::Nucleus.default_params()
            },
            1,
        )
        .unwrap();
        let cfg = TurnConfig {
            max_tokens: n,
            stop_token_ids: vec![],
            prefill_chunk: 2048,
            logprobs: None,
            cancel: Default::default(),
        };
        decode::generate(
            model,
            s,
            TurnRequest {
                prompt: p,
                sampler: &mut sampler,
                config: cfg.clone(),
                mtp_depth: Some(depth),
            },
            &mut on_tokens(|e| {
                if Some(e.index) == cancel {
                    Flow::Stop(CallerStop::Cancelled)
                } else {
                    Flow::Continue
                }
            }),
        )
        .unwrap()
    };
    let mut full = LiveSession::new(model);
    let all = greedy(model, &mut full, &p, 10, None);
    let mut cut = LiveSession::new(model);
    let part = greedy(model, &mut cut, &p, 10, Some(3));
    assert_eq!(part.final_state, FinalState::Partial);
    assert_eq!(part.tokens[..], all.tokens[..part.tokens.len()]);
    assert!(cut.is_consistent());
    let mut bank = SessionBank::new(usize::MAX);
    assert!(bank.insert(&cut));
    let mut p2 = p.clone();
    p2.extend_from_slice(&part.tokens);
    let mut resumed = bank.fetch(model, &p2).unwrap().session;
    let rest = greedy(model, &mut resumed, &p2, 10 - part.tokens.len(), None);
    assert_eq!(rest.tokens[..], all.tokens[part.tokens.len()..]);
    assert_eq!(resumed.tokens(), full.tokens());
    let bits = |s: &LiveSession<M>| {
        s.last_logits()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>()
    };
    assert_eq!(bits(&resumed), bits(&full));
}

#[test]
fn qwen4_exp_cancel_then_continue_equals_uncancelled() {
    cancel_then_continue(&qwen("tiny_a"), 0, 128);
    cancel_then_continue(&qwen("tiny_a"), 2, 128);
}

/// The disk store follows the bank's rule: an attention-only (llama) state
/// is truncated to a shorter shared prefix, a recurrent one is not.
#[test]
fn store_truncates_only_attention_only_states() {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama/tiny/f32_tied");
    let llama = ds4_engine::families::llama::load_llama(&dir).unwrap();
    let qwen = qwen("tiny_a");
    let p: Vec<u32> = prompt(8, 30, 90);
    for (name, reusable) in [("llama", true), ("qwen", false)] {
        let tmp = tempfile::tempdir().unwrap();
        let mut store = CheckpointStore::open(tmp.path(), identity(name), u64::MAX).unwrap();
        let mut diverged = p[..20].to_vec();
        diverged.push(1);
        let got = if name == "llama" {
            let mut live = LiveSession::new(&llama);
            run_turn(&llama, &mut live, &p, 0, 4, None);
            store.save(&live).unwrap();
            store.lookup(&llama, &diverged).map(|s| s.tokens().len())
        } else {
            let mut live = LiveSession::new(&qwen);
            run_turn(&qwen, &mut live, &p, 0, 4, None);
            store.save(&live).unwrap();
            store.lookup(&qwen, &diverged).map(|s| s.tokens().len())
        };
        assert_eq!(got, reusable.then_some(20), "{name}");
        assert!(store.rejections().is_empty());
    }
}

/// Boundaries every N tokens make a hybrid prompt that diverges part way
/// restorable at the last boundary before the divergence, and the turn from
/// there is bit-identical to one from a session prefilled to that boundary
/// without the bank.
#[test]
fn qwen4_exp_boundaries_every_n_tokens() {
    let model = qwen("tiny_a");
    let a = prompt(9, 40, 128);
    let mut bank = SessionBank::new(usize::MAX);
    let mut s = LiveSession::new(&model);
    bank.prefill_with_boundaries(&model, &mut s, &a, 16, 2048)
        .unwrap();
    let mut keys: Vec<usize> = bank.keys().map(<[u32]>::len).collect();
    keys.sort();
    assert_eq!(keys, vec![16, 32, 40]);
    let mut b = a[..35].to_vec();
    b.extend(prompt(10, 6, 128));
    let hit = bank.fetch(&model, &b).unwrap();
    assert_eq!(hit.reused, 32);
    let mut warm = hit.session;
    let (_, w) = run_turn(&model, &mut warm, &b, 0, 6, None);

    let mut reference = LiveSession::new(&model);
    SessionBank::new(0)
        .prefill_with_boundaries(&model, &mut reference, &a[..32], 16, 2048)
        .unwrap();
    let (_, r) = run_turn(&model, &mut reference, &b, 0, 6, None);
    assert_eq!(w, r);
}
