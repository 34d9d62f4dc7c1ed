//! The session cache and cancellation:
//! - a warm turn (continued live, from the bank, from disk) gives the same
//!   logits, bit for bit, as a *cold* turn that prefills the whole prompt in
//!   one forward, for AR and MTP turns, on the default model and tiny
//!   `qwen4_exp`;
//! - the cache's policy: live → bank → disk → cold, the live state banked and
//!   saved when a prompt does not extend it, saves at the end of complete
//!   turns and on shutdown, hit/miss counts;
//! - the bank's memory budget holds and eviction keeps the more useful entry;
//! - a [`CancelToken`] set after N tokens, or during prefill, leaves a
//!   consistent session from which the turn continues exactly as an
//!   uncancelled run.

use std::path::PathBuf;

use ds4_engine::Model;
use ds4_engine::decode::{
    self, CallerStop, CancelToken, FinalState, FinishReason, Flow, LiveSession, Observe,
    TurnConfig, TurnRequest, TurnResult, on_tokens,
};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::state::bank::SessionBank;
use ds4_engine::state::checkpoint::{CheckpointStore, Identity, STATE_FORMAT_VERSION};
use ds4_engine::state::warm::{CacheSource, SessionCache};
use ds4_sampling::{Law, Sampler, SamplingParams};

fn qwen() -> Qwen4ExpModel {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp/tiny_a");
    Qwen4ExpModel::from_hf_dir(&dir).unwrap()
}

fn default_model() -> ds4_engine::families::llama::LlamaModel {
    let path = ds4_models::default_model_path().expect("default model available");
    ds4_engine::families::llama::load_llama(&path).unwrap()
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

fn identity() -> Identity {
    Identity {
        model: "m".into(),
        tokenizer: "tok".into(),
        family: "test".into(),
        state_version: STATE_FORMAT_VERSION,
    }
}

fn sampler(temperature: f64) -> Sampler {
    let params = SamplingParams {
        temperature,
        ..Law::Nucleus.default_params()
    };
    Sampler::new(Law::Nucleus, params, 7).unwrap()
}

fn config(max_tokens: usize, chunk: usize, cancel: &CancelToken) -> TurnConfig {
    TurnConfig {
        max_tokens,
        stop_token_ids: vec![],
        prefill_chunk: chunk,
        logprobs: Some(4),
        cancel: cancel.clone(),
    }
}

/// Everything logit-derived a turn produced, as raw bits.
#[derive(Debug, PartialEq)]
struct Trace {
    tokens: Vec<u32>,
    logprob_bits: Vec<Vec<u32>>,
    last_logits: Vec<u32>,
}

fn bits(s: &[f32]) -> Vec<u32> {
    s.iter().map(|x| x.to_bits()).collect()
}

/// One sampled turn (temperature 0.8, seed 7) with logprobs. `cancel_at`:
/// the token index after which the cancel token is set.
fn turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    depth: usize,
    max_tokens: usize,
    chunk: usize,
    cancel_at: Option<usize>,
) -> (TurnResult, Trace) {
    let cancel = CancelToken::new();
    let cfg = config(max_tokens, chunk, &cancel);
    let mut lp = Vec::new();
    let r = decode::generate(
        model,
        session,
        TurnRequest {
            prompt,
            sampler: &mut sampler(0.8),
            config: cfg.clone(),
            mtp_depth: Some(depth),
        },
        &mut on_tokens(|e| {
            let l = e.logprobs.expect("logprobs requested");
            let mut b = vec![l.logprob.to_bits()];
            b.extend(l.top.iter().flat_map(|&(t, p)| [t, p.to_bits()]));
            lp.push(b);
            if Some(e.index) == cancel_at {
                cancel.cancel();
            }
            Flow::Continue
        }),
    )
    .unwrap();
    let trace = Trace {
        tokens: r.tokens.clone(),
        logprob_bits: lp,
        last_logits: session.last_logits().map(bits).unwrap_or_default(),
    };
    (r, trace)
}

