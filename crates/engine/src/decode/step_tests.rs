//! The per-position greedy hook ([`super::turn::TurnObserver::greedy_after`])
//! in the AR and MTP loops, on a toy model (4 tokens; target and drafter
//! logits are fixed functions of the last two tokens; the MTP head's hidden
//! is the token itself, as in `tests/mtp_exact.rs`).
//!
//! The policy under test makes a position greedy when the token before it is
//! even — a function of the tokens before the position only, as the DSML
//! structure decision is. With it, sampled MTP must still be distributed
//! exactly as AR sampling under the same policy (checked against the
//! distribution computed by enumeration, chi-square with fixed seeds), greedy
//! positions take no draws, and a hook that never fires changes nothing.

use std::collections::BTreeMap;

use ds4_sampling::{Law, Sampler, SamplingParams, TokenCounts};

use super::turn::{Flow, TokenEvent, TurnConfig, TurnObserver, TurnRequest};
use super::{LiveSession, generate};
use crate::backend::{Backend, BackendId, CpuOps};
use crate::error::{EngineError, Result};
use crate::model::{
    DeviceRows, FamilyDescriptor, ForwardOutput, HiddenRows, LogitsRows, Model, ModelState,
    MtpContract, MtpHistory, MtpStep, VerifyWindow,
};

const V: usize = 4;
const STOP: u32 = 3;
const PROMPT: [u32; 2] = [1, 2];
const MAX: usize = 5;

static TOY: FamilyDescriptor = FamilyDescriptor {
    name: "toy",
    model_types: &[],
    gguf_architectures: &[],
    law: Law::Ds4,
    sampling_defaults: Law::Ds4.default_params(),
};

fn target(a: u32, b: u32) -> Vec<f32> {
    (0..V as u32)
        .map(|v| ((a * 7 + b * 13 + v * 29 + a * v * 3) % 11) as f32 / 5.0)
        .collect()
}

fn drafter(a: u32, b: u32) -> Vec<f32> {
    let mut l = target(a, b);
    l[((a + 2 * b) % V as u32) as usize] += 1.5;
    l[(b % V as u32) as usize] -= 1.0;
    l
}

struct Toy;

#[derive(Clone, Debug)]
struct ToyState(Vec<u32>);

struct ToyWindow(usize, usize);

impl ModelState for ToyState {
    type Window = ToyWindow;
    fn len(&self) -> usize {
        self.0.len()
    }
    fn truncate_floor(&self) -> usize {
        0
    }
    fn snapshot(&self) -> Self {
        self.clone()
    }
    fn truncate(&mut self, n: usize) -> Result<()> {
        self.0.truncate(n);
        Ok(())
    }
    fn byte_size(&self) -> usize {
        4 * self.0.len()
    }
    fn commit(&mut self, w: &ToyWindow, accepted: usize) -> Result<()> {
        if self.0.len() != w.0 + w.1 || accepted > w.1 {
            return Err(EngineError::State("stale window".into()));
        }
        self.0.truncate(w.0 + accepted);
        Ok(())
    }
}

#[derive(Clone)]
struct ToyHistory(Vec<(u32, u32)>);

impl MtpHistory for ToyHistory {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.0.len() {
            return Err(EngineError::State("truncate beyond length".into()));
        }
        self.0.truncate(n);
        Ok(())
    }
    fn byte_size(&self) -> usize {
        8 * self.0.len()
    }
}

type Hidden = DeviceRows<CpuOps>;

fn hidden_of(tokens: &[u32]) -> Result<Hidden> {
    let v: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
    DeviceRows::new(&CpuOps, v, tokens.len(), 1)
}

fn rows(state: &mut ToyState, tokens: &[u32], which: LogitsRows) -> Result<ForwardOutput> {
    let mut logits = Vec::new();
    for &t in tokens {
        if t as usize >= V {
            return Err(EngineError::TokenOutOfRange { token: t, vocab: V });
        }
        state.0.push(t);
        let n = state.0.len();
        let a = if n >= 2 { state.0[n - 2] } else { 0 };
        logits.extend(target(a, t));
    }
    let out = ForwardOutput {
        logits,
        rows: tokens.len(),
        vocab: V,
    };
    Ok(match which {
        LogitsRows::All => out,
        LogitsRows::Last => ForwardOutput {
            logits: out.last_row().to_vec(),
            rows: 1,
            vocab: V,
        },
    })
}

