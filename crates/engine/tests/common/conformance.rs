//! The conformance suite's generic body and its instantiating macros
//! (`conformance.rs` for the reference kernel set, `fast_kernels.rs` for
//! the fast one); see `conformance.rs` for what each property checks.
#![allow(dead_code)]

use std::path::PathBuf;

// ============================================================================
// Adapter: every call into the engine lives here.
// ============================================================================

mod adapter {
    use std::cell::Cell;

    use ds4_engine::decode::{
        self, CallerStop, CancelToken, FinalState, FinishReason, Flow, LiveSession, MtpStats,
        SessionImage, TokenSource, TurnConfig,
    };
    use ds4_engine::error::Result;
    use ds4_engine::families::FamilyDescriptor;
    use ds4_engine::state::table::{NamedTensor, TensorData};
    use ds4_engine::{
        ForwardOutput, LogitsRows, Model, ModelState, MtpContract, MtpStep, VerifyWindow,
    };
    use ds4_sampling::{Sampler, SamplingParams};

    pub use ds4_engine::Model as Family;
    pub use ds4_engine::decode::{
        CallerStop as Stop, FinalState as Final, FinishReason as Finish, TokenSource as Source,
    };

    pub type Session<M> = LiveSession<M>;
    pub type State<M> = <M as Model>::State;

    /// A table of named tensors as raw bits: (name, shape, bits).
    pub type Bits = Vec<(String, Vec<usize>, Vec<u32>)>;
    /// A whole session as bits: the tokens it covers and its tables.
    pub type SessionBits = (Vec<u32>, Bits);

    fn table_bits(table: &[NamedTensor]) -> Bits {
        table
            .iter()
            .map(|t| {
                let bits = match &t.data {
                    TensorData::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                    TensorData::U32(v) => v.clone(),
                };
                (t.name.clone(), t.shape.clone(), bits)
            })
            .collect()
    }

    fn rows_bits(out: &ForwardOutput) -> Vec<Vec<u32>> {
        (0..out.rows)
            .map(|r| out.row(r).iter().map(|x| x.to_bits()).collect())
            .collect()
    }

    // ---- model ----

    pub fn vocab<M: Model>(m: &M) -> usize {
        m.vocab_size()
    }

    pub fn context<M: Model>(m: &M) -> usize {
        m.context_length()
    }

    /// `(default depth, max depth)` of the family's MTP head, if any. A
    /// head whose default is AR (the llama head) is run at depth 2 (or its
    /// maximum if lower) where a property needs "the MTP mode".
    pub fn mtp_depths<M: Model>(m: &M) -> Option<(usize, usize)> {
        m.mtp_contract().map(|c| match c.default_depth {
            0 => (c.max_depth.min(2), c.max_depth),
            d => (d, c.max_depth),
        })
    }

    // ---- bare states ----

    pub fn new_state<M: Model>(m: &M) -> State<M> {
        m.new_state()
    }

    pub fn state_len<M: Model>(s: &State<M>) -> usize {
        s.len()
    }

    pub fn state_copy<M: Model>(s: &State<M>) -> State<M> {
        s.snapshot()
    }

    /// Forward `tokens` after `state`; every logits row, as bits.
    pub fn forward<M: Model>(m: &M, state: &mut State<M>, tokens: &[u32]) -> Vec<Vec<u32>> {
        rows_bits(&m.forward(tokens, state, LogitsRows::All).unwrap())
    }

    /// A verify window over `tokens` (all logits rows, as bits), then keep
    /// its first `accepted` rows.
    pub fn window_commit<M: Model>(
        m: &M,
        state: &mut State<M>,
        tokens: &[u32],
        accepted: usize,
    ) -> Vec<Vec<u32>> {
        let w = m.forward_window(tokens, state).unwrap();
        state.commit(&w.record, accepted).unwrap();
        rows_bits(&w.logits)
    }

    /// The state's export, as bits.
    pub fn state_bits<M: Model>(s: &State<M>) -> Bits {
        table_bits(&s.export().unwrap())
    }

    /// Export `s` and import it into a fresh state of `m`.
    pub fn state_round_trip<M: Model>(m: &M, s: &State<M>) -> State<M> {
        let mut fresh = m.new_state();
        fresh.import(s.export().unwrap()).unwrap();
        fresh
    }

    // ---- sessions ----

    pub fn new_session<M: Model>(m: &M) -> Session<M> {
        LiveSession::new(m)
    }

    pub fn covered<M: Model>(s: &Session<M>) -> Vec<u32> {
        assert!(s.is_consistent(), "session state and tokens disagree");
        s.tokens().to_vec()
    }

    /// Rewind `s` for `prompt` (what a turn does first); the prompt tokens
    /// it keeps.
    pub fn rewind<M: Model>(m: &M, s: &mut Session<M>, prompt: &[u32]) -> usize {
        let kept = s.rewind_for(m, prompt);
        assert!(s.is_consistent(), "a rewound session is consistent");
        kept
    }

    /// Whether the session keeps an MTP history.
    pub fn has_mtp_history<M: Model>(s: &Session<M>) -> bool {
        s.mtp_history().is_some()
    }

    /// Whether the session's state can be truncated anywhere (no recurrent
    /// layers).
    pub fn truncatable<M: Model>(s: &Session<M>) -> bool {
        s.state().truncate_floor() == 0
    }

    pub fn snapshot<M: Model>(s: &Session<M>) -> Session<M> {
        s.snapshot()
    }

    pub type Image = SessionImage;

    pub fn export<M: Model>(s: &Session<M>) -> Image {
        s.export().unwrap()
    }

