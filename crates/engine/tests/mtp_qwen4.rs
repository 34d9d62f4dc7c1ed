//! MTP speculative decoding on the tiny `qwen4_exp` fixtures (real trunk,
//! real MTP head, real verify-window commit): greedy MTP equals greedy AR
//! token for token and state for state; every exit route at depth 1, 2, 3,
//! greedy and sampled, banks a session equal to a teacher-forced forward of
//! what it covers, and the next turn's logits equal a cold run's; failed and
//! cancelled turns never claim a complete state.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use ds4_engine::backend::CpuOps;
use ds4_engine::decode::{
    self, CallerStop, FinalState, FinishReason, Flow, LiveSession, TokenSource, TurnConfig,
    TurnRequest, TurnResult, on_tokens,
};
use ds4_engine::families::FamilyDescriptor;
use ds4_engine::families::qwen4_exp::{MtpState, Qwen4ExpModel, Qwen4ExpState, WindowCapture};
use ds4_engine::state::table::NamedTensor;
use ds4_engine::{
    DeviceRows, EngineError, ForwardOutput, HiddenRows, LogitsRows, Model, ModelState, MtpContract,
    MtpStep, VerifyWindow,
};
use ds4_sampling::{Law, Sampler, SamplingParams};

fn load(name: &str) -> Qwen4ExpModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen4_exp")
        .join(name);
    Qwen4ExpModel::from_hf_dir(&dir).unwrap()
}

/// Deterministic pseudo-random prompt.
fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 120) as u32 + 3
        })
        .collect()
}

fn sampler(temperature: f64, seed: u64) -> Sampler {
    let params = SamplingParams {
        temperature,
        ..Law::Nucleus.default_params()
    };
    Sampler::new(Law::Nucleus, params, seed).unwrap()
}

fn config(max_tokens: usize, stop: Vec<u32>) -> TurnConfig {
    TurnConfig {
        max_tokens,
        stop_token_ids: stop,
        prefill_chunk: 2048,
        logprobs: None,
        cancel: Default::default(),
    }
}