/// Turn 1 cold, then turn 2 (turn 1's tokens + new ones) warm — continued
/// live, from the bank, from disk — against turn 2 cold: a fresh session
/// that prefills the whole prompt in one forward. The warm paths agree with
/// each other bit for bit always; with `exact` they must equal the cold turn
/// bit for bit too (row-independent kernels), otherwise the tokens must be
/// equal and every logit-derived value within `1e-5` relative.
fn warm_vs_single_prefill_cold<M: Model>(model: &M, depth: usize, vocab: u32, exact: bool) {
    let p1 = prompt(1, 40, vocab);
    let mut live = LiveSession::new(model);
    let (r1, _) = turn(model, &mut live, &p1, depth, 6, 16, None);
    assert_eq!(r1.final_state, FinalState::Complete);
    let mut p2 = live.tokens().to_vec();
    p2.extend(prompt(2, 13, vocab));

    let mut bank = SessionBank::new(usize::MAX);
    assert!(bank.insert(&live));
    let dir = tempfile::tempdir().unwrap();
    let mut store = CheckpointStore::open(dir.path(), identity(), u64::MAX).unwrap();
    store.save(&live).unwrap();

    let mut cold = LiveSession::new(model);
    let (rc, cold_trace) = turn(model, &mut cold, &p2, depth, 8, p2.len(), None);
    assert_eq!(rc.reused_tokens, 0);
    assert_eq!(rc.timings.prefill_tokens, p2.len());

    let (rw, warm) = turn(model, &mut live, &p2, depth, 8, 16, None);
    assert_eq!(rw.reused_tokens, p1.len() + r1.tokens.len());
    let mut banked = bank.fetch(model, &p2).expect("bank hit").session;
    assert_eq!(turn(model, &mut banked, &p2, depth, 8, 16, None).1, warm);
    let mut disk = store.lookup(model, &p2).expect("disk hit");
    assert_eq!(turn(model, &mut disk, &p2, depth, 8, 16, None).1, warm);

    if exact {
        assert_eq!(warm, cold_trace, "warm vs single-prefill cold");
    } else {
        assert_eq!(warm.tokens, cold_trace.tokens);
        let close = |a: &[u32], b: &[u32]| {
            a.len() == b.len()
                && a.iter().zip(b).all(|(&x, &y)| {
                    let (x, y) = (f32::from_bits(x), f32::from_bits(y));
                    (x - y).abs() <= 1e-5 * x.abs().max(1.0)
                })
        };
        assert!(close(&warm.last_logits, &cold_trace.last_logits));
        for (w, c) in warm.logprob_bits.iter().zip(&cold_trace.logprob_bits) {
            // [logprob, (token, logprob)…]: tokens exact, logprobs close.
            let (wt, ct): (Vec<u32>, Vec<u32>) = (
                w.iter().skip(1).step_by(2).copied().collect(),
                c.iter().skip(1).step_by(2).copied().collect(),
            );
            assert_eq!(wt, ct);
            let (wl, cl): (Vec<u32>, Vec<u32>) = (
                w.iter().step_by(2).copied().collect(),
                c.iter().step_by(2).copied().collect(),
            );
            assert!(close(&wl, &cl));
        }
    }
}

/// The default model runs on row-independent kernels (block matmul,
/// attention): warm == cold bit for bit. It has no MTP head: AR only.
#[test]
fn default_model_warm_equals_single_prefill_cold_ar() {
    warm_vs_single_prefill_cold(&default_model(), 0, 49152, true);
}

/// qwen4_exp, close: same tokens, logits within 1e-5 (kept as a readable
/// diagnostic next to the bit-exact versions below).
#[test]
fn qwen4_exp_warm_vs_single_prefill_cold_ar() {
    warm_vs_single_prefill_cold(&qwen(), 0, 128, false);
}

#[test]
fn qwen4_exp_warm_vs_single_prefill_cold_mtp() {
    warm_vs_single_prefill_cold(&qwen(), 2, 128, false);
}

/// qwen4_exp's kernels are row-independent (`families/qwen4_exp/matmul.rs`,
/// `kernels.rs`): warm == cold bit for bit, AR and MTP.
#[test]
fn qwen4_exp_warm_equals_single_prefill_cold_bit_exact_ar() {
    warm_vs_single_prefill_cold(&qwen(), 0, 128, true);
}

#[test]
fn qwen4_exp_warm_equals_single_prefill_cold_bit_exact_mtp() {
    warm_vs_single_prefill_cold(&qwen(), 2, 128, true);
}