    pub fn import<M: Model>(m: &M, image: Image) -> Session<M> {
        LiveSession::import(m, image).unwrap()
    }

    /// Everything a session holds (tokens, state, MTP history and hidden,
    /// last logits), as bits.
    pub fn session_bits<M: Model>(s: &Session<M>) -> SessionBits {
        image_bits(&export(s))
    }

    pub fn image_bits(image: &Image) -> SessionBits {
        assert_eq!(image.covered, image.tokens.len());
        (image.tokens.clone(), table_bits(&image.tensors))
    }

    /// Only the trunk: the model state's tables and the last logits row (what
    /// an AR and an MTP session must agree on).
    pub fn trunk_bits<M: Model>(s: &Session<M>) -> Bits {
        let (_, bits) = session_bits(s);
        bits.into_iter()
            .filter(|(n, ..)| n.starts_with("state/") || n == "last_logits")
            .collect()
    }

    // ---- turns ----

    /// One turn's request. `depth` 0 = AR, else MTP at that draft depth.
    #[derive(Debug, Clone)]
    pub struct Req {
        pub depth: usize,
        pub max_tokens: usize,
        pub stop_tokens: Vec<u32>,
        pub chunk: usize,
        /// 0 = greedy; else the family's law and defaults at this
        /// temperature (penalties off, so a continued turn can equal one run).
        pub temperature: f64,
        pub seed: u64,
        /// The callback answers `Flow::Stop(_)` at this emitted index.
        pub callback_stop: Option<(usize, CallerStop)>,
        /// The callback sets the turn's `CancelToken` at this emitted index.
        pub cancel_at_token: Option<usize>,
        /// The progress callback sets the `CancelToken` after this many
        /// prefill chunks.
        pub cancel_after_chunks: Option<usize>,
        /// The `CancelToken` is set before the turn starts.
        pub cancel_before: bool,
    }

    impl Req {
        pub fn new(depth: usize, max_tokens: usize, temperature: f64) -> Self {
            Self {
                depth,
                max_tokens,
                stop_tokens: Vec::new(),
                chunk: 1 << 20,
                temperature,
                seed: 7,
                callback_stop: None,
                cancel_at_token: None,
                cancel_after_chunks: None,
                cancel_before: false,
            }
        }
    }

    /// What a turn reported.
    #[derive(Debug, Clone)]
    pub struct Out {
        pub tokens: Vec<u32>,
        pub sources: Vec<TokenSource>,
        /// Per emitted token: its logprob and the top 4 (token, logprob), as bits.
        pub logprob_bits: Vec<Vec<u32>>,
        pub finish: FinishReason,
        pub final_state: FinalState,
        pub reused: usize,
        /// Prefill chunks the progress callback saw.
        pub chunks: usize,
        pub mtp: Option<MtpStats>,
    }

    impl Out {
        /// What two equivalent turns must agree on.
        pub fn key(&self) -> (Vec<u32>, Vec<Vec<u32>>, FinishReason, FinalState) {
            (
                self.tokens.clone(),
                self.logprob_bits.clone(),
                self.finish,
                self.final_state,
            )
        }
    }

    pub fn try_turn<M: Model>(m: &M, s: &mut Session<M>, prompt: &[u32], req: &Req) -> Result<Out> {
        let d = m.descriptor();
        let params = SamplingParams {
            temperature: req.temperature,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            ..d.sampling_defaults
        };
        let mut sampler = Sampler::new(d.law, params, req.seed).unwrap();
        let cancel = CancelToken::new();
        if req.cancel_before {
            cancel.cancel();
        }
        let cfg = TurnConfig {
            max_tokens: req.max_tokens,
            stop_token_ids: req.stop_tokens.clone(),
            prefill_chunk: req.chunk,
            logprobs: Some(4),
            cancel: cancel.clone(),
        };
        let chunks = Cell::new(0);
        let mut sources = Vec::new();
        let mut lp = Vec::new();
        let request = decode::TurnRequest {
            prompt,
            sampler: &mut sampler,
            config: cfg,
            mtp_depth: Some(req.depth),
        };
        let mut observer = decode::Observe::new(
            |_| {
                chunks.set(chunks.get() + 1);
                if req.cancel_after_chunks == Some(chunks.get()) {
                    cancel.cancel();
                }
            },
            |e: decode::TokenEvent| {
                sources.push(e.source);
                let l = e.logprobs.expect("logprobs requested");
                let mut bits = vec![l.logprob.to_bits()];
                bits.extend(l.top.iter().flat_map(|&(t, p)| [t, p.to_bits()]));
                lp.push(bits);
                if req.cancel_at_token == Some(e.index) {
                    cancel.cancel();
                }
                match req.callback_stop {
                    Some((i, why)) if i == e.index => Flow::Stop(why),
                    _ => Flow::Continue,
                }
            },
        );
        let r = decode::generate(m, s, request, &mut observer)?;
        assert_eq!(
            r.tokens.len(),
            sources.len(),
            "every token reaches the callback"
        );
        Ok(Out {
            tokens: r.tokens,
            sources,
            logprob_bits: lp,
            finish: r.finish_reason,
            final_state: r.final_state,
            reused: r.reused_tokens,
            chunks: chunks.get(),
            mtp: r.mtp,
        })
    }

    pub fn turn<M: Model>(m: &M, s: &mut Session<M>, prompt: &[u32], req: &Req) -> Out {
        try_turn(m, s, prompt, req).unwrap()
    }

    // ---- a model with a shorter context (the context-full exit) ----