impl Model for Toy {
    type State = ToyState;
    type MtpHistory = ToyHistory;
    type Hidden = Hidden;
    fn descriptor(&self) -> &'static FamilyDescriptor {
        &TOY
    }
    fn backend(&self) -> BackendId {
        CpuOps.id()
    }
    fn vocab_size(&self) -> usize {
        V
    }
    fn context_length(&self) -> usize {
        64
    }
    fn new_state(&self) -> ToyState {
        ToyState(Vec::new())
    }
    fn forward(
        &self,
        tokens: &[u32],
        s: &mut ToyState,
        which: LogitsRows,
    ) -> Result<ForwardOutput> {
        rows(s, tokens, which)
    }
    fn mtp_contract(&self) -> Option<MtpContract> {
        Some(MtpContract {
            default_depth: 2,
            max_depth: 3,
            hidden: "the token itself",
            min_draft_confidence: None,
        })
    }
    fn forward_hidden(
        &self,
        tokens: &[u32],
        s: &mut ToyState,
        which: LogitsRows,
    ) -> Result<(ForwardOutput, Hidden)> {
        Ok((rows(s, tokens, which)?, hidden_of(tokens)?))
    }
    fn forward_window(
        &self,
        tokens: &[u32],
        s: &mut ToyState,
    ) -> Result<VerifyWindow<ToyWindow, Hidden>> {
        let base = s.0.len();
        Ok(VerifyWindow {
            logits: rows(s, tokens, LogitsRows::All)?,
            hidden: hidden_of(tokens)?,
            record: ToyWindow(base, tokens.len()),
        })
    }
    fn new_mtp_history(&self) -> Option<ToyHistory> {
        Some(ToyHistory(Vec::new()))
    }
    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &Hidden,
        h: &mut ToyHistory,
    ) -> Result<MtpStep<Hidden>> {
        let (_, _, hs) = hidden.to_host()?;
        let hs: Vec<u32> = hs.into_iter().map(|x| x as u32).collect();
        if hs.len() != tokens.len() || tokens.is_empty() {
            return Err(EngineError::State("rows mismatch".into()));
        }
        h.0.extend(hs.iter().copied().zip(tokens.iter().copied()));
        let (a, b) = (hs[hs.len() - 1], tokens[tokens.len() - 1]);
        Ok(MtpStep {
            logits: drafter(a, b),
            hidden: hidden_of(&[b])?,
        })
    }
}

/// Greedy at a position when the token before it (emitted or pending) is
/// even; the first position follows the prompt's last token (2: greedy).
fn policy(before: &[u32]) -> bool {
    before.last().copied().unwrap_or(PROMPT[1]) % 2 == 0
}

/// Records emitted tokens and answers [`policy`]; `on` false never fires.
struct Policy {
    on: bool,
    emitted: Vec<u32>,
    /// Every question, as (tokens before the position, answer).
    asked: Vec<(Vec<u32>, bool)>,
    /// Questions about a position after drafts not emitted yet.
    ahead: usize,
}

impl Policy {
    fn new(on: bool) -> Self {
        Self {
            on,
            emitted: Vec::new(),
            asked: Vec::new(),
            ahead: 0,
        }
    }
}

impl TurnObserver for Policy {
    fn token(&mut self, event: TokenEvent) -> Flow {
        self.emitted.push(event.token);
        Flow::Continue
    }
    fn greedy_after(&mut self, pending: &[u32]) -> bool {
        let mut before = self.emitted.clone();
        before.extend_from_slice(pending);
        self.ahead += usize::from(!pending.is_empty());
        let greedy = self.on && policy(&before);
        self.asked.push((before, greedy));
        greedy
    }
}

fn params(law: Law) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 0,
        min_p: if law == Law::Ds4 { 0.05 } else { 0.0 },
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    }
}

fn config() -> TurnConfig {
    TurnConfig {
        max_tokens: MAX,
        stop_token_ids: vec![STOP],
        prefill_chunk: 16,
        logprobs: None,
        cancel: Default::default(),
    }
}