/// The cancel token set after token N: the turn stops there with a
/// consistent session covering exactly what it processed; continuing from
/// it (the bank's copy) gives exactly the uncancelled run's remaining
/// tokens and final logits. Greedy, so the sampler's stream does not depend
/// on the split.
fn cancel_token_then_continue<M: Model>(model: &M, depth: usize, vocab: u32, n: usize) {
    let p = prompt(4, 40, vocab);
    let greedy = |s: &mut LiveSession<M>, p: &[u32], max: usize, cancel_at: Option<usize>| {
        let cancel = CancelToken::new();
        let mut cfg = config(max, 2048, &cancel);
        cfg.logprobs = None;
        decode::generate(
            model,
            s,
            TurnRequest {
                prompt: p,
                sampler: &mut sampler(0.0),
                config: cfg.clone(),
                mtp_depth: Some(depth),
            },
            &mut on_tokens(|e| {
                if Some(e.index) == cancel_at {
                    cancel.cancel();
                }
                Flow::Continue
            }),
        )
        .unwrap()
    };
    let mut full = LiveSession::new(model);
    let all = greedy(&mut full, &p, 12, None);
    assert_eq!(all.tokens.len(), 12);
    let mut cut = LiveSession::new(model);
    let part = greedy(&mut cut, &p, 12, Some(n));
    assert_eq!(
        part.finish_reason,
        FinishReason::Caller(CallerStop::Cancelled)
    );
    assert_eq!(part.final_state, FinalState::Partial);
    assert_eq!(part.tokens.len(), n + 1, "stops right after token {n}");
    assert_eq!(part.tokens[..], all.tokens[..=n]);
    assert!(cut.is_consistent());
    let mut bank = SessionBank::new(usize::MAX);
    assert!(bank.insert(&cut));
    let mut p2 = p.clone();
    p2.extend_from_slice(&part.tokens);
    let mut resumed = bank.fetch(model, &p2).unwrap().session;
    let rest = greedy(&mut resumed, &p2, 12 - part.tokens.len(), None);
    assert_eq!(rest.tokens[..], all.tokens[part.tokens.len()..]);
    assert_eq!(resumed.tokens(), full.tokens());
    assert_eq!(
        bits(resumed.last_logits().unwrap()),
        bits(full.last_logits().unwrap())
    );
}

#[test]
fn qwen4_exp_cancel_token_after_n_tokens_ar() {
    for n in [0, 3, 7] {
        cancel_token_then_continue(&qwen(), 0, 128, n);
    }
}

#[test]
fn qwen4_exp_cancel_token_after_n_tokens_mtp() {
    for n in [0, 3, 7] {
        cancel_token_then_continue(&qwen(), 2, 128, n);
    }
}

/// The cancel token set during prefill (after the first chunk): nothing is
/// emitted, the session covers exactly the chunks that ran, and the retried
/// turn equals an uncancelled one bit for bit.
fn cancel_during_prefill<M: Model>(model: &M, depth: usize, vocab: u32) {
    let p = prompt(5, 40, vocab);
    let mut full = LiveSession::new(model);
    let (_, reference) = turn(model, &mut full, &p, depth, 6, 8, None);

    let mut s = LiveSession::new(model);
    let cancel = CancelToken::new();
    let cfg = config(6, 8, &cancel);
    let r = decode::generate(
        model,
        &mut s,
        TurnRequest {
            prompt: &p,
            sampler: &mut sampler(0.8),
            config: cfg.clone(),
            mtp_depth: Some(depth),
        },
        &mut Observe::new(
            |progress| {
                if progress.done >= 8 {
                    cancel.cancel();
                }
            },
            |_| panic!("no token after a cancelled prefill"),
        ),
    )
    .unwrap();
    assert!(r.tokens.is_empty());
    assert_eq!(r.finish_reason, FinishReason::Caller(CallerStop::Cancelled));
    assert_eq!(r.final_state, FinalState::Partial);
    assert_eq!(s.tokens(), &p[..8]);
    assert!(s.is_consistent());
    assert!(s.last_logits().is_some());
    assert_eq!(depth > 0, s.mtp_history().is_some());

    let (r2, retried) = turn(model, &mut s, &p, depth, 6, 8, None);
    assert_eq!(r2.reused_tokens, 8);
    assert_eq!(retried, reference);
}

