//! The default model's trained MTP head (`tools/mtp_head`, shipped by
//! `ds4-models`) on the real model: greedy MTP emits exactly the AR tokens
//! at depths 1..3 on held-out chat prompts, the draft row puts every token
//! outside the head's vocabulary subset at `-inf`, and a damaged head file
//! is refused leaving the model as it was (AR only). The family-neutral
//! properties (warm == cold, exits, commits) run in `conformance.rs`
//! (`llama_mtp_default_model`); the subset draft's distribution test is in
//! `mtp_exact.rs`.

use std::path::PathBuf;

use ds4_engine::decode::{self, LiveSession, TurnConfig, TurnRequest};
use ds4_engine::families::llama::{LlamaModel, load_llama};
use ds4_engine::{HiddenRows, LogitsRows, Model};
use ds4_sampling::{Law, Sampler, SamplingParams};

fn model_path() -> PathBuf {
    ds4_models::default_model_path().expect("default model available")
}

fn with_head() -> LlamaModel {
    let path = model_path();
    let head = ds4_models::mtp_head_for(&path)
        .expect("the default model has a head")
        .expect("the head file checks out");
    let mut m = load_llama(&path).unwrap();
    m.attach_mtp_head(&head).unwrap();
    m
}

/// Held-out chat prompts (`tools/mtp_head/heldout.py`: instructions of the
/// eval split, chat template applied).
fn prompts() -> Vec<Vec<u32>> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/llama/mtp_prompts.txt");
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(|t| t.trim().parse().unwrap()).collect())
        .collect()
}

fn greedy(m: &LlamaModel, prompt: &[u32], depth: usize, n: usize) -> decode::TurnResult {
    let params = SamplingParams {
        temperature: 0.0,
        ..Law::Nucleus.default_params()
    };
    let mut s = Sampler::new(Law::Nucleus, params, 1).unwrap();
    let mut session = LiveSession::new(m);
    decode::generate(
        m,
        &mut session,
        TurnRequest {
            prompt,
            sampler: &mut s,
            config: TurnConfig {
                max_tokens: n,
                stop_token_ids: vec![],
                prefill_chunk: 256,
                logprobs: None,
                cancel: Default::default(),
            },
            mtp_depth: Some(depth),
        },
        &mut (),
    )
    .unwrap()
}

#[test]
fn llama_head_greedy_mtp_equals_ar_on_held_out_prompts_default_model() {
    let m = with_head();
    let (mut drafted, mut accepted) = (0, 0);
    let (mut short, mut full) = (0, 0);
    for (i, p) in prompts().iter().take(3).enumerate() {
        let ar = greedy(&m, p, 0, 24);
        assert!(ar.mtp.is_none());
        for depth in 1..=3 {
            let r = greedy(&m, p, depth, 24);
            assert_eq!(r.tokens, ar.tokens, "prompt {i} depth {depth}");
            let st = r.mtp.expect("MTP statistics");
            drafted += st.drafted_total();
            accepted += st.accepted_total();
            // drafted[i] counts the cycles that drafted at least i + 1.
            full += st.drafted[depth - 1];
            short += st.cycles - st.drafted[depth - 1];
        }
    }
    // The trained head drafts well on the model's own replies (about half
    // of the drafts at these depths); a random head accepts a few percent.
    eprintln!("accepted {accepted} of {drafted} drafts; {short} cycles cut short, {full} full");
    assert!(accepted * 4 > drafted, "accepted {accepted} of {drafted}");
    // The family's draft-stop threshold is in force: the head's doubt cut
    // some cycles short, and others drafted the full depth.
    assert!(
        m.mtp_contract().unwrap().min_draft_confidence.is_some() && short > 0 && full > 0,
        "{short} cycles cut short, {full} full"
    );
}

#[test]
fn llama_head_drafts_only_from_its_subset_default_model() {
    let m = with_head();
    let c = m.mtp_contract().expect("contract with a head");
    assert_eq!((c.default_depth, c.max_depth), (0, 3));
    let subset = m.mtp_head().unwrap().subset_len();
    assert_eq!(subset, 8192);
    let p = &prompts()[0];
    let mut st = m.new_state();
    let (_, hidden) = m.forward_hidden(p, &mut st, LogitsRows::Last).unwrap();
    let mut hist = m.new_mtp_history().unwrap();
    // rows 0..n-1 pair hidden t with token t + 1
    let n = p.len() - 1;
    let step = m
        .mtp_forward(&p[1..], &hidden.narrow(0, n).unwrap(), &mut hist)
        .unwrap();
    assert_eq!(step.logits.len(), m.vocab_size());
    let finite = step.logits.iter().filter(|v| v.is_finite()).count();
    assert_eq!(finite, subset);
    assert!(
        step.logits
            .iter()
            .all(|v| v.is_finite() || *v == f32::NEG_INFINITY)
    );
    assert_eq!(step.hidden.rows(), 1);
}

#[test]
fn llama_damaged_head_is_refused_and_the_model_stays_ar_default_model() {
    let path = model_path();
    let good = ds4_models::mtp_head_for(&path).unwrap().unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut m = load_llama(&path).unwrap();
    // Truncated: the GGUF reader refuses it.
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert!(m.attach_mtp_head(&cut).is_err());
    // Not a head file: the trunk itself.
    let err = m.attach_mtp_head(&path).unwrap_err().to_string();
    assert!(err.contains("llama-mtp-head"), "{err}");
    assert!(m.mtp_contract().is_none());
    assert!(m.new_mtp_history().is_none());
    // Still a working AR model.
    let r = greedy(&m, &prompts()[0], 0, 4);
    assert_eq!(r.tokens.len(), 4);
}
