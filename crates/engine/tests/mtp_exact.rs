//! The MTP loop is distribution-exact: a toy target and drafter (a tiny
//! `Model` with a 4-token vocabulary whose logits are fixed functions of the
//! last two tokens) run through the real MTP loop (`decode::generate`), and the
//! distribution of whole emitted sequences equals AR sampling, computed
//! exactly by enumeration under the same law. The check is a chi-square
//! with fixed seeds (deterministic: it cannot flake), with a power check
//! that the drafter's own law is rejected. A second test writes the draw
//! order of sampling.md section 5 out independently and requires the loop
//! to take the same draws (tokens and draw counts) for many seeds.

use std::collections::BTreeMap;

use ds4_engine::backend::CpuOps;
use ds4_engine::decode::{self, Flow, LiveSession, TurnConfig, TurnRequest};
use ds4_engine::error::Result;
use ds4_engine::families::FamilyDescriptor;
use ds4_engine::{
    DeviceRows, EngineError, ForwardOutput, HiddenRows, LogitsRows, Model, ModelState, MtpContract,
    MtpHistory, MtpStep, VerifyWindow,
};
use ds4_sampling::{Law, Sampler, SamplingParams, TokenCounts};

const V: usize = 4;
const STOP: u32 = 3;

static TOY: FamilyDescriptor = FamilyDescriptor {
    name: "toy",
    model_types: &[],
    gguf_architectures: &[],
    law: Law::Nucleus,
    sampling_defaults: Law::Nucleus.default_params(),
};

/// Target logits after `(a, b)` (the last two tokens).
fn target(a: u32, b: u32) -> Vec<f32> {
    (0..V as u32)
        .map(|v| ((a * 7 + b * 13 + v * 29 + a * v * 3) % 11) as f32 / 5.0)
        .collect()
}

/// Drafter logits after `(a, b)`: the target perturbed, so `q != p`.
fn drafter(a: u32, b: u32) -> Vec<f32> {
    let mut l = target(a, b);
    l[((a + 2 * b) % V as u32) as usize] += 1.5;
    l[(b % V as u32) as usize] -= 1.0;
    l
}

/// A drafter over a fixed vocabulary subset, as the llama head drafts:
/// token 1 is outside it (`-inf`, probability 0 in the draft law).
fn drafter_subset(a: u32, b: u32) -> Vec<f32> {
    let mut l = drafter(a, b);
    l[1] = f32::NEG_INFINITY;
    l
}