/// (tokens, draws taken, the observer).
fn run(law: Law, depth: usize, seed: u64, on: bool) -> (Vec<u32>, u64, Policy) {
    let mut s = Sampler::new(law, params(law), seed).unwrap();
    let mut session = LiveSession::new(&Toy);
    let mut observer = Policy::new(on);
    let r = generate(
        &Toy,
        &mut session,
        TurnRequest {
            prompt: &PROMPT,
            sampler: &mut s,
            config: config(),
            mtp_depth: Some(depth),
        },
        &mut observer,
    )
    .unwrap();
    assert!(session.is_consistent());
    (r.tokens, s.draws_taken(), observer)
}

/// Exact probability of every emitted sequence when each position follows
/// `greedy(tokens before it)`: greedy rows are the law's argmax.
fn exact(law: Law, greedy: fn(&[u32]) -> bool) -> BTreeMap<Vec<u32>, f64> {
    let mut sampled = Sampler::new(law, params(law), 0).unwrap();
    let zero = SamplingParams {
        temperature: 0.0,
        ..params(law)
    };
    let mut argmax = Sampler::new(law, zero, 0).unwrap();
    let mut out = BTreeMap::new();
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, pr)) = stack.pop() {
        if seq.len() == MAX || seq.last() == Some(&STOP) {
            *out.entry(seq).or_default() += pr;
            continue;
        }
        let mut ctx = PROMPT.to_vec();
        ctx.extend(&seq);
        let n = ctx.len();
        let row = target(ctx[n - 2], ctx[n - 1]);
        let s = if greedy(&seq) {
            &mut argmax
        } else {
            &mut sampled
        };
        let d = s.distribution(&row, &TokenCounts::new()).unwrap();
        for (&id, &p) in d.ids().iter().zip(d.probs()) {
            let mut next = seq.clone();
            next.push(id);
            stack.push((next, pr * p));
        }
    }
    out
}

/// Pearson chi-square with bins under 5 expected pooled: (chi2, df).
fn chi_square(
    observed: &BTreeMap<Vec<u32>, usize>,
    expected: &BTreeMap<Vec<u32>, f64>,
    n: usize,
) -> (f64, usize) {
    if observed.keys().any(|k| !expected.contains_key(k)) {
        return (f64::INFINITY, 1);
    }
    let (mut chi, mut bins, mut pool_o, mut pool_e) = (0.0, 0usize, 0.0, 0.0);
    for (k, &p) in expected {
        let e = p * n as f64;
        let o = *observed.get(k).unwrap_or(&0) as f64;
        if e < 5.0 {
            pool_o += o;
            pool_e += e;
        } else {
            chi += (o - e) * (o - e) / e;
            bins += 1;
        }
    }
    if pool_e > 0.0 {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e.max(1e-9);
        bins += 1;
    }
    (chi, bins.saturating_sub(1).max(1))
}

/// Upper 1e-6 quantile of chi-square (Wilson–Hilferty, z = 4.753).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    k * (1.0 - 2.0 / (9.0 * k) + 4.753 * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn mtp_with_a_per_position_policy_is_distributed_as_ar_with_it() {
    const N: usize = 6000;
    for law in [Law::Ds4, Law::Nucleus] {
        let want = exact(law, policy);
        let without = exact(law, |_| false);
        for depth in 0..=3 {
            let mut seen: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
            for seed in 0..N as u64 {
                let (tokens, _, _) = run(law, depth, seed * 7919 + depth as u64, true);
                *seen.entry(tokens).or_default() += 1;
            }
            let (chi, df) = chi_square(&seen, &want, N);
            assert!(
                chi < critical(df),
                "{law:?} depth {depth}: chi2 {chi:.1} df {df} (critical {:.1})",
                critical(df)
            );
            // Power: the same samples reject sampling every position.
            let (off, odf) = chi_square(&seen, &without, N);
            assert!(
                off > critical(odf),
                "{law:?} depth {depth}: policy invisible ({off:.1})"
            );
        }
    }
}