#[test]
fn qwen4_exp_cancel_during_prefill_keeps_a_consistent_state() {
    cancel_during_prefill(&qwen(), 0, 128);
    cancel_during_prefill(&qwen(), 2, 128);
}

/// Over budget, the bank drops the least useful snapshot: an older entry
/// that keeps being hit outlives a newer one nobody reused (pure LRU would
/// drop the older one), and the total stays under the budget.
#[test]
fn bank_eviction_keeps_the_more_useful_entry() {
    let model = qwen();
    let sessions: Vec<LiveSession<Qwen4ExpModel>> = (0..3)
        .map(|i| {
            let mut s = LiveSession::new(&model);
            turn(&model, &mut s, &prompt(10 + i, 30, 128), 0, 2, 2048, None);
            s
        })
        .collect();
    let size = sessions[0].byte_size();
    assert!(sessions.iter().all(|s| s.byte_size() == size));
    let budget = size * 5 / 2;
    let mut bank = SessionBank::new(budget);
    assert!(bank.insert(&sessions[0]));
    let mut extended = sessions[0].tokens().to_vec();
    extended.push(9);
    for _ in 0..3 {
        assert!(bank.fetch(&model, &extended).is_some());
    }
    assert!(bank.insert(&sessions[1]));
    assert!(bank.insert(&sessions[2]));
    assert!(bank.total_bytes() <= budget);
    assert_eq!(bank.len(), 2);
    let keys: Vec<&[u32]> = bank.keys().collect();
    assert!(keys.contains(&sessions[0].tokens()), "the hit entry stays");
    assert!(keys.contains(&sessions[2].tokens()), "the newest stays");
    assert!(!keys.contains(&sessions[1].tokens()), "the unused one goes");

    // A snapshot bigger than the whole budget is not kept.
    let mut tiny = SessionBank::new(size - 1);
    assert!(!tiny.insert(&sessions[0]));
    assert!(tiny.is_empty());
}

/// The cache's policy end to end (AR, tiny qwen4_exp).
#[test]
fn session_cache_policy_live_bank_disk_cold() {
    let model = qwen();
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path(), identity(), u64::MAX).unwrap();
    let mut cache = SessionCache::new(&model, usize::MAX).with_store(store, 20);
    let run = |cache: &mut SessionCache<Qwen4ExpModel>, p: &[u32]| {
        let cancel = CancelToken::new();
        let (prepared, r) = cache.generate(
            &model,
            TurnRequest {
                prompt: p,
                sampler: &mut sampler(0.0),
                config: config(4, 2048, &cancel),
                mtp_depth: Some(0),
            },
            &mut (),
        );
        let r = r.unwrap();
        assert_eq!(prepared.cached_tokens, r.reused_tokens);
        (prepared, r)
    };

    // Cold, then saved (complete, 34 ≥ 20 tokens).
    let a = prompt(20, 30, 128);
    let (p, _) = run(&mut cache, &a);
    assert_eq!(p.source, CacheSource::Cold);
    assert_eq!(cache.store().unwrap().entries().len(), 1);
    // Extends the live session.
    let mut a2 = cache.live().tokens().to_vec();
    a2.extend(prompt(21, 5, 128));
    let (p, _) = run(&mut cache, &a2);
    assert_eq!((p.source, p.cached_tokens), (CacheSource::Live, 34));
    let after_a2 = cache.live().tokens().to_vec();
    // Another conversation: the live one is retired (already banked and
    // saved after its turn), this one starts cold.
    let b = prompt(22, 25, 128);
    let (p, _) = run(&mut cache, &b);
    assert_eq!(p.source, CacheSource::Cold);
    // Back to the first: from the bank.
    let mut a3 = after_a2.clone();
    a3.extend(prompt(23, 3, 128));
    let (p, _) = run(&mut cache, &a3);
    assert_eq!(
        (p.source, p.cached_tokens),
        (CacheSource::Bank, after_a2.len())
    );
    let stats = cache.stats();
    assert_eq!((stats.live_hits, stats.bank_hits, stats.misses), (1, 1, 2));
    assert_eq!(stats.saves, 4);
    assert!(cache.rejections().is_empty());

    // A short live session is not saved at shutdown; a long one is.
    let mut short = SessionCache::new(&model, usize::MAX).with_store(
        CheckpointStore::open(dir.path(), identity(), u64::MAX).unwrap(),
        1000,
    );
    run(&mut short, &prompt(24, 10, 128));
    short.shutdown();
    assert_eq!(short.stats().saves, 0);

    // A restart: only the directory. The first conversation comes from disk.
    drop(cache);
    let store = CheckpointStore::open(dir.path(), identity(), u64::MAX).unwrap();
    let mut restarted = SessionCache::new(&model, usize::MAX).with_store(store, 20);
    let mut a4 = after_a2.clone();
    a4.extend(prompt(25, 4, 128));
    let (p, _) = run(&mut restarted, &a4);
    assert_eq!(
        (p.source, p.cached_tokens),
        (CacheSource::Disk, after_a2.len())
    );
    assert_eq!(restarted.stats().disk_hits, 1);
}