thread_local! {
    /// Whether [`Toy`]'s head drafts from the subset ([`drafter_subset`]).
    static SUBSET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

struct Toy;

#[derive(Clone, Debug, PartialEq)]
struct ToyState(Vec<u32>);

/// (base, rows) of a verify window.
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

/// MTP rows `(hidden token, token)`.
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

/// The trunk hidden of a position is its token (what the drafter needs).
type Hidden = DeviceRows<CpuOps>;

fn hidden_of(tokens: &[u32]) -> Hidden {
    let v: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
    DeviceRows::new(&CpuOps, v, tokens.len(), 1).unwrap()
}

fn hidden_tokens(h: &Hidden) -> Vec<u32> {
    h.to_host()
        .unwrap()
        .2
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

impl Toy {
    fn rows(&self, state: &mut ToyState, tokens: &[u32]) -> Result<ForwardOutput> {
        if state.0.is_empty() && tokens.len() < 2 {
            return Err(EngineError::State("the toy needs two prompt tokens".into()));
        }
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
        Ok(ForwardOutput {
            logits,
            rows: tokens.len(),
            vocab: V,
        })
    }
}

fn last_rows(out: ForwardOutput, rows: LogitsRows) -> ForwardOutput {
    match rows {
        LogitsRows::All => out,
        LogitsRows::Last => ForwardOutput {
            logits: out.last_row().to_vec(),
            rows: 1,
            vocab: V,
        },
    }
}

impl Model for Toy {
    type State = ToyState;
    type MtpHistory = ToyHistory;
    type Hidden = Hidden;
    fn descriptor(&self) -> &'static FamilyDescriptor {
        &TOY
    }
    fn backend(&self) -> ds4_engine::backend::BackendId {
        ds4_engine::backend::Backend::id(&ds4_engine::backend::CpuOps)
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
    fn forward(&self, tokens: &[u32], s: &mut ToyState, rows: LogitsRows) -> Result<ForwardOutput> {
        Ok(last_rows(self.rows(s, tokens)?, rows))
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
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, Hidden)> {
        Ok((last_rows(self.rows(s, tokens)?, rows), hidden_of(tokens)))
    }
    fn forward_window(
        &self,
        tokens: &[u32],
        s: &mut ToyState,
    ) -> Result<VerifyWindow<ToyWindow, Hidden>> {
        let base = s.0.len();
        Ok(VerifyWindow {
            logits: self.rows(s, tokens)?,
            hidden: hidden_of(tokens),
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
        let hs = hidden_tokens(hidden);
        if hs.len() != tokens.len() || tokens.is_empty() {
            return Err(EngineError::State("rows mismatch".into()));
        }
        h.0.extend(hs.iter().copied().zip(tokens.iter().copied()));
        let (a, b) = (hs[hs.len() - 1], tokens[tokens.len() - 1]);
        let draft = if SUBSET.get() {
            drafter_subset
        } else {
            drafter
        };
        Ok(MtpStep {
            logits: draft(a, b),
            hidden: hidden_of(&[b]),
        })
    }
}

fn params(temperature: f64, law: Law) -> SamplingParams {
    match law {
        Law::Nucleus => SamplingParams {
            temperature,
            top_p: 0.9,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.3,
            frequency_penalty: 0.0,
        },
        Law::Ds4 => SamplingParams {
            temperature,
            top_p: 0.95,
            top_k: 0,
            min_p: 0.05,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        },
    }
}

const PROMPT: [u32; 2] = [1, 2];
const MAX: usize = 4;

fn config() -> TurnConfig {
    TurnConfig {
        max_tokens: MAX,
        stop_token_ids: vec![STOP],
        prefill_chunk: 16,
        logprobs: None,
        cancel: Default::default(),
    }
}

/// Exact probability of every whole emitted sequence under a chain of
/// rows `row(a, b)` and the law (penalties from the emitted tokens).
fn exact(law: Law, temperature: f64, row: fn(u32, u32) -> Vec<f32>) -> BTreeMap<Vec<u32>, f64> {
    let mut out = BTreeMap::new();
    let mut s = Sampler::new(law, params(temperature, law), 0).unwrap();
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, pr)) = stack.pop() {
        if seq.len() == MAX || seq.last() == Some(&STOP) {
            *out.entry(seq).or_default() += pr;
            continue;
        }
        let mut ctx = PROMPT.to_vec();
        ctx.extend(&seq);
        let n = ctx.len();
        let mut counts = TokenCounts::new();
        for &t in &seq {
            counts.add(t);
        }
        let d = s
            .distribution(&row(ctx[n - 2], ctx[n - 1]), &counts)
            .unwrap();
        let total: f64 = d.probs().iter().sum();
        for (&id, &p) in d.ids().iter().zip(d.probs()) {
            let mut next = seq.clone();
            next.push(id);
            stack.push((next, pr * p / total));
        }
    }
    out
}

/// Pearson chi-square of `observed` (n samples) against `expected`
/// probabilities, bins with expectation < 5 pooled; returns (chi2, df)
/// (infinite when a sequence outside the support was observed).
fn chi_square(
    observed: &BTreeMap<Vec<u32>, usize>,
    expected: &BTreeMap<Vec<u32>, f64>,
    n: usize,
) -> (f64, usize) {
    if observed.keys().any(|k| !expected.contains_key(k)) {
        // A sequence outside the expected support: rejected outright.
        return (f64::INFINITY, 1);
    }
    let (mut chi, mut bins) = (0.0, 0);
    let (mut pool_o, mut pool_e) = (0.0, 0.0);
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
    (chi, bins - 1)
}

/// Upper 1e-6 quantile of chi-square with `df` degrees of freedom
/// (Wilson–Hilferty, z = 4.753).
fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 4.753;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

fn run_mtp(law: Law, temperature: f64, depth: usize, seed: u64) -> (Vec<u32>, u64) {
    let (t, d, _) = run_mtp_stats(law, temperature, depth, seed);
    (t, d)
}

fn run_mtp_stats(
    law: Law,
    temperature: f64,
    depth: usize,
    seed: u64,
) -> (Vec<u32>, u64, decode::MtpStats) {
    run_mtp_stopping(law, temperature, depth, seed, None)
}

/// One toy turn under a draft-stop threshold (`None`: the toy's contract,
/// which sets none).
fn run_mtp_stopping(
    law: Law,
    temperature: f64,
    depth: usize,
    seed: u64,
    stop: Option<f32>,
) -> (Vec<u32>, u64, decode::MtpStats) {
    let (r, draws) = toy_turn(law, temperature, depth, seed, stop);
    (r.tokens, draws, r.mtp.unwrap())
}

/// One toy turn at `depth` (0: AR) and the draws it took.
fn toy_turn(
    law: Law,
    temperature: f64,
    depth: usize,
    seed: u64,
    stop: Option<f32>,
) -> (decode::TurnResult, u64) {
    let mut s = Sampler::new(law, params(temperature, law), seed).unwrap();
    let mut session = LiveSession::new(&Toy);
    let r = decode::generate_with_draft_stop(
        &Toy,
        &mut session,
        TurnRequest {
            prompt: &PROMPT,
            sampler: &mut s,
            config: config(),
            mtp_depth: Some(depth),
        },
        stop,
        &mut (),
    )
    .unwrap();
    assert!(session.is_consistent());
    (r, s.draws_taken())
}

/// Whole-sequence distribution and per-position marginals of sampled MTP
/// (both laws, depth 1..3) equal exact AR sampling; the drafter's own law
/// is rejected by the same test (it has power).
#[test]
fn mtp_sampled_sequences_are_distributed_as_ar() {
    const N: usize = 20000;
    for law in [Law::Nucleus, Law::Ds4] {
        let want = exact(law, 0.6, target);
        let draft_law = exact(law, 0.6, drafter);
        // A near miss the test must also reject: the target at T = 0.7.
        let near = exact(law, 0.7, target);
        for depth in 1..=3 {
            let mut seen: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
            let (mut acc, mut drafted, mut bonus) = (0, 0, 0);
            for seed in 0..N as u64 {
                let (toks, _, st) = run_mtp_stats(law, 0.6, depth, seed * 7919 + depth as u64);
                *seen.entry(toks).or_default() += 1;
                acc += st.accepted_total();
                drafted += st.drafted_total();
                bonus += st.bonus;
            }
            eprintln!("  accepted {acc}/{drafted}, bonus {bonus}");
            // Both acceptance and rejection, and bonus tokens, happened.
            // (At depth 3 every full acceptance reaches max_tokens = 4 first.)
            assert!(acc > drafted / 10 && acc < drafted && (bonus > 0 || depth + 1 >= MAX));
            let (nm, ndf) = chi_square(&seen, &near, N);
            eprintln!("  vs T=0.7: chi2 {nm:.1} (df {ndf})");
            assert!(
                nm > critical(ndf),
                "{law:?} depth {depth}: T=0.7 not rejected ({nm})"
            );
            let (chi, df) = chi_square(&seen, &want, N);
            eprintln!(
                "{law:?} depth {depth}: chi2 {chi:.1} (df {df}, critical {:.1})",
                critical(df)
            );
            let (bad, bdf) = chi_square(&seen, &draft_law, N);
            eprintln!("  vs drafter law: chi2 {bad:.1} (df {bdf})");
            assert!(
                chi < critical(df),
                "{law:?} depth {depth}: chi2 {chi} df {df}"
            );
            let (bad, bdf) = chi_square(&seen, &draft_law, N);
            assert!(
                bad > critical(bdf),
                "{law:?} depth {depth}: the drafter's law was not rejected ({bad})"
            );
            // Per-position marginals: token at position j (given length > j).
            for j in 0..MAX {
                let mut obs: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
                let mut exp: BTreeMap<Vec<u32>, f64> = BTreeMap::new();
                let mut n = 0;
                for (k, &c) in &seen {
                    if let Some(&t) = k.get(j) {
                        *obs.entry(vec![t]).or_default() += c;
                        n += c;
                    }
                }
                let mass: f64 = want
                    .iter()
                    .filter(|(k, _)| k.len() > j)
                    .map(|(_, p)| p)
                    .sum();
                for (k, &p) in &want {
                    if let Some(&t) = k.get(j) {
                        *exp.entry(vec![t]).or_default() += p / mass;
                    }
                }
                if n < 200 {
                    continue;
                }
                let (chi, df) = chi_square(&obs, &exp, n);
                assert!(
                    df == 0 || chi < critical(df),
                    "{law:?} depth {depth} position {j}: chi2 {chi}"
                );
            }
        }
    }
}

/// The subset draft (tokens outside it at `-inf`, as the llama head's):
/// sampled MTP is still distributed as AR at depth 1..3, the token the
/// drafter can never propose is still emitted (the residual restores its
/// mass), and the subset drafter's own law is rejected.
#[test]
fn mtp_subset_draft_sequences_are_distributed_as_ar() {
    const N: usize = 20000;
    SUBSET.set(true);
    let law = Law::Nucleus;
    let want = exact(law, 0.6, target);
    let draft_law = exact(law, 0.6, drafter_subset);
    for depth in 1..=3 {
        let mut seen: BTreeMap<Vec<u32>, usize> = BTreeMap::new();
        let (mut acc, mut drafted) = (0, 0);
        for seed in 0..N as u64 {
            let (toks, _, st) = run_mtp_stats(law, 0.6, depth, seed * 7919 + depth as u64);
            *seen.entry(toks).or_default() += 1;
            acc += st.accepted_total();
            drafted += st.drafted_total();
        }
        assert!(acc > drafted / 10 && acc < drafted, "{acc}/{drafted}");
        let ones: usize = seen
            .iter()
            .filter(|(k, _)| k.contains(&1))
            .map(|(_, &c)| c)
            .sum();
        assert!(ones > N / 20, "token 1 emitted in {ones} of {N} sequences");
        let (chi, df) = chi_square(&seen, &want, N);
        eprintln!(
            "subset depth {depth}: accepted {acc}/{drafted}, chi2 {chi:.1} (df {df}, critical {:.1})",
            critical(df)
        );
        assert!(
            chi < critical(df),
            "subset depth {depth}: chi2 {chi} df {df}"
        );
        let (bad, bdf) = chi_square(&seen, &draft_law, N);
        assert!(
            bad > critical(bdf),
            "subset depth {depth}: the drafter's law was not rejected ({bad})"
        );
    }
    SUBSET.set(false);
}

/// A draft-stop threshold (drafting ends before a greedy draft whose
/// drafter row gives its top token less than the threshold): greedy MTP
/// still equals AR at depth 1..3 under both laws, with cycles really cut
/// short; a sampled turn is untouched (the same tokens and the same draws
/// as without a threshold, every cycle at full depth).
#[test]
fn mtp_draft_stop_keeps_greedy_exact_and_sampled_draws_unchanged() {
    // Cuts some greedy cycles short (asserted below).
    const STOP_BELOW: f32 = 0.7;
    let run = run_mtp_stopping;
    for law in [Law::Nucleus, Law::Ds4] {
        let greedy = exact(law, 0.0, target);
        let mut short = 0;
        for depth in 1..=3 {
            let (toks, draws, st) = run(law, 0.0, depth, 0, Some(STOP_BELOW));
            assert_eq!(
                greedy.get(&toks),
                Some(&1.0),
                "{law:?} depth {depth} greedy"
            );
            assert_eq!(draws, 0);
            // drafted[i] counts the cycles that drafted at least i + 1.
            short += st.cycles - st.drafted[depth - 1];
            for seed in 0..500u64 {
                let (toks, draws, st) = run(law, 0.6, depth, seed, Some(STOP_BELOW));
                let (want, want_draws, _) = run(law, 0.6, depth, seed, None);
                assert_eq!(
                    (toks, draws),
                    (want, want_draws),
                    "{law:?} depth {depth} seed {seed}"
                );
                assert_eq!(
                    st.drafted[depth - 1],
                    st.cycles,
                    "a sampled cycle was cut short"
                );
            }
        }
        eprintln!("{law:?}: {short} greedy cycles cut short");
        assert!(short > 0, "{law:?}: no greedy cycle was cut short");
    }
}

/// The spec's draw order written out on the toy: primary (first cycle),
/// drafts 1..k, one uniform per position up to the first rejection, then
/// residual or bonus. The loop must take exactly these draws: same tokens
/// and the same number of draws for every seed, at depth 1..3, both laws.
/// Greedy takes no draws and equals AR greedy.
#[test]
fn mtp_draw_order_is_the_spec_order() {
    for law in [Law::Nucleus, Law::Ds4] {
        for depth in 1..=3 {
            for seed in 0..300u64 {
                let (got, draws) = run_mtp(law, 0.6, depth, seed);
                let mut s = Sampler::new(law, params(0.6, law), seed).unwrap();
                let want = reference_cycle(&mut s, depth);
                assert_eq!(got, want, "{law:?} depth {depth} seed {seed}");
                assert_eq!(
                    draws,
                    s.draws_taken(),
                    "{law:?} depth {depth} seed {seed}: draws"
                );
            }
            // Greedy: no draws, AR tokens.
            let (got, draws) = run_mtp(law, 0.0, depth, 1);
            assert_eq!(draws, 0);
            let mut s = Sampler::new(law, params(0.0, law), 1).unwrap();
            let mut session = LiveSession::new(&Toy);
            let ar = decode::generate(
                &Toy,
                &mut session,
                TurnRequest {
                    prompt: &PROMPT,
                    sampler: &mut s,
                    config: config(),
                    mtp_depth: Some(0),
                },
                &mut (),
            )
            .unwrap();
            assert_eq!(got, ar.tokens);
        }
    }
}

/// One turn of the toy in the spec's order, written out with the law's
/// public primitives.
fn reference_cycle(s: &mut Sampler, k: usize) -> Vec<u32> {
    let mut ctx = PROMPT.to_vec();
    let mut out: Vec<u32> = Vec::new();
    let mut counts = TokenCounts::new();
    let done = |out: &Vec<u32>| out.len() >= MAX || out.last() == Some(&STOP);
    let n = ctx.len();
    // 1. primary (first cycle only).
    let mut primary = s
        .sample(&target(ctx[n - 2], ctx[n - 1]), &counts)
        .unwrap()
        .token;
    out.push(primary);
    counts.add(primary);
    while !done(&out) {
        // 2. drafts.
        let mut prev = (*ctx.last().unwrap(), primary);
        let (mut drafts, mut qs) = (Vec::new(), Vec::new());
        let mut dc = counts.clone();
        for _ in 0..k {
            let q = s.distribution(&drafter(prev.0, prev.1), &dc).unwrap();
            let d = s.sample_from(&q);
            dc.add(d);
            drafts.push(d);
            qs.push(q);
            prev = (prev.1, d);
        }
        // 3. uniforms until the first rejection; 4. residual or bonus.
        ctx.push(primary);
        let mut next = None;
        let mut ended = false;
        for i in 0..k {
            let n = ctx.len();
            let p = s
                .distribution(&target(ctx[n - 2], ctx[n - 1]), &counts)
                .unwrap();
            if s.accept(&p, &qs[i], drafts[i]) {
                out.push(drafts[i]);
                counts.add(drafts[i]);
                ctx.push(drafts[i]);
                if done(&out) {
                    ended = true;
                    break;
                }
            } else {
                next = Some(s.sample_from(&Sampler::residual(&p, &qs[i])));
                break;
            }
        }
        if ended {
            break;
        }
        let t = match next {
            Some(t) => t,
            None => {
                let n = ctx.len();
                s.sample(&target(ctx[n - 2], ctx[n - 1]), &counts)
                    .unwrap()
                    .token
            }
        };
        out.push(t);
        counts.add(t);
        primary = t;
    }
    out
}

/// A turn config, the callback's stop (index, why), the expected finish.
type Route = (
    TurnConfig,
    Option<(usize, ds4_engine::decode::CallerStop)>,
    ds4_engine::decode::FinishReason,
);

/// Exit routes on the toy, where bonus tokens are frequent: every route ×
/// depth 1..3 × greedy / T = 0.6 × (first primary, accepted draft, residual,
/// bonus). The banked session must equal the teacher-forced one exactly:
/// trunk tokens, MTP rows `(token_t, token_{t+1})`, last hidden and logits.
#[test]
fn mtp_toy_exit_matrix_including_bonus() {
    use ds4_engine::decode::{
        CallerStop, FinalState, FinishReason, TokenSource, TurnRequest, on_tokens,
    };
    let mut covered = std::collections::BTreeSet::new();
    for temperature in [0.0, 0.6] {
        for depth in 1..=3usize {
            for seed in 0..40u64 {
                let prompt = [(seed % 3) as u32, (seed / 3 % 3) as u32];
                let params_ = params(temperature, Law::Nucleus);
                let run = |cfg: &TurnConfig, stop_at: Option<(usize, CallerStop)>| {
                    let mut s = Sampler::new(Law::Nucleus, params_, seed).unwrap();
                    let mut session = LiveSession::new(&Toy);
                    let mut src = Vec::new();
                    let r = decode::generate(
                        &Toy,
                        &mut session,
                        TurnRequest {
                            prompt: &prompt,
                            sampler: &mut s,
                            config: cfg.clone(),
                            mtp_depth: Some(depth),
                        },
                        &mut on_tokens(|e| {
                            src.push(e.source);
                            match stop_at {
                                Some((i, why)) if i == e.index => Flow::Stop(why),
                                _ => Flow::Continue,
                            }
                        }),
                    )
                    .unwrap();
                    (r, session, src)
                };
                let free = TurnConfig {
                    max_tokens: 8,
                    stop_token_ids: vec![],
                    prefill_chunk: 16,
                    logprobs: None,
                    cancel: Default::default(),
                };
                let (r, _, src) = run(&free, None);
                for (i, source) in src.iter().enumerate() {
                    let kind = match source {
                        TokenSource::Sampled => 0,
                        TokenSource::Draft(_) => 1,
                        TokenSource::Residual => 2,
                        TokenSource::Bonus => 3,
                    };
                    let routes: [Route; 4] = [
                        (
                            TurnConfig {
                                max_tokens: i + 1,
                                ..free.clone()
                            },
                            None,
                            FinishReason::MaxTokens,
                        ),
                        (
                            free.clone(),
                            Some((i, CallerStop::StopString)),
                            FinishReason::Caller(CallerStop::StopString),
                        ),
                        (
                            free.clone(),
                            Some((i, CallerStop::Cancelled)),
                            FinishReason::Caller(CallerStop::Cancelled),
                        ),
                        (
                            TurnConfig {
                                stop_token_ids: vec![r.tokens[i]],
                                ..free.clone()
                            },
                            None,
                            FinishReason::StopToken,
                        ),
                    ];
                    for (ri, (cfg, stop_at, want)) in routes.into_iter().enumerate() {
                        if ri == 3 && r.tokens[..i].contains(&r.tokens[i]) {
                            continue;
                        }
                        let (got, session, _) = run(&cfg, stop_at);
                        let what =
                            format!("T={temperature} depth {depth} seed {seed} index {i} {want:?}");
                        assert_eq!(got.tokens, r.tokens[..=i], "{what}");
                        assert_eq!(got.finish_reason, want, "{what}");
                        let mut full = prompt.to_vec();
                        full.extend(&got.tokens);
                        let toks = session.tokens().to_vec();
                        if ri == 2 {
                            assert_eq!(got.final_state, FinalState::Partial, "{what}");
                            assert!(
                                full.starts_with(&toks) && toks.len() + 1 >= full.len(),
                                "{what}"
                            );
                        } else {
                            assert_eq!(got.final_state, FinalState::Complete, "{what}");
                            assert_eq!(toks, full, "{what}");
                        }
                        // Teacher-forced comparison, exact.
                        assert_eq!(session.state().0, toks, "{what}");
                        let h = session.mtp_history().unwrap();
                        let want_rows: Vec<(u32, u32)> =
                            toks.windows(2).map(|w| (w[0], w[1])).collect();
                        assert_eq!(h.0, want_rows, "{what}: MTP history");
                        assert_eq!(
                            hidden_tokens(session.mtp_hidden().unwrap()),
                            [*toks.last().unwrap()]
                        );
                        let n = toks.len();
                        assert_eq!(
                            session.last_logits().unwrap(),
                            &target(toks[n - 2], toks[n - 1])[..],
                            "{what}"
                        );
                        covered.insert((temperature.to_bits(), depth, kind, ri));
                    }
                }
            }
        }
    }
    // Every (temperature, depth, point kind, route) combination was reached,
    // except a greedy bonus at depth 3: the greedy toy never accepts three
    // drafts in a row (its drafter's argmax differs too often).
    for t in [0.0f64, 0.6] {
        for depth in 1..=3usize {
            for kind in 0..4 {
                for route in 0..4 {
                    if t == 0.0 && depth == 3 && kind == 3 {
                        continue;
                    }
                    assert!(
                        covered.contains(&(t.to_bits(), depth, kind, route)),
                        "T={t} depth {depth} kind {kind} route {route} not reached"
                    );
                }
            }
        }
    }
}

/// The decode time's split (what `bench --mtp` reports per cycle): trunk
/// and head forwards are parts of the decode time, the trunk ran in every
/// turn, and the head only in MTP turns.
#[test]
fn turn_timings_split_the_decode_time_into_trunk_and_head() {
    for depth in 0..=3 {
        let t = toy_turn(Law::Nucleus, 0.6, depth, 3, None).0.timings;
        assert!(t.decode_tokens > 1, "depth {depth}: the turn decoded");
        assert!(t.decode_trunk > std::time::Duration::ZERO, "depth {depth}");
        assert!(
            t.decode_trunk + t.decode_head <= t.decode,
            "depth {depth}: {t:?}"
        );
        assert_eq!(t.decode_head.is_zero(), depth == 0, "depth {depth}: {t:?}");
    }
}