    /// `inner` with `context_length() == ctx`; everything else delegated.
    pub struct ShortContext<'a, M> {
        pub inner: &'a M,
        pub ctx: usize,
    }

    impl<M: Model> Model for ShortContext<'_, M> {
        type State = M::State;
        type MtpHistory = M::MtpHistory;
        type Hidden = M::Hidden;
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
            self.ctx
        }
        fn new_state(&self) -> M::State {
            self.inner.new_state()
        }
        fn forward(&self, t: &[u32], s: &mut M::State, r: LogitsRows) -> Result<ForwardOutput> {
            self.inner.forward(t, s, r)
        }
        fn mtp_contract(&self) -> Option<MtpContract> {
            self.inner.mtp_contract()
        }
        fn forward_hidden(
            &self,
            t: &[u32],
            s: &mut M::State,
            r: LogitsRows,
        ) -> Result<(ForwardOutput, M::Hidden)> {
            self.inner.forward_hidden(t, s, r)
        }
        fn forward_window(
            &self,
            t: &[u32],
            s: &mut M::State,
        ) -> Result<VerifyWindow<<M::State as ModelState>::Window, M::Hidden>> {
            self.inner.forward_window(t, s)
        }
        fn hidden_from_host(&self, r: usize, w: usize, d: Vec<f32>) -> Result<M::Hidden> {
            self.inner.hidden_from_host(r, w, d)
        }
        fn new_mtp_history(&self) -> Option<M::MtpHistory> {
            self.inner.new_mtp_history()
        }
        fn mtp_forward(
            &self,
            t: &[u32],
            h: &M::Hidden,
            history: &mut M::MtpHistory,
        ) -> Result<MtpStep<M::Hidden>> {
            self.inner.mtp_forward(t, h, history)
        }
    }
}

pub use adapter::{
    Bits, Family, Final, Finish, Out, Req, Session, SessionBits, Source, Stop, covered, export,
    forward, has_mtp_history, image_bits, import, mtp_depths, new_session, new_state, rewind,
    session_bits, snapshot, state_bits, state_copy, state_len, state_round_trip, truncatable,
    trunk_bits, try_turn, turn, window_commit,
};

// ============================================================================
// Helpers.
// ============================================================================

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// `len` pseudo-random token ids in `3..vocab` (no special ids 0..3).
pub fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
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

pub fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut v = a.to_vec();
    v.extend_from_slice(b);
    v
}

/// The turn modes a family runs: AR (depth 0), and its default MTP depth if
/// it has an MTP head.
pub fn modes<M: Family>(m: &M) -> Vec<usize> {
    let mut v = vec![0];
    v.extend(mtp_depths(m).map(|(d, _)| d));
    v
}

/// MTP depths 1..=min(3, max) (empty for a family without a head).
pub fn mtp_depth_range<M: Family>(m: &M) -> Vec<usize> {
    mtp_depths(m).map_or(Vec::new(), |(_, max)| (1..=max.min(3)).collect())
}

#[track_caller]
pub fn assert_rows_eq(a: &[Vec<u32>], b: &[Vec<u32>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: row count");
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            let i = x.iter().zip(y).position(|(p, q)| p != q).unwrap_or(0);
            panic!(
                "{what}: row {r} differs first at column {i}: {} vs {}",
                f32::from_bits(x[i]),
                f32::from_bits(y[i])
            );
        }
    }
}