/// One turn; `depth` 0 is AR. `stop_at`: the callback's answer at an index.
#[allow(clippy::too_many_arguments)]
fn turn<M: Model>(
    model: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    temperature: f64,
    seed: u64,
    depth: usize,
    cfg: &TurnConfig,
    stop_at: Option<(usize, CallerStop)>,
) -> (ds4_engine::error::Result<TurnResult>, Vec<TokenSource>) {
    let mut s = sampler(temperature, seed);
    let mut sources = Vec::new();
    let r = decode::generate(
        model,
        session,
        TurnRequest {
            prompt,
            sampler: &mut s,
            config: cfg.clone(),
            mtp_depth: Some(depth),
        },
        &mut on_tokens(|e| {
            sources.push(e.source);
            match stop_at {
                Some((i, why)) if i == e.index => Flow::Stop(why),
                _ => Flow::Continue,
            }
        }),
    );
    (r, sources)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

fn table_diff(what: &str, a: Vec<NamedTensor>, b: Vec<NamedTensor>) -> f32 {
    common::table_max_diff(what, a, b)
}

fn host(h: &DeviceRows<CpuOps>) -> Vec<f32> {
    h.to_host().unwrap().2
}

/// Teacher-forced reference of `tokens`: trunk state, MTP history of one
/// row less, last logits and last hidden.
struct Teacher {
    state: Qwen4ExpState,
    mtp: MtpState,
    logits: Vec<f32>,
    hidden: Vec<f32>,
}

fn teacher(model: &Qwen4ExpModel, tokens: &[u32]) -> Teacher {
    let mut state = model.new_state();
    let out = model
        .forward_ext(tokens, &mut state, LogitsRows::Last, false)
        .unwrap();
    let n = tokens.len();
    let ch = model.config().hc_count * model.config().hidden_size;
    let mut mtp = model.new_mtp_state().unwrap();
    if n > 1 {
        let pos: Vec<u32> = (0..n as u32 - 1).collect();
        model
            .mtp_forward(
                &tokens[1..],
                &out.streams[..(n - 1) * ch].to_vec(),
                &pos,
                &mut mtp,
                LogitsRows::Last,
            )
            .unwrap();
    }
    Teacher {
        state,
        mtp,
        logits: out.logits.last_row().to_vec(),
        hidden: out.streams[(n - 1) * ch..].to_vec(),
    }
}

/// Bound for state-vs-teacher comparisons: the teacher runs all rows in one
/// forward (matmul blocking over many rows), the session in prefill, verify
/// windows and single steps; same math, f32 summation order may differ in
/// the last bits. Observed differences are printed.
const TOL: f32 = 1e-4;

/// The session covers exactly its tokens; compare every cache with the
/// teacher, tensor for tensor.
fn assert_banked(model: &Qwen4ExpModel, session: &LiveSession<Qwen4ExpModel>, what: &str) -> f32 {
    assert!(session.is_consistent(), "{what}: inconsistent session");
    let t = teacher(model, session.tokens());
    let st = session.state();
    assert_eq!(st.len(), session.tokens().len());
    let mut worst = table_diff(what, st.export().unwrap(), t.state.export().unwrap());
    let hist = session
        .mtp_history()
        .expect("an MTP turn keeps its history");
    assert_eq!(
        hist.len() + 1,
        session.tokens().len(),
        "{what}: MTP history length"
    );
    worst = worst.max(table_diff(
        what,
        ds4_engine::MtpHistory::export(hist).unwrap(),
        ds4_engine::MtpHistory::export(&t.mtp).unwrap(),
    ));
    worst = worst.max(max_diff(session.last_logits().unwrap(), &t.logits));
    worst = worst.max(max_diff(&host(session.mtp_hidden().unwrap()), &t.hidden));
    assert!(
        worst <= TOL,
        "{what}: banked state differs from teacher by {worst}"
    );
    worst
}

/// The next turn (appending two tokens) prefills only the new tokens and
/// ends with logits and MTP state equal to a cold run's.
fn assert_next_turn(
    model: &Qwen4ExpModel,
    session: &mut LiveSession<Qwen4ExpModel>,
    what: &str,
) -> f32 {
    let mut next = session.tokens().to_vec();
    next.extend([7, 11]);
    let covered = session.tokens().len();
    let (r, _) = turn(model, session, &next, 0.0, 0, 2, &config(0, vec![]), None);
    let r = r.unwrap();
    assert_eq!(
        r.reused_tokens, covered,
        "{what}: the banked state is reused"
    );
    let mut cold = LiveSession::new(model);
    let (c, _) = turn(model, &mut cold, &next, 0.0, 0, 2, &config(0, vec![]), None);
    assert_eq!(c.unwrap().reused_tokens, 0);
    let d = max_diff(session.last_logits().unwrap(), cold.last_logits().unwrap());
    assert!(
        d <= TOL,
        "{what}: next-turn logits differ from a cold run by {d}"
    );
    d
}

/// Greedy MTP at depth 1, 2, 3 equals greedy AR: same tokens, same final
/// state (bit for bit: AR and MTP run the same prefill, and verify windows
/// of up to 8 rows use the per-row host kernels of single steps), same kept
/// logits.
#[test]
fn mtp_greedy_equals_ar_tokens_and_state() {
    let mut accepted = 0;
    let mut drafted = 0;
    for name in ["tiny_a", "tiny_b"] {
        let model = load(name);
        for p in 0..4u64 {
            let prompt = prompt(p, 4 + 3 * p as usize);
            let cfg = config(14, vec![]);
            let mut ar = LiveSession::new(&model);
            let (r, _) = turn(&model, &mut ar, &prompt, 0.0, 0, 0, &cfg, None);
            let ar_r = r.unwrap();
            assert_eq!(ar_r.final_state, FinalState::Complete);
            assert_eq!(ar.tokens().len(), prompt.len() + 14);
            for depth in 1..=3 {
                let mut s = LiveSession::new(&model);
                let (r, _) = turn(&model, &mut s, &prompt, 0.0, 0, depth, &cfg, None);
                let r = r.unwrap();
                assert_eq!(r.tokens, ar_r.tokens, "{name} prompt {p} depth {depth}");
                assert_eq!(r.final_state, FinalState::Complete);
                assert_eq!(s.tokens(), ar.tokens());
                assert_eq!(
                    s.state(),
                    ar.state(),
                    "{name} prompt {p} depth {depth}: state"
                );
                assert_eq!(s.last_logits(), ar.last_logits());
                let st = r.mtp.unwrap();
                accepted += st.accepted_total();
                drafted += st.drafted_total();
            }
        }
    }
    eprintln!("greedy: {accepted}/{drafted} drafts accepted");
    assert!(accepted > 0 && accepted < drafted);
}

/// The route a test exits on.
#[derive(Debug, Clone, Copy)]
enum Route {
    StopToken,
    StopString,
    MaxTokens,
    Cancel,
}

fn source_kind(s: TokenSource) -> usize {
    match s {
        TokenSource::Sampled => 0,
        TokenSource::Draft(_) => 1,
        TokenSource::Residual | TokenSource::Bonus => 2,
    }
}

/// Every exit route × depth 1..3 × greedy / T = 0.6 × the three points a
/// token can come from (first primary, accepted draft, residual or bonus).
#[test]
fn mtp_exit_matrix_banks_teacher_forced_state() {
    let model = load("tiny_a");
    let mut cases = 0;
    let mut worst = 0f32;
    let mut seen = [[false; 3]; 2];
    for (ti, temperature) in [0.0, 0.6].into_iter().enumerate() {
        for depth in 1..=3 {
            // Find, per point kind, a (prompt, index) whose token does not
            // occur earlier (so it can serve as a stop token).
            let mut targets: [Option<(u64, usize)>; 3] = [None; 3];
            for p in 0..8u64 {
                let pr = prompt(100 + p, 6);
                let mut s = LiveSession::new(&model);
                let (r, src) = turn(
                    &model,
                    &mut s,
                    &pr,
                    temperature,
                    p,
                    depth,
                    &config(12, vec![]),
                    None,
                );
                let toks = r.unwrap().tokens;
                for (i, k) in src.iter().map(|&s| source_kind(s)).enumerate() {
                    if targets[k].is_none() && !toks[..i].contains(&toks[i]) {
                        targets[k] = Some((p, i));
                    }
                }
                if targets.iter().all(Option::is_some) {
                    break;
                }
            }
            for (kind, target) in targets.iter().enumerate() {
                let Some((p, i)) = *target else { continue };
                seen[ti][kind] = true;
                let pr = prompt(100 + p, 6);
                let reference = {
                    let mut s = LiveSession::new(&model);
                    turn(
                        &model,
                        &mut s,
                        &pr,
                        temperature,
                        p,
                        depth,
                        &config(12, vec![]),
                        None,
                    )
                    .0
                    .unwrap()
                    .tokens
                };
                for route in [
                    Route::StopToken,
                    Route::StopString,
                    Route::MaxTokens,
                    Route::Cancel,
                ] {
                    let (cfg, stop_at) = match route {
                        Route::StopToken => (config(16, vec![reference[i]]), None),
                        Route::StopString => {
                            (config(12, vec![]), Some((i, CallerStop::StopString)))
                        }
                        Route::MaxTokens => (config(i + 1, vec![]), None),
                        Route::Cancel => (config(12, vec![]), Some((i, CallerStop::Cancelled))),
                    };
                    let what =
                        format!("T={temperature} depth {depth} kind {kind} index {i} {route:?}");
                    let mut s = LiveSession::new(&model);
                    let (r, src) = turn(&model, &mut s, &pr, temperature, p, depth, &cfg, stop_at);
                    let r = r.unwrap();
                    assert_eq!(r.tokens, reference[..=i], "{what}: emitted prefix");
                    assert_eq!(source_kind(src[i]), kind, "{what}");
                    let want = match route {
                        Route::StopToken => FinishReason::StopToken,
                        Route::StopString => FinishReason::Caller(CallerStop::StopString),
                        Route::MaxTokens => FinishReason::MaxTokens,
                        Route::Cancel => FinishReason::Caller(CallerStop::Cancelled),
                    };
                    assert_eq!(r.finish_reason, want, "{what}");
                    let mut full = pr.clone();
                    full.extend(&r.tokens);
                    match route {
                        Route::Cancel => {
                            assert_eq!(r.final_state, FinalState::Partial, "{what}");
                            assert!(full.starts_with(s.tokens()), "{what}");
                            assert!(s.tokens().len() + 1 >= full.len(), "{what}");
                        }
                        _ => {
                            assert_eq!(r.final_state, FinalState::Complete, "{what}");
                            assert_eq!(s.tokens(), &full[..], "{what}: covers prompt + emitted");
                        }
                    }
                    worst = worst.max(assert_banked(&model, &s, &what));
                    worst = worst.max(assert_next_turn(&model, &mut s, &what));
                    cases += 1;
                }
            }
        }
    }
    eprintln!("exit matrix: {cases} cases, worst |Δ| vs teacher / cold = {worst:e}");
    // Every point kind was reached greedy and sampled.
    assert_eq!(seen, [[true; 3]; 2], "{seen:?}");
}

/// The seeds' scenario: the very first primary is a stop token, and
/// `max_tokens = 1`; the banked state must include the primary (one final
/// forward), the next turn must match a cold run.
#[test]
fn mtp_first_primary_stop_and_max_tokens_one() {
    let model = load("tiny_b");
    let pr = prompt(7, 9);
    for depth in 1..=3 {
        for temperature in [0.0, 0.6] {
            let mut s = LiveSession::new(&model);
            let (r, _) = turn(
                &model,
                &mut s,
                &pr,
                temperature,
                3,
                depth,
                &config(8, vec![]),
                None,
            );
            let first = r.unwrap().tokens[0];
            for cfg in [config(8, vec![first]), config(1, vec![])] {
                let mut s = LiveSession::new(&model);
                let (r, _) = turn(&model, &mut s, &pr, temperature, 3, depth, &cfg, None);
                let r = r.unwrap();
                assert_eq!(r.tokens, [first]);
                assert_eq!(r.final_state, FinalState::Complete);
                assert_eq!(s.tokens().len(), pr.len() + 1);
                assert_eq!(*s.tokens().last().unwrap(), first);
                let what = format!("depth {depth} T={temperature} first-primary exit");
                assert_banked(&model, &s, &what);
                assert_next_turn(&model, &mut s, &what);
            }
        }
    }
}

/// A qwen4_exp model whose `n`-th forward-like call fails.
struct Failing<'a> {
    inner: &'a Qwen4ExpModel,
    fail_at: usize,
    calls: AtomicUsize,
}