#[test]
fn greedy_positions_take_no_draws_and_drafts_ask_for_their_own_position() {
    for law in [Law::Ds4, Law::Nucleus] {
        let zero = SamplingParams {
            temperature: 0.0,
            ..params(law)
        };
        let mut argmax = Sampler::new(law, zero, 0).unwrap();
        for depth in 0..=3 {
            let mut ahead = 0;
            for seed in 0..200 {
                let (tokens, draws, observer) = run(law, depth, seed, true);
                ahead += observer.ahead;
                // Every emitted position was decided on exactly its prefix,
                // and the greedy ones hold the target's argmax.
                let mut ctx = PROMPT.to_vec();
                for (i, &t) in tokens.iter().enumerate() {
                    let before = tokens[..i].to_vec();
                    assert!(
                        observer.asked.iter().any(|(b, _)| *b == before),
                        "position {i} never asked"
                    );
                    if policy(&before) {
                        let n = ctx.len();
                        let row = target(ctx[n - 2], ctx[n - 1]);
                        let best = argmax.sample(&row, &TokenCounts::new()).unwrap().token;
                        assert_eq!(t, best, "{law:?} depth {depth} seed {seed} position {i}");
                    }
                    ctx.push(t);
                }
                // AR draws once per sampled position exactly.
                if depth == 0 {
                    let sampled = (0..tokens.len()).filter(|&i| !policy(&tokens[..i])).count();
                    assert_eq!(draws, sampled as u64, "{law:?} seed {seed}");
                }
            }
            // Drafts after the first ask about their own position, past the
            // drafts before them.
            assert_eq!(ahead > 0, depth >= 2, "{law:?} depth {depth}: {ahead}");
        }
    }
}

#[test]
fn a_hook_that_never_fires_changes_nothing() {
    for law in [Law::Ds4, Law::Nucleus] {
        for depth in 0..=3 {
            for seed in 0..100 {
                let mut s = Sampler::new(law, params(law), seed).unwrap();
                let mut session = LiveSession::new(&Toy);
                let plain = generate(
                    &Toy,
                    &mut session,
                    TurnRequest {
                        prompt: &PROMPT,
                        sampler: &mut s,
                        config: config(),
                        mtp_depth: Some(depth),
                    },
                    &mut (),
                )
                .unwrap();
                let (tokens, draws, _) = run(law, depth, seed, false);
                assert_eq!((tokens, draws), (plain.tokens, s.draws_taken()));
            }
        }
    }
}

// ---- Token masks ([`TurnObserver::allowed_after`]) ----

/// A prefix-dependent constraint over the toy vocabulary: the token after
/// `t` may not be `(t + 1) % V`, the stop token is allowed only after two
/// tokens, and after `[.., 1, 1]` nothing is allowed (a dead end that ends
/// the turn with `NoAllowedToken`).
fn allowed(before: &[u32]) -> Vec<u32> {
    if before.ends_with(&[1, 1]) {
        return Vec::new();
    }
    let last = before.last().copied().unwrap_or(PROMPT[1]);
    (0..V as u32)
        .filter(|&t| t != (last + 1) % V as u32)
        .filter(|&t| t != STOP || before.len() >= 2)
        .collect()
}

/// Records emitted tokens and answers [`allowed`].
#[derive(Default)]
struct Masked {
    emitted: Vec<u32>,
    /// Every question: the tokens before the position.
    asked: Vec<Vec<u32>>,
}

impl TurnObserver for Masked {
    fn token(&mut self, event: TokenEvent) -> Flow {
        self.emitted.push(event.token);
        Flow::Continue
    }
    fn allowed_after(&mut self, pending: &[u32]) -> Option<super::TokenMask> {
        let mut before = self.emitted.clone();
        before.extend_from_slice(pending);
        let mask = super::TokenMask::from_tokens(V, allowed(&before));
        self.asked.push(before);
        Some(mask)
    }
}

fn run_masked(law: Law, depth: usize, seed: u64, p: SamplingParams) -> (super::TurnResult, Masked) {
    let mut s = Sampler::new(law, p, seed).unwrap();
    let mut session = LiveSession::new(&Toy);
    let mut observer = Masked::default();
    let r = generate(
        &Toy,
        &mut session,
        TurnRequest {
            prompt: &PROMPT,
            sampler: &mut s,
            config: config(),
            mtp_depth: Some(depth),
        },
        &mut observer,
    )
    .unwrap();
    assert!(session.is_consistent());
    (r, observer)
}