/// A regenerated or edited reply branches at the end of the prompt. A
/// recurrent state cannot be truncated back there, so the cache banks the
/// end-of-prompt state of every turn; the branch starts from it, and its
/// tokens, logprobs and final logits equal a cold turn's bit for bit (AR and
/// MTP, tiny qwen4_exp).
#[test]
fn qwen4_exp_branch_at_the_end_of_the_prompt_starts_from_the_boundary() {
    let model = qwen();
    for depth in [0, 2] {
        let mut cache = SessionCache::new(&model, usize::MAX);
        let p = prompt(30, 37, 128);
        let turn_in = |cache: &mut SessionCache<Qwen4ExpModel>, prompt: &[u32], seed: u64| {
            let cancel = CancelToken::new();
            let mut lp = Vec::new();
            let params = SamplingParams {
                temperature: 0.8,
                ..Law::Nucleus.default_params()
            };
            let mut s = Sampler::new(Law::Nucleus, params, seed).unwrap();
            let (prepared, r) = cache.generate(
                &model,
                TurnRequest {
                    prompt,
                    sampler: &mut s,
                    config: config(6, 16, &cancel),
                    mtp_depth: Some(depth),
                },
                &mut on_tokens(|e| {
                    lp.push(e.logprobs.expect("logprobs requested").logprob.to_bits());
                    Flow::Continue
                }),
            );
            let r = r.unwrap();
            assert_eq!(r.final_state, FinalState::Complete);
            let last = cache.live().last_logits().map(bits).unwrap_or_default();
            (prepared, r.tokens, lp, last)
        };
        let (first, reply, ..) = turn_in(&mut cache, &p, 1);
        assert_eq!(first.source, CacheSource::Cold);
        assert_eq!(cache.stats().prompt_boundaries, 1);
        // Regenerate: same prompt, another seed. The live session (prompt +
        // reply) cannot be truncated back; the banked boundary serves the
        // whole prompt, with its kept last logits.
        let (again, tokens, lp, last) = turn_in(&mut cache, &p, 2);
        assert_eq!(again.source, CacheSource::Bank, "depth {depth}");
        assert_eq!(again.cached_tokens, p.len(), "depth {depth}");
        let mut cold = SessionCache::new(&model, usize::MAX);
        let (c, ctokens, clp, clast) = turn_in(&mut cold, &p, 2);
        assert_eq!(c.source, CacheSource::Cold);
        assert_eq!((tokens, lp, last), (ctokens, clp, clast), "depth {depth}");
        assert_ne!(reply.len(), 0);
    }
}

