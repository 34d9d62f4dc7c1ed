//! Constrained decoding through the real decode loops on the qwen4_exp
//! fixture (a family with an MTP head): greedy MTP under a grammar equals
//! greedy AR under it at every depth, a seed replays under a grammar (AR and
//! MTP), a warm session under a grammar equals a cold one, every emitted
//! text is a prefix of the grammar's language, and a grammar that admits no
//! token ends the turn with `NoAllowedToken`.

use std::path::PathBuf;
use std::sync::Arc;

use ds4_constraint::{Constraint, Grammar, Vocabulary};
use ds4_engine::Model;
use ds4_engine::decode::{
    self, FinishReason, Flow, LiveSession, TokenEvent, TokenMask, TurnConfig, TurnObserver,
    TurnRequest, TurnResult,
};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_sampling::{Sampler, SamplingParams};
use ds4_text::Tokenizer;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp/tiny_a")
}

/// The decode loops' view of a constraint (what the server's job observer
/// does).
struct Constrained(Constraint);

impl TurnObserver for Constrained {
    fn token(&mut self, event: TokenEvent) -> Flow {
        self.0.push(event.token);
        Flow::Continue
    }
    fn allowed_after(&mut self, pending: &[u32]) -> Option<TokenMask> {
        Some(self.0.allowed_after(pending))
    }
}

struct Setup {
    model: Qwen4ExpModel,
    tok: Arc<Tokenizer>,
    vocab: Vocabulary,
}

fn setup() -> Setup {
    let model = Qwen4ExpModel::from_hf_dir(&fixture()).unwrap();
    let tok = Arc::new(Tokenizer::from_hf_dir(fixture()).unwrap());
    let vocab = Vocabulary::new(tok.clone(), tok.stop_token_ids()).unwrap();
    Setup { model, tok, vocab }
}

/// At least three words w10..w19 or w100..w127, then w7 and the end. (The
/// word set is closed under the vocabulary's prefixes — " w12" is a prefix
/// of " w120" — so no allowed token leads into a dead end.)
const GRAMMAR: &str = "start: W W W W* END\nW: / w1[0-9]*/\nEND: \" w7\"\n";

fn turn(
    s: &Setup,
    session: &mut LiveSession<Qwen4ExpModel>,
    prompt: &[u32],
    grammar: &str,
    depth: usize,
    temperature: f64,
    seed: u64,
) -> TurnResult {
    let law = s.model.descriptor().law;
    let params = SamplingParams {
        temperature,
        ..s.model.descriptor().sampling_defaults
    };
    let mut sampler = Sampler::new(law, params, seed).unwrap();
    let mut observer = Constrained(s.vocab.compile(&Grammar::Lark(grammar.into())).unwrap());
    let r = decode::generate(
        &s.model,
        session,
        TurnRequest {
            prompt,
            sampler: &mut sampler,
            config: TurnConfig {
                max_tokens: 24,
                stop_token_ids: s.tok.stop_token_ids().to_vec(),
                prefill_chunk: 8,
                logprobs: None,
                cancel: Default::default(),
            },
            mtp_depth: Some(depth),
        },
        &mut observer,
    )
    .unwrap();
    assert!(observer.0.error().is_none(), "{:?}", observer.0.error());
    r
}

/// The words of `tokens` (stop token dropped) follow the grammar's prefix
/// language: w10..w19 and w100..w127, then w7 only as the last word, and a
/// stop only after w7.
fn check_words(tok: &Tokenizer, r: &TurnResult) {
    let stop = tok.stop_token_ids();
    let words: Vec<u32> = r
        .tokens
        .iter()
        .copied()
        .filter(|t| !stop.contains(t))
        .collect();
    for (i, &w) in words.iter().enumerate() {
        let last = i + 1 == words.len();
        let word = (10..20).contains(&w) || (100..128).contains(&w);
        assert!(word || (w == 7 && last && i >= 3), "{:?}", r.tokens);
    }
    if r.finish_reason == FinishReason::StopToken {
        assert_eq!(words.last(), Some(&7), "{:?}", r.tokens);
    }
}

#[test]
fn greedy_mtp_under_a_grammar_equals_ar_under_it() {
    let s = setup();
    let prompt = [1, 5, 9, 14, 3, 77];
    let ar = turn(
        &s,
        &mut LiveSession::new(&s.model),
        &prompt,
        GRAMMAR,
        0,
        0.0,
        0,
    );
    check_words(&s.tok, &ar);
    assert!(ar.tokens.len() >= 4, "{:?}", ar.tokens);
    let max = s.model.mtp_contract().unwrap().max_depth;
    for depth in 1..=max {
        let mtp = turn(
            &s,
            &mut LiveSession::new(&s.model),
            &prompt,
            GRAMMAR,
            depth,
            0.0,
            0,
        );
        assert_eq!(mtp.tokens, ar.tokens, "depth {depth}");
        assert_eq!(mtp.finish_reason, ar.finish_reason, "depth {depth}");
        let stats = mtp.mtp.unwrap();
        assert!(stats.cycles > 0);
    }
}

#[test]
fn a_seed_replays_under_a_grammar_and_warm_equals_cold() {
    let s = setup();
    let first = [1, 5, 9, 14, 3, 77];
    for depth in [0, 2] {
        for seed in [3, 11, 29] {
            let a = turn(
                &s,
                &mut LiveSession::new(&s.model),
                &first,
                GRAMMAR,
                depth,
                1.0,
                seed,
            );
            let b = turn(
                &s,
                &mut LiveSession::new(&s.model),
                &first,
                GRAMMAR,
                depth,
                1.0,
                seed,
            );
            check_words(&s.tok, &a);
            assert_eq!(a.tokens, b.tokens, "depth {depth} seed {seed}");

            // Warm: a second turn on the session of the first (its tokens
            // and one more user word) under a fresh grammar state, against
            // the same turn on a cold session.
            let mut warm = LiveSession::new(&s.model);
            let t1 = turn(&s, &mut warm, &first, GRAMMAR, depth, 1.0, seed);
            let mut second = first.to_vec();
            second.extend(&t1.tokens);
            second.push(42);
            let w = turn(&s, &mut warm, &second, GRAMMAR, depth, 1.0, seed + 1);
            let c = turn(
                &s,
                &mut LiveSession::new(&s.model),
                &second,
                GRAMMAR,
                depth,
                1.0,
                seed + 1,
            );
            assert!(w.reused_tokens > 0);
            assert_eq!(w.tokens, c.tokens, "depth {depth} seed {seed}");
            check_words(&s.tok, &w);
        }
    }
}

#[test]
fn a_grammar_that_admits_no_token_ends_the_turn() {
    let s = setup();
    let prompt = [1, 5, 9];
    // " w3" then "x": no token of the vocabulary spells "x" (every piece
    // starts with a space), so after w3 nothing is allowed.
    for depth in [0, 1, 3] {
        let r = turn(
            &s,
            &mut LiveSession::new(&s.model),
            &prompt,
            "start: \" w3\" \"x\"\n",
            depth,
            1.0,
            5,
        );
        assert_eq!(r.tokens, vec![3], "depth {depth}");
        assert_eq!(r.finish_reason, FinishReason::NoAllowedToken);
    }
}