#[track_caller]
pub fn assert_bits_eq(a: &Bits, b: &Bits, what: &str) {
    let names = |t: &Bits| {
        t.iter()
            .map(|(n, s, _)| format!("{n}{s:?}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(a), names(b), "{what}: tensor names and shapes");
    for ((n, _, x), (_, _, y)) in a.iter().zip(b) {
        if x != y {
            let i = x.iter().zip(y).position(|(p, q)| p != q).unwrap_or(0);
            panic!(
                "{what}: tensor `{n}` differs first at element {i} of {} (bits {:#x} vs {:#x})",
                x.len(),
                x[i],
                y[i]
            );
        }
    }
}

#[track_caller]
pub fn assert_sessions_eq<M: Family>(a: &Session<M>, b: &Session<M>, what: &str) {
    let (ta, ba) = session_bits(a);
    let (tb, bb) = session_bits(b);
    assert_eq!(ta, tb, "{what}: covered tokens");
    assert_bits_eq(&ba, &bb, what);
}

/// A session that prefilled exactly `tokens` in one forward (a turn with
/// `max_tokens = 0`; MTP depth `depth` keeps the MTP history too).
pub fn cold<M: Family>(m: &M, tokens: &[u32], depth: usize) -> Session<M> {
    let mut s = new_session(m);
    let r = turn(m, &mut s, tokens, &Req::new(depth, 0, 0.0));
    assert_eq!(r.finish, Finish::MaxTokens);
    assert_eq!(r.final_state, Final::Complete);
    assert_eq!(covered(&s), tokens);
    s
}

/// Rejections and acceptances (and bonus) of MTP turns.
#[derive(Default, Debug)]
pub struct Drafts {
    drafted: usize,
    accepted: usize,
}

impl Drafts {
    fn add(&mut self, out: &Out) {
        if let Some(st) = &out.mtp {
            self.drafted += st.drafted_total();
            self.accepted += st.accepted_total();
        }
    }

    /// At least one draft was accepted and at least one rejected.
    #[track_caller]
    fn assert_mixed(&self, what: &str) {
        assert!(
            self.accepted > 0 && self.accepted < self.drafted,
            "{what}: drafts must be both accepted and rejected: {self:?}"
        );
    }
}

/// Run `f` with seeds 0, 1, … until its turn — when it is a sampled MTP
/// turn — both accepted and rejected drafts, so that the property exercises
/// the commit of a partial verify window. Other turns take seed 0.
pub fn exercising<T>(sampled_mtp: bool, mut f: impl FnMut(u64) -> (T, Out)) -> (T, Out) {
    for seed in 0..64 {
        let (t, out) = f(seed);
        let st = out.mtp.as_ref();
        if !sampled_mtp
            || st.is_some_and(|st| {
                0 < st.accepted_total() && st.accepted_total() < st.drafted_total()
            })
        {
            return (t, out);
        }
    }
    panic!("no seed in 0..64 gives a sampled MTP turn that accepts and rejects drafts");
}

// ============================================================================
// The properties (generic over the family).
// ============================================================================

/// 1. One forward, uneven chunks and single steps: identical logits rows and
///    identical final state.
pub fn chunking_invariance<M: Family>(m: &M) {
    let v = adapter::vocab(m);
    for (seed, len) in [(1u64, 17usize), (2, 7)] {
        let p = prompt(seed, len, v);
        let mut one = new_state(m);
        let whole = forward(m, &mut one, &p);
        assert_eq!(whole.len(), len);
        assert_eq!(state_len::<M>(&one), len);

        for pieces in [vec![5, 1, 9, 8], vec![2, 7, 3, 11], vec![len - 1, 1]] {
            let mut st = new_state(m);
            let mut rows = Vec::new();
            let mut at = 0;
            for &n in &pieces {
                let n = n.min(len - at);
                if n == 0 {
                    continue;
                }
                rows.extend(forward(m, &mut st, &p[at..at + n]));
                at += n;
            }
            if at < len {
                rows.extend(forward(m, &mut st, &p[at..]));
            }
            let what = format!("prompt {seed}: chunks {pieces:?}");
            assert_rows_eq(&rows, &whole, &what);
            assert_bits_eq(&state_bits::<M>(&st), &state_bits::<M>(&one), &what);
        }

        let mut st = new_state(m);
        let mut rows = Vec::new();
        for &t in &p {
            rows.extend(forward(m, &mut st, &[t]));
        }
        let what = format!("prompt {seed}: single steps");
        assert_rows_eq(&rows, &whole, &what);
        assert_bits_eq(&state_bits::<M>(&st), &state_bits::<M>(&one), &what);
        // The comparison is not vacuous: different prompts give different rows.
        if seed == 2 {
            let mut other = new_state(m);
            let o = forward(m, &mut other, &prompt(1, len, v));
            assert_ne!(o.last(), whole.last(), "different prompts, same logits");
        }
    }
}

/// 2. A second turn continuing a session == a cold turn over the full prompt
///    in one prefill: tokens, logprobs, finish, final session bits.
pub fn warm_equals_cold<M: Family>(m: &M) {
    let v = adapter::vocab(m);
    for depth in modes(m) {
        for temperature in [0.0, 0.8] {
            let what = format!("depth {depth} T={temperature}");
            let p1 = prompt(11, 12, v);
            let ((warm, r1, p2, second), w) = exercising(depth > 0 && temperature > 0.0, |seed| {
                let mut warm = new_session(m);
                let first = Req {
                    chunk: 5,
                    seed,
                    ..Req::new(depth, 3, temperature)
                };
                let r1 = turn(m, &mut warm, &p1, &first);
                assert_eq!(r1.final_state, Final::Complete, "{what}");
                assert_eq!(covered(&warm), cat(&p1, &r1.tokens), "{what}");
                let p2 = cat(&covered(&warm), &prompt(12, 7, v));
                let second = Req {
                    chunk: 4,
                    seed: seed + 100,
                    ..Req::new(depth, 5, temperature)
                };
                let w = turn(m, &mut warm, &p2, &second);
                ((warm, r1, p2, second), w)
            });
            assert_eq!(w.reused, p1.len() + r1.tokens.len(), "{what}: warm reuse");

            let mut cold_s = new_session(m);
            let c = turn(
                m,
                &mut cold_s,
                &p2,
                &Req {
                    chunk: p2.len(),
                    ..second.clone()
                },
            );
            assert_eq!(c.reused, 0, "{what}: cold");
            assert_eq!(c.chunks, 1, "{what}: cold is one prefill");
            assert_eq!(w.tokens.len(), 5, "{what}");
            assert_eq!(w.key(), c.key(), "{what}: warm vs cold turn");
            assert_sessions_eq(&warm, &cold_s, &format!("{what}: warm vs cold session"));
        }
    }
}

/// 2b. An edited turn (the prompt diverges inside the session, as when an
///     earlier message is edited): the session rewinds to the shared prefix
///     and the turn equals a cold one bit for bit, continued directly and
///     through an export / import of the rewound session. An attention-only
///     session keeps its MTP history through the rewind (one token short of
///     the shared prefix: the prefill recomputes the hidden of the history's
///     last row), so an MTP turn is warm too; a recurrent one starts cold.
pub fn edited_warm_equals_cold<M: Family>(m: &M) {
    let v = adapter::vocab(m);
    for depth in modes(m) {
        for temperature in [0.0, 0.8] {
            let what = format!("edited, depth {depth} T={temperature}");
            let p1 = prompt(31, 12, v);
            let mut warm = new_session(m);
            let r1 = turn(m, &mut warm, &p1, &Req::new(depth, 3, temperature));
            assert_eq!(r1.final_state, Final::Complete, "{what}");
            let p2 = cat(&p1[..8], &prompt(32, 6, v));
            let shared = covered(&warm)
                .iter()
                .zip(&p2)
                .take_while(|(a, b)| a == b)
                .count();
            assert!((8..p2.len()).contains(&shared), "{what}: {shared}");
            let expected = match (truncatable(&warm), depth > 0) {
                (false, _) => 0,
                (true, false) => shared,
                (true, true) => shared - 1,
            };
            let mut rewound = snapshot(&warm);
            assert_eq!(rewind(m, &mut rewound, &p2), expected, "{what}: rewind");
            if expected > 0 {
                assert_eq!(has_mtp_history(&rewound), depth > 0, "{what}: MTP kept");
            }
            let mut imported = import(m, export(&rewound));

            let second = Req {
                chunk: 4,
                seed: 5,
                ..Req::new(depth, 5, temperature)
            };
            let w = turn(m, &mut warm, &p2, &second);
            assert_eq!(w.reused, expected, "{what}: warm reuse");
            let i = turn(m, &mut imported, &p2, &second);
            assert_eq!(i.reused, expected, "{what}: imported reuse");
            let mut cold_s = new_session(m);
            let c = turn(m, &mut cold_s, &p2, &second);
            assert_eq!(c.reused, 0, "{what}: cold");
            assert_eq!(w.key(), c.key(), "{what}: edited vs cold turn");
            assert_eq!(i.key(), c.key(), "{what}: imported vs cold turn");
            assert_sessions_eq(&warm, &cold_s, &format!("{what}: edited vs cold session"));
            assert_sessions_eq(&imported, &cold_s, &format!("{what}: imported vs cold"));
        }
    }
}

/// 3. Export → import: re-exports identically and continues identically
///    (bare state and whole session, AR and MTP sessions).
pub fn export_import_round_trip<M: Family>(m: &M) {
    let v = adapter::vocab(m);
    // Bare state.
    let p = prompt(21, 13, v);
    let mut a = new_state(m);
    forward(m, &mut a, &p);
    let mut b = state_round_trip(m, &a);
    assert_eq!(state_len::<M>(&b), p.len());
    assert_bits_eq(
        &state_bits::<M>(&b),
        &state_bits::<M>(&a),
        "state re-export",
    );
    let next = prompt(22, 5, v);
    let la = forward(m, &mut a, &next);
    let lb = forward(m, &mut b, &next);
    assert_rows_eq(&lb, &la, "state continued after import");
    assert_bits_eq(
        &state_bits::<M>(&b),
        &state_bits::<M>(&a),
        "state after continuing",
    );
    // The comparison is not vacuous: an imported state of a different
    // prompt continues differently.
    let mut other = new_state(m);
    forward(m, &mut other, &prompt(23, 13, v));
    let mut other = state_round_trip(m, &other);
    assert_ne!(forward(m, &mut other, &next), la, "different states agree");

    // Whole sessions (with the MTP history after an MTP turn).
    for depth in modes(m) {
        let what = format!("session depth {depth}");
        let mut a = new_session(m);
        turn(m, &mut a, &p, &Req::new(depth, 4, 0.8));
        let image = export(&a);
        let mut b = import(m, image.clone());
        let (tb, bb) = session_bits(&b);
        let (ti, bi) = image_bits(&image);
        assert_eq!(tb, ti, "{what}: tokens");
        assert_bits_eq(&bb, &bi, &format!("{what}: re-export"));
        if depth > 0 {
            assert!(
                bi.iter().any(|(n, ..)| n.starts_with("mtp/")),
                "{what}: the image holds the MTP history"
            );
        }
        let p2 = cat(&covered(&a), &next);
        let req = Req {
            seed: 3,
            ..Req::new(depth, 6, 0.8)
        };
        let ra = turn(m, &mut a, &p2, &req);
        let rb = turn(m, &mut b, &p2, &req);
        assert_eq!(rb.reused, ra.reused, "{what}: imported session reused");
        assert_eq!(ra.reused, p.len() + 4, "{what}: continued warm");
        assert_eq!(rb.key(), ra.key(), "{what}: continued turn");
        assert_sessions_eq(&b, &a, &format!("{what}: after continuing"));
    }
}

/// 4. (MTP) Commit of every prefix of a verify window == the shorter forward:
///    same export, same next logits; the window's rows == a forward's rows.
pub fn window_commit_prefixes<M: Family>(m: &M) {
    let Some((_, max)) = mtp_depths(m) else {
        eprintln!("no MTP head: skipped");
        return;
    };
    let v = adapter::vocab(m);
    let p = prompt(31, 9, v);
    let mut base = new_state(m);
    forward(m, &mut base, &p);
    let next = prompt(33, 3, v);
    let mut checked = 0;
    for rows in 1..=max + 1 {
        let w = prompt(32 + rows as u64, rows, v);
        let mut plain = state_copy::<M>(&base);
        let forward_rows = forward(m, &mut plain, &w);
        for accepted in 0..=rows {
            let what = format!("window of {rows}, commit {accepted}");
            let mut s = state_copy::<M>(&base);
            let window_rows = window_commit(m, &mut s, &w, accepted);
            assert_rows_eq(&window_rows, &forward_rows, &format!("{what}: window rows"));
            let mut r = state_copy::<M>(&base);
            if accepted > 0 {
                forward(m, &mut r, &w[..accepted]);
            }
            assert_eq!(state_len::<M>(&s), p.len() + accepted, "{what}: length");
            assert_bits_eq(&state_bits::<M>(&s), &state_bits::<M>(&r), &what);
            let ls = forward(m, &mut s, &next);
            let lr = forward(m, &mut r, &next);
            assert_rows_eq(&ls, &lr, &format!("{what}: next forward"));
            checked += 1;
        }
    }
    assert_eq!(checked, (2..=max + 2).sum::<usize>());
}

/// 5. (MTP) Greedy MTP at depths 1..=3 == greedy AR: tokens, trunk state and
///    last logits.
pub fn greedy_mtp_equals_ar<M: Family>(m: &M) {
    let depths = mtp_depth_range(m);
    if depths.is_empty() {
        eprintln!("no MTP head: skipped");
        return;
    }
    let v = adapter::vocab(m);
    let mut drafts = Drafts::default();
    for (seed, len) in [(41u64, 5usize), (42, 11), (43, 8)] {
        let p = prompt(seed, len, v);
        let mut ar = new_session(m);
        let a = turn(m, &mut ar, &p, &Req::new(0, 14, 0.0));
        assert_eq!(a.tokens.len(), 14);
        for &depth in &depths {
            let what = format!("prompt {seed} depth {depth}");
            let mut s = new_session(m);
            let r = turn(m, &mut s, &p, &Req::new(depth, 14, 0.0));
            assert_eq!(r.tokens, a.tokens, "{what}: tokens");
            assert_eq!(r.finish, a.finish, "{what}");
            assert_eq!(r.final_state, Final::Complete, "{what}");
            assert_eq!(covered(&s), covered(&ar), "{what}");
            assert_bits_eq(&trunk_bits(&s), &trunk_bits(&ar), &what);
            let st = r.mtp.as_ref().expect("MTP stats");
            assert_eq!(st.depth, depth, "{what}");
            assert!(st.cycles > 0, "{what}: ran verify cycles");
            drafts.add(&r);
        }
    }
    drafts.assert_mixed("greedy MTP");
}

/// The ways a turn can be made to end at emitted index `i`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    StopToken,
    MaxTokens,
    CallbackStop,
    CallbackCancel,
    CancelToken,
}

pub fn kind(s: Source) -> usize {
    match s {
        Source::Sampled => 0,
        Source::Draft(_) => 1,
        Source::Residual | Source::Bonus => 2,
    }
}

/// 6. The exit matrix: each route at tokens of every source kind (first
///    primary, later AR token or accepted draft, residual/bonus), greedy and
///    sampled; then context full and a turn cancelled before it starts. The
///    session covers exactly what the turn API documents, with the bits of a
///    cold prefill of exactly those tokens.
pub fn exit_matrix<M: Family>(m: &M) {
    let v = adapter::vocab(m);
    let mut depths = vec![0];
    depths.extend(mtp_depth_range(m));
    let mut cases = 0;
    for &depth in &depths {
        // Per temperature: which source kinds an exit was tested at.
        let mut seen = [[false; 3]; 2];
        let mut done: [Vec<(usize, bool)>; 2] = Default::default();
        let mut colds: Vec<(Vec<u32>, SessionBits)> = Vec::new();
        for (ti, temperature) in [0.0, 0.7].into_iter().enumerate() {
            for seed in 0..8u64 {
                let p = prompt(50 + seed, 6, v);
                let base = Req {
                    seed,
                    // AR needs index 0 and one later index; MTP needs
                    // drafts accepted and rejected.
                    ..Req::new(depth, if depth == 0 { 5 } else { 12 }, temperature)
                };
                let reference = turn(m, &mut new_session(m), &p, &base);
                assert_eq!(reference.tokens.len(), base.max_tokens);
                assert_eq!(reference.finish, Finish::MaxTokens);
                // Targets: first occurrences (usable as a stop token) of each
                // class not yet tested: (source kind, index 0 or later).
                let mut targets = Vec::new();
                for (i, &t) in reference.tokens.iter().enumerate() {
                    let class = (kind(reference.sources[i]), i == 0);
                    if !reference.tokens[..i].contains(&t) && !done[ti].contains(&class) {
                        done[ti].push(class);
                        targets.push(i);
                    }
                }
                for i in targets {
                    seen[ti][kind(reference.sources[i])] = true;
                    for route in [
                        Route::StopToken,
                        Route::MaxTokens,
                        Route::CallbackStop,
                        Route::CallbackCancel,
                        Route::CancelToken,
                    ] {
                        let what = format!(
                            "depth {depth} T={temperature} prompt {seed} index {i} \
                             ({:?}) {route:?}",
                            reference.sources[i]
                        );
                        let req = match route {
                            Route::StopToken => Req {
                                stop_tokens: vec![reference.tokens[i]],
                                ..base.clone()
                            },
                            Route::MaxTokens => Req {
                                max_tokens: i + 1,
                                ..base.clone()
                            },
                            Route::CallbackStop => Req {
                                callback_stop: Some((i, Stop::StopString)),
                                ..base.clone()
                            },
                            Route::CallbackCancel => Req {
                                callback_stop: Some((i, Stop::Cancelled)),
                                ..base.clone()
                            },
                            Route::CancelToken => Req {
                                cancel_at_token: Some(i),
                                ..base.clone()
                            },
                        };
                        let mut s = new_session(m);
                        let r = turn(m, &mut s, &p, &req);
                        assert_eq!(r.tokens, reference.tokens[..=i], "{what}: tokens");
                        assert_eq!(
                            r.logprob_bits,
                            reference.logprob_bits[..=i],
                            "{what}: logprobs"
                        );
                        assert_eq!(r.sources, reference.sources[..=i], "{what}: sources");
                        let (finish, final_state) = match route {
                            Route::StopToken => (Finish::StopToken, Final::Complete),
                            Route::MaxTokens => (Finish::MaxTokens, Final::Complete),
                            Route::CallbackStop => {
                                (Finish::Caller(Stop::StopString), Final::Complete)
                            }
                            Route::CallbackCancel | Route::CancelToken => {
                                (Finish::Caller(Stop::Cancelled), Final::Partial)
                            }
                        };
                        assert_eq!(r.finish, finish, "{what}");
                        assert_eq!(r.final_state, final_state, "{what}");
                        let all = cat(&p, &r.tokens);
                        // Complete: prompt + emitted. Cancelled: no further
                        // forward — one short, except at an accepted draft,
                        // which the verify window already committed.
                        let want = if final_state == Final::Complete
                            || matches!(r.sources[i], Source::Draft(_))
                        {
                            all.clone()
                        } else {
                            all[..all.len() - 1].to_vec()
                        };
                        assert_eq!(covered(&s), want, "{what}: covered tokens");
                        // Cold prefills of the same tokens are shared by routes.
                        if !colds.iter().any(|(t, _)| *t == want) {
                            colds.push((want.clone(), session_bits(&cold(m, &want, depth))));
                        }
                        let cold_bits = &colds.iter().find(|(t, _)| *t == want).unwrap().1;
                        let got = session_bits(&s);
                        assert_eq!(got.0, cold_bits.0, "{what}: cold tokens");
                        assert_bits_eq(&got.1, &cold_bits.1, &what);
                        cases += 1;
                    }
                }
                // AR: index 0 and a later index; MTP: every source kind.
                if (depth == 0 && done[ti].len() == 2) || seen[ti].iter().all(|&x| x) {
                    break;
                }
            }
        }
        if depth > 0 {
            assert_eq!(
                seen, [[true; 3]; 2],
                "depth {depth}: exits at every source kind"
            );
        } else {
            assert_eq!(seen, [[true, false, false]; 2], "AR: sampled tokens only");
            assert_eq!(done.map(|d| d.len()), [2, 2], "AR: index 0 and a later one");
        }

        // Context full: the context holds the prompt and `n` more tokens.
        for n in [0, 2, 5] {
            let what = format!("depth {depth}: context full, prompt + {n}");
            let p = prompt(70, 6, v);
            let reference = turn(m, &mut new_session(m), &p, &Req::new(depth, n + 1, 0.0));
            let short = adapter::ShortContext {
                inner: m,
                ctx: p.len() + n,
            };
            assert_eq!(adapter::context(&short), p.len() + n);
            let mut s = new_session(&short);
            let r = turn(&short, &mut s, &p, &Req::new(depth, 12, 0.0));
            assert_eq!(r.finish, Finish::ContextFull, "{what}");
            assert_eq!(r.final_state, Final::Partial, "{what}");
            // Every position of the context is used and the token that could
            // not be forwarded is still emitted.
            assert_eq!(r.tokens, reference.tokens[..=n], "{what}: tokens");
            let want = cat(&p, &r.tokens[..n]);
            assert_eq!(covered(&s), want, "{what}: covered");
            assert_sessions_eq(&s, &cold(&short, &want, depth), &what);
            // A prompt longer than the context is refused and leaves nothing.
            let mut s = new_session(&short);
            let err = try_turn(&short, &mut s, &cat(&p, &[3; 6]), &Req::new(depth, 4, 0.0));
            assert!(err.is_err(), "{what}: overlong prompt accepted");
            assert!(covered(&s).is_empty(), "{what}: failed turn left a state");
            cases += 1;
        }
    }
    eprintln!("exit matrix: {cases} cases");
}

/// 6b. A turn whose cancel token is set before it starts runs nothing and
///     leaves the session exactly as it was (AR, or MTP at the family's
///     default depth); the same turn run afterwards equals one run on an
///     untouched copy of the session.
pub fn cancel_before_start<M: Family>(m: &M, mtp: bool) {
    let depth = if mtp {
        match mtp_depths(m) {
            Some((d, _)) => d,
            None => {
                eprintln!("no MTP head: skipped");
                return;
            }
        }
    } else {
        0
    };
    let v = adapter::vocab(m);
    let p = prompt(71, 6, v);
    let mut s = new_session(m);
    turn(m, &mut s, &p, &Req::new(depth, 3, 0.0));
    let mut untouched = import(m, export(&s));
    let before = session_bits(&s);
    let p2 = cat(&covered(&s), &prompt(72, 4, v));
    let req = Req::new(depth, 3, 0.0);
    let r = turn(
        m,
        &mut s,
        &p2,
        &Req {
            cancel_before: true,
            ..req.clone()
        },
    );
    let what = format!("depth {depth}: cancelled before start");
    assert_eq!(r.finish, Finish::Caller(Stop::Cancelled), "{what}");
    assert_eq!(r.final_state, Final::Partial, "{what}");
    assert!(r.tokens.is_empty(), "{what}");
    assert_eq!(r.chunks, 0, "{what}: no prefill chunk ran");
    assert_eq!(session_bits(&s).0, before.0, "{what}: covered");
    assert_bits_eq(&session_bits(&s).1, &before.1, &what);
    let a = turn(m, &mut s, &p2, &req);
    let b = turn(m, &mut untouched, &p2, &req);
    assert_eq!(a.reused, b.reused, "{what}: reuse after the cancel");
    assert_eq!(a.key(), b.key(), "{what}: the turn after the cancel");
    assert_sessions_eq(&s, &untouched, &format!("{what}: after the next turn"));
}

/// 7. Cancel during prefill (after the first chunk) and during decode, then
///    run the same turn again on that session: identical to an uncancelled
///    run. A greedy continuation after a decode cancel equals the
///    uncancelled tail.
pub fn cancel_then_continue<M: Family>(m: &M) {
    let v = adapter::vocab(m);
    for depth in modes(m) {
        for temperature in [0.0, 0.8] {
            let what = format!("depth {depth} T={temperature}");
            let p = prompt(81, 14, v);
            let base = Req {
                chunk: 4,
                ..Req::new(depth, 6, temperature)
            };
            let ((full, base), reference) = exercising(depth > 0 && temperature > 0.0, |seed| {
                let base = Req {
                    seed,
                    ..base.clone()
                };
                let mut full = new_session(m);
                let reference = turn(m, &mut full, &p, &base);
                ((full, base), reference)
            });
            assert_eq!(reference.tokens.len(), 6, "{what}");
            assert_eq!(reference.chunks, 4, "{what}: 14 tokens in chunks of 4");

            // During prefill, after the first chunk.
            let mut s = new_session(m);
            let cut = turn(
                m,
                &mut s,
                &p,
                &Req {
                    cancel_after_chunks: Some(1),
                    ..base.clone()
                },
            );
            let w = format!("{what}: prefill cancel");
            assert_eq!(cut.finish, Finish::Caller(Stop::Cancelled), "{w}");
            assert_eq!(cut.final_state, Final::Partial, "{w}");
            assert!(cut.tokens.is_empty(), "{w}");
            assert_eq!(cut.chunks, 1, "{w}: stopped after the first chunk");
            assert_eq!(covered(&s), p[..4], "{w}: covers exactly the first chunk");
            let again = turn(m, &mut s, &p, &base);
            assert_eq!(again.reused, 4, "{w}: the retry continued from the chunk");
            assert_eq!(again.key(), reference.key(), "{w}: retry");
            assert_sessions_eq(&s, &full, &w);

            // During decode, at emitted index 2 (the cancel token).
            let mut s = new_session(m);
            let cut = turn(
                m,
                &mut s,
                &p,
                &Req {
                    cancel_at_token: Some(2),
                    ..base.clone()
                },
            );
            let w = format!("{what}: decode cancel");
            assert_eq!(cut.finish, Finish::Caller(Stop::Cancelled), "{w}");
            assert_eq!(cut.final_state, Final::Partial, "{w}");
            assert_eq!(cut.tokens, reference.tokens[..3], "{w}: stopped at index 2");
            let partial = covered(&s);
            assert!(partial.len() > p.len(), "{w}: decode had started");
            // A deep copy, through the image the bank and the store keep.
            let mut resumed = import(m, export(&s));
            // Retry the same turn on that session.
            let again = turn(m, &mut s, &p, &base);
            assert_eq!(again.key(), reference.key(), "{w}: retry");
            assert_sessions_eq(&s, &full, &w);
            // Greedy: continue instead, with the emitted tokens appended.
            if temperature == 0.0 {
                let rest = turn(
                    m,
                    &mut resumed,
                    &cat(&p, &cut.tokens),
                    &Req {
                        max_tokens: 6 - cut.tokens.len(),
                        ..base.clone()
                    },
                );
                assert_eq!(rest.reused, partial.len(), "{w}: continued warm");
                assert_eq!(
                    cat(&cut.tokens, &rest.tokens),
                    reference.tokens,
                    "{w}: continuation"
                );
                assert_sessions_eq(&resumed, &full, &format!("{w}: continuation"));
            }
        }
    }
}

// ============================================================================
// One line per family.
// ============================================================================

/// The tests of the state contract every model passes (chunking, warm ==
/// cold, export / import, window commits, cancel and continue), inside a
/// module that defines `model()`.
macro_rules! state_tests {
    () => {
        #[test]
        fn conformance_chunking_invariance() {
            super::chunking_invariance(&model());
        }
        #[test]
        fn conformance_warm_equals_cold() {
            super::warm_equals_cold(&model());
        }
        #[test]
        fn conformance_edited_warm_equals_cold() {
            super::edited_warm_equals_cold(&model());
        }
        #[test]
        fn conformance_export_import_round_trip() {
            super::export_import_round_trip(&model());
        }
        #[test]
        fn conformance_window_commit_prefixes() {
            super::window_commit_prefixes(&model());
        }
        #[test]
        fn conformance_cancel_then_continue() {
            super::cancel_then_continue(&model());
        }
    };
}

macro_rules! conformance {
    ($family:ident, $load:expr) => {
        conformance!($family, $load, {
            #[test]
            fn conformance_exit_matrix() {
                super::exit_matrix(&model());
            }
        });
    };
    // `{ … }`: extra items of the module; the exit matrix is one of them
    // for every family but the default model with its MTP head, whose
    // ~500 real-model turns outrun the time limit on a loaded 2-core
    // machine (its exits are the family-neutral loop's, covered here on
    // every tiny MTP fixture).
    ($family:ident, $load:expr, { $($extra:tt)* }) => {
        mod $family {
            fn model() -> impl super::Family {
                ($load)()
            }
            state_tests!();
            #[test]
            fn conformance_greedy_mtp_equals_ar() {
                super::greedy_mtp_equals_ar(&model());
            }
            #[test]
            fn conformance_cancel_before_start_ar() {
                super::cancel_before_start(&model(), false);
            }
            #[test]
            fn conformance_cancel_before_start_mtp() {
                super::cancel_before_start(&model(), true);
            }
            $($extra)*
        }
    };
}

/// The state contract alone ([`state_tests!`]) for a model whose MTP head
/// cannot exercise the MTP checks (a random head never gets a draft
/// accepted).
macro_rules! conformance_state {
    ($family:ident, $load:expr) => {
        mod $family {
            fn model() -> impl super::Family {
                ($load)()
            }
            state_tests!();
        }
    };
}