impl Failing<'_> {
    fn tick(&self) -> ds4_engine::error::Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
            Err(EngineError::State("injected failure".into()))
        } else {
            Ok(())
        }
    }
}

impl Model for Failing<'_> {
    type State = Qwen4ExpState;
    type MtpHistory = MtpState;
    type Hidden = DeviceRows<CpuOps>;
    fn descriptor(&self) -> &'static FamilyDescriptor {
        self.inner.descriptor()
    }
    fn backend(&self) -> ds4_engine::backend::BackendId {
        self.inner.backend()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn context_length(&self) -> usize {
        self.inner.context_length()
    }
    fn new_state(&self) -> Qwen4ExpState {
        self.inner.new_state()
    }
    fn forward(
        &self,
        t: &[u32],
        s: &mut Qwen4ExpState,
        r: LogitsRows,
    ) -> ds4_engine::error::Result<ForwardOutput> {
        self.tick()?;
        self.inner.forward(t, s, r)
    }
    fn mtp_contract(&self) -> Option<MtpContract> {
        self.inner.mtp_contract()
    }
    fn forward_hidden(
        &self,
        t: &[u32],
        s: &mut Qwen4ExpState,
        r: LogitsRows,
    ) -> ds4_engine::error::Result<(ForwardOutput, DeviceRows<CpuOps>)> {
        self.tick()?;
        Model::forward_hidden(self.inner, t, s, r)
    }
    fn forward_window(
        &self,
        t: &[u32],
        s: &mut Qwen4ExpState,
    ) -> ds4_engine::error::Result<VerifyWindow<WindowCapture, DeviceRows<CpuOps>>> {
        self.tick()?;
        Model::forward_window(self.inner, t, s)
    }
    fn new_mtp_history(&self) -> Option<MtpState> {
        self.inner.new_mtp_history()
    }
    fn mtp_forward(
        &self,
        t: &[u32],
        h: &DeviceRows<CpuOps>,
        m: &mut MtpState,
    ) -> ds4_engine::error::Result<MtpStep<DeviceRows<CpuOps>>> {
        self.tick()?;
        Model::mtp_forward(self.inner, t, h, m)
    }
}