/// With a boundary every 16 tokens, a prompt that diverges from an earlier
/// one at token 20 reuses the first 16 (the last boundary before the
/// divergence) and still equals a cold turn bit for bit (AR and MTP).
#[test]
fn qwen4_exp_divergent_prompt_reuses_the_last_boundary_before_it() {
    let model = qwen();
    for depth in [0, 2] {
        let run = |cache: &mut SessionCache<Qwen4ExpModel>, prompt: &[u32]| {
            let cancel = CancelToken::new();
            let mut lp = Vec::new();
            let (prepared, r) = cache.generate(
                &model,
                TurnRequest {
                    prompt,
                    sampler: &mut sampler(0.8),
                    config: config(5, 8, &cancel),
                    mtp_depth: Some(depth),
                },
                &mut on_tokens(|e| {
                    lp.push(e.logprobs.expect("logprobs requested").logprob.to_bits());
                    Flow::Continue
                }),
            );
            let r = r.unwrap();
            assert_eq!(r.final_state, FinalState::Complete);
            assert_eq!(r.reused_tokens, prepared.cached_tokens);
            assert_eq!(r.timings.prefill_tokens, prompt.len() - r.reused_tokens);
            let last = cache.live().last_logits().map(bits).unwrap_or_default();
            (prepared, r.tokens, lp, last)
        };
        let mut cache = SessionCache::new(&model, usize::MAX).with_boundary_every(16);
        let p = prompt(40, 37, 128);
        run(&mut cache, &p);
        assert_eq!(cache.stats().prompt_boundaries, 3, "16, 32 and 37");
        let mut q = p[..20].to_vec();
        q.extend(prompt(41, 10, 128));
        let (warm, tokens, lp, last) = run(&mut cache, &q);
        assert_eq!((warm.source, warm.cached_tokens), (CacheSource::Bank, 16));
        let mut cold = SessionCache::new(&model, usize::MAX).with_boundary_every(16);
        let (c, ctokens, clp, clast) = run(&mut cold, &q);
        assert_eq!(c.source, CacheSource::Cold);
        assert_eq!((tokens, lp, last), (ctokens, clp, clast), "depth {depth}");
    }
}

/// An edited earlier message on an MTP turn (the default model with its
/// head): the prompt diverges inside the live session, which rewinds and
/// keeps its MTP history (one token short of the shared prefix), so the
/// turn starts warm from the live session — and, after another
/// conversation, from the bank — with the tokens and logprobs of a cold
/// turn.
#[test]
fn default_model_mtp_edit_is_a_warm_hit() {
    let path = ds4_models::default_model_path().expect("default model available");
    let head = ds4_models::mtp_head_for(&path)
        .expect("the default model has a head")
        .expect("the head file checks out");
    let mut model = ds4_engine::families::llama::load_llama(&path).unwrap();
    model.attach_mtp_head(&head).unwrap();
    let run = |cache: &mut SessionCache<_>, p: &[u32]| {
        let cancel = CancelToken::new();
        let mut lp = Vec::new();
        let (prepared, r) = cache.generate(
            &model,
            TurnRequest {
                prompt: p,
                sampler: &mut sampler(0.8),
                config: config(6, 2048, &cancel),
                mtp_depth: Some(2),
            },
            &mut on_tokens(|e| {
                lp.push(e.logprobs.expect("logprobs requested").logprob.to_bits());
                Flow::Continue
            }),
        );
        let r = r.unwrap();
        assert_eq!(prepared.cached_tokens, r.reused_tokens);
        assert!(r.mtp.as_ref().is_some_and(|m| m.drafted_total() > 0));
        (prepared, r.tokens, lp)
    };
    let cold = |p: &[u32]| {
        let (prepared, tokens, lp) = run(&mut SessionCache::new(&model, 0), p);
        assert_eq!(prepared.source, CacheSource::Cold);
        (tokens, lp)
    };

    let mut cache = SessionCache::new(&model, usize::MAX);
    let a = prompt(40, 30, 49152);
    run(&mut cache, &a);
    let mut a2 = cache.live().tokens().to_vec();
    let first_turn = a2.len();
    a2.extend(prompt(41, 12, 49152));
    let (p, ..) = run(&mut cache, &a2);
    assert_eq!((p.source, p.cached_tokens), (CacheSource::Live, first_turn));
    // Edit the second message after its fourth token.
    let mut edited = a2[..first_turn + 4].to_vec();
    edited.extend(prompt(42, 9, 49152));
    let shared = first_turn + 4;
    assert_ne!(edited[shared], a2[shared]);
    let (p, tokens, lp) = run(&mut cache, &edited);
    assert_eq!((p.source, p.cached_tokens), (CacheSource::Live, shared - 1));
    assert_eq!((tokens, lp), cold(&edited));

    // Another conversation, then the first one edited again: from the bank.
    run(&mut cache, &prompt(43, 20, 49152));
    let mut again = edited[..first_turn + 2].to_vec();
    again.extend(prompt(44, 5, 49152));
    let (p, tokens, lp) = run(&mut cache, &again);
    assert_eq!(p.source, CacheSource::Bank);
    assert_eq!(p.cached_tokens, first_turn + 1);
    assert_eq!((tokens, lp), cold(&again));
}