/// Exact probability of every emitted sequence under [`allowed`]: each row
/// masked to `-inf` outside the allowed set, then the law; an empty set
/// ends the sequence.
fn exact_masked(law: Law) -> BTreeMap<Vec<u32>, f64> {
    let mut sampler = Sampler::new(law, params(law), 0).unwrap();
    let mut out = BTreeMap::new();
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, pr)) = stack.pop() {
        let ok = allowed(&seq);
        if seq.len() == MAX || seq.last() == Some(&STOP) || ok.is_empty() {
            *out.entry(seq).or_default() += pr;
            continue;
        }
        let mut ctx = PROMPT.to_vec();
        ctx.extend(&seq);
        let n = ctx.len();
        let row = target(ctx[n - 2], ctx[n - 1]);
        let masked: Vec<f32> = (0..V)
            .map(|t| {
                if ok.contains(&(t as u32)) {
                    row[t]
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let d = sampler.distribution(&masked, &TokenCounts::new()).unwrap();
        for (&id, &p) in d.ids().iter().zip(d.probs()) {
            let mut next = seq.clone();
            next.push(id);
            stack.push((next, pr * p));
        }
    }
    out
}

#[test]
fn masked_mtp_is_distributed_as_masked_ar() {
    const N: usize = 6000;
    for law in [Law::Ds4, Law::Nucleus] {
        let want = exact_masked(law);
        let unmasked = exact(law, |_| false);
        // The constraint's dead end is reachable and visible.
        assert!(want.keys().any(|k| k.ends_with(&[1, 1]) && k.len() < MAX));
        for depth in 0..=3 {
            let mut seen: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
            for seed in 0..N as u64 {
                let (r, _) = run_masked(law, depth, seed * 7919 + depth as u64, params(law));
                // Nothing outside the mask is ever emitted.
                for i in 0..r.tokens.len() {
                    assert!(allowed(&r.tokens[..i]).contains(&r.tokens[i]));
                }
                let dead = allowed(&r.tokens).is_empty() && r.tokens.last() != Some(&STOP);
                assert_eq!(
                    r.finish_reason == super::FinishReason::NoAllowedToken,
                    dead && r.tokens.len() < MAX,
                    "{law:?} depth {depth}: {:?} {:?}",
                    r.tokens,
                    r.finish_reason
                );
                *seen.entry(r.tokens).or_default() += 1;
            }
            let (chi, df) = chi_square(&seen, &want, N);
            assert!(
                chi < critical(df),
                "{law:?} depth {depth}: chi2 {chi:.1} df {df} (critical {:.1})",
                critical(df)
            );
            // Power: the same samples reject the unmasked law.
            let (off, odf) = chi_square(&seen, &unmasked, N);
            assert!(
                off > critical(odf),
                "{law:?} depth {depth}: mask invisible ({off:.1})"
            );
        }
    }
}

#[test]
fn greedy_masked_mtp_equals_masked_ar_and_asks_each_position_once_per_cycle() {
    for law in [Law::Ds4, Law::Nucleus] {
        let zero = SamplingParams {
            temperature: 0.0,
            ..params(law)
        };
        let (ar, _) = run_masked(law, 0, 1, zero);
        for depth in 1..=3 {
            let (mtp, observer) = run_masked(law, depth, 1, zero);
            assert_eq!(mtp.tokens, ar.tokens, "{law:?} depth {depth}");
            assert_eq!(mtp.finish_reason, ar.finish_reason);
            // Every emitted position was masked on exactly its prefix.
            for i in 0..mtp.tokens.len() {
                assert!(observer.asked.contains(&mtp.tokens[..i].to_vec()));
            }
        }
    }
}

#[test]
fn a_dead_end_before_the_first_token_ends_the_turn_at_once() {
    struct Nothing;
    impl TurnObserver for Nothing {
        fn allowed_after(&mut self, _: &[u32]) -> Option<super::TokenMask> {
            Some(super::TokenMask::none(V))
        }
    }
    for depth in 0..=2 {
        let mut s = Sampler::new(Law::Ds4, params(Law::Ds4), 5).unwrap();
        let mut session = LiveSession::new(&Toy);
        let r = generate(
            &Toy,
            &mut session,
            TurnRequest {
                prompt: &PROMPT,
                sampler: &mut s,
                config: config(),
                mtp_depth: Some(depth),
            },
            &mut Nothing,
        )
        .unwrap();
        assert!(r.tokens.is_empty());
        assert_eq!(r.finish_reason, super::FinishReason::NoAllowedToken);
        assert_eq!(r.final_state, super::FinalState::Complete);
        assert_eq!(session.tokens(), &PROMPT);
        assert_eq!(s.draws_taken(), 0);
    }
}