/// An error in any forward (prefill, head, verify, final commit) of an MTP
/// or AR turn returns `Err` and leaves nothing behind: the session is empty,
/// never a state marked complete; the next turn runs cold and correctly.
#[test]
fn mtp_failed_forward_never_banks_a_state() {
    let model = load("tiny_a");
    let pr = prompt(5, 7);
    for (depth, temperature) in [(0, 0.6), (1, 0.0), (2, 0.6), (3, 0.6)] {
        {
            let counting = Failing {
                inner: &model,
                fail_at: 0,
                calls: AtomicUsize::new(0),
            };
            let mut s = LiveSession::new(&counting);
            let (r, _) = turn(
                &counting,
                &mut s,
                &pr,
                temperature,
                1,
                depth,
                &config(5, vec![]),
                None,
            );
            let good = r.unwrap().tokens;
            let calls = counting.calls.load(Ordering::SeqCst);
            assert!(calls >= 2);
            for fail_at in 1..=calls {
                let m = Failing {
                    inner: &model,
                    fail_at,
                    calls: AtomicUsize::new(0),
                };
                let mut s = LiveSession::new(&m);
                // A banked earlier turn must not survive as "complete" either.
                let (r, _) = turn(
                    &m,
                    &mut s,
                    &pr,
                    temperature,
                    1,
                    depth,
                    &config(5, vec![]),
                    None,
                );
                assert!(r.is_err(), "depth {depth} fail_at {fail_at}");
                assert!(
                    s.tokens().is_empty() && s.state().is_empty(),
                    "reset after failure"
                );
                assert!(s.mtp_history().is_none() && s.last_logits().is_none());
                // The next turn (no more failures) equals the good run.
                let (r, _) = turn(
                    &m,
                    &mut s,
                    &pr,
                    temperature,
                    1,
                    depth,
                    &config(5, vec![]),
                    None,
                );
                assert_eq!(r.unwrap().tokens, good);
            }
        }
    }
}
