//! Speculative decoding is distribution-exact under both laws.
//!
//! 1. Exact: for many small (p, q) pairs, the output marginal of one
//!    draft/accept/residual step, computed in closed form from the crate's
//!    own acceptance probability and residual, equals p.
//! 2. Monte Carlo: a whole K = 3 cycle (primary, drafts, verify, residual
//!    or bonus) over a toy model matches autoregressive sampling, by a
//!    chi-square goodness-of-fit test against the exact AR sequence law.
//!    Seeds are fixed, so the test is deterministic; the threshold is the
//!    1e-6 upper quantile of chi-square, so a correct implementation passes
//!    for essentially any seed, and a negative control (always accepting the
//!    draft) shows the test has the power to fail.

use std::collections::HashMap;

use ds4_sampling::speculative::{acceptance_probability, residual};
use ds4_sampling::{Distribution, Law, NumpyPcg64, Sampler, SamplingParams, TokenCounts};

/// Random sparse distribution over ids < v (support may be any non-empty subset).
fn random_dist(rng: &mut NumpyPcg64, v: u32) -> Distribution {
    loop {
        let mut ids = Vec::new();
        let mut probs = Vec::new();
        for id in 0..v {
            if rng.random() < 0.7 {
                ids.push(id);
                // Coarse weights make exact ties and p == q entries common.
                probs.push(
                    (rng.random() * 4.0).floor() + if rng.random() < 0.5 { 0.0 } else { 0.25 },
                );
            }
        }
        let total: f64 = probs.iter().sum();
        if total > 0.0 {
            let (ids, probs): (Vec<u32>, Vec<f64>) = ids
                .into_iter()
                .zip(probs)
                .filter(|(_, p)| *p > 0.0)
                .map(|(i, p)| (i, p / total))
                .unzip();
            return Distribution::new(ids, probs).expect("valid by construction");
        }
    }
}

/// Exact output marginal of: d ~ q; accept w.p. a(d); else x ~ residual(p, q).
fn one_step_marginal(p: &Distribution, q: &Distribution) -> HashMap<u32, f64> {
    let mut out: HashMap<u32, f64> = HashMap::new();
    let mut reject_mass = 0.0;
    for (&d, &qd) in q.ids().iter().zip(q.probs()) {
        let a = acceptance_probability(p.prob(d), qd);
        *out.entry(d).or_default() += qd * a;
        reject_mass += qd * (1.0 - a);
    }
    let r = residual(p, q);
    for (&x, &rx) in r.ids().iter().zip(r.probs()) {
        *out.entry(x).or_default() += reject_mass * rx;
    }
    out
}

fn assert_marginal_is_p(p: &Distribution, q: &Distribution) {
    let m = one_step_marginal(p, q);
    for (&x, &mx) in &m {
        assert!(
            (mx - p.prob(x)).abs() < 1e-12,
            "token {x}: marginal {mx} vs p {}\np={p:?}\nq={q:?}",
            p.prob(x)
        );
    }
    for &x in p.ids() {
        let mx = m.get(&x).copied().unwrap_or(0.0);
        assert!(
            (mx - p.prob(x)).abs() < 1e-12,
            "token {x} of p missing from the marginal"
        );
    }
}

#[test]
fn one_step_output_marginal_equals_p_exactly() {
    let mut rng = NumpyPcg64::from_seed(2024);
    for _ in 0..3000 {
        let v = 1 + (rng.random() * 6.0) as u32;
        let p = random_dist(&mut rng, v);
        let q = random_dist(&mut rng, v);
        assert_marginal_is_p(&p, &q);
        assert_marginal_is_p(&p, &p);
    }
    // Disjoint supports: every draft is rejected, the residual is p.
    let p = Distribution::new(vec![0, 1], vec![0.25, 0.75]).unwrap();
    let q = Distribution::new(vec![2, 3], vec![0.5, 0.5]).unwrap();
    assert_marginal_is_p(&p, &q);
    assert_eq!(residual(&p, &q), p);
}

#[test]
fn acceptance_rule_edge_cases() {
    assert_eq!(acceptance_probability(0.5, 0.25), 1.0);
    assert_eq!(acceptance_probability(0.25, 0.5), 0.5);
    assert_eq!(acceptance_probability(0.3, 0.0), 1.0);
    assert_eq!(acceptance_probability(0.0, 0.0), 0.0);
    assert_eq!(acceptance_probability(0.0, 0.4), 0.0);
    // Identical p and q: the residual has no mass and falls back to p.
    let p = Distribution::new(vec![1, 4], vec![0.5, 0.5]).unwrap();
    assert_eq!(residual(&p, &p), p);
}

#[test]
fn marginal_is_p_for_law_distributions() {
    // Distributions as the laws produce them (top-k, nucleus, min_p cuts).
    let mut rng = NumpyPcg64::from_seed(99);
    for law in [Law::Nucleus, Law::Ds4] {
        let mut params = law.default_params();
        params.top_k = 4;
        let mut target = Sampler::new(law, params, 1).unwrap();
        params.temperature = 1.3;
        let mut drafter = Sampler::new(law, params, 2).unwrap();
        let counts = TokenCounts::new();
        for _ in 0..300 {
            let row: Vec<f32> = (0..8).map(|_| (rng.random() * 6.0 - 3.0) as f32).collect();
            let row2: Vec<f32> = row
                .iter()
                .map(|&x| x + (rng.random() as f32 - 0.5))
                .collect();
            let p = target.distribution(&row, &counts).unwrap();
            let q = drafter.distribution(&row2, &counts).unwrap();
            assert_marginal_is_p(&p, &q);
        }
        assert_eq!(target.draws_taken(), 0, "distribution() takes no draw");
    }
}

#[test]
fn accept_consumes_one_draw_and_greedy_none() {
    for law in [Law::Nucleus, Law::Ds4] {
        let p = Distribution::new(vec![0, 1], vec![0.5, 0.5]).unwrap();
        let q = Distribution::new(vec![0, 1], vec![0.9, 0.1]).unwrap();
        let mut s = Sampler::new(law, law.default_params(), 5).unwrap();
        s.accept(&p, &q, 0);
        s.accept(&p, &q, 1);
        assert_eq!(s.draws_taken(), 2);
        // q(d) < p(d): always accepted.
        assert!((0..50).all(|_| s.accept(&p, &q, 1)));
        let mut greedy_params = law.default_params();
        greedy_params.temperature = 0.0;
        let mut g = Sampler::new(law, greedy_params, 5).unwrap();
        let onehot = Distribution::one_hot(3);
        assert!(g.accept(&onehot, &Distribution::one_hot(3), 3));
        assert!(!g.accept(&onehot, &Distribution::one_hot(2), 2));
        assert_eq!(g.sample_from(&p), 0);
        assert_eq!(g.draws_taken(), 0, "greedy never draws");
    }
}

// ---- Monte Carlo of the K-depth cycle -------------------------------------

const V: usize = 4;
const LEN: usize = 4;
const K: usize = 3;

/// Toy target: logits from the last two tokens.
fn target_logits(ctx: &[u32]) -> Vec<f32> {
    let (a, b) = (ctx[ctx.len() - 2] as f32, ctx[ctx.len() - 1] as f32);
    (0..V)
        .map(|i| 1.5 * (0.9 * i as f32 + 1.7 * a + 0.6 * b).sin() + 0.3 * i as f32)
        .collect()
}

/// Toy drafter: a different function of the same context.
fn draft_logits(ctx: &[u32]) -> Vec<f32> {
    let (a, b) = (ctx[ctx.len() - 2] as f32, ctx[ctx.len() - 1] as f32);
    (0..V)
        .map(|i| 1.2 * (0.5 * i as f32 + 1.1 * a - 0.4 * b).cos())
        .collect()
}

const PROMPT: [u32; 2] = [0, 1];

fn counts_of(tokens: &[u32]) -> TokenCounts {
    let mut c = TokenCounts::new();
    for &t in tokens {
        c.add(t);
    }
    c
}

/// Deliberate mistakes for the negative controls.
#[derive(Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// Accept every draft (emits q's law).
    AcceptAll,
    /// Draw the correction from p instead of the residual (p - q)+.
    CorrectFromP,
}

/// One generation of LEN tokens by the speculative cycle (draw order of
/// spec section 5), with an optional deliberate bug.
fn speculative_generate(s: &mut Sampler, bug: Bug) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    let mut pending: Option<u32> = None;
    let ctx = |out: &[u32]| [PROMPT.as_slice(), out].concat();
    while out.len() < LEN {
        let primary = match pending.take() {
            Some(t) => t,
            None => {
                s.sample(&target_logits(&ctx(&out)), &counts_of(&out))
                    .unwrap()
                    .token
            }
        };
        out.push(primary);
        // Drafts d1..dK, each from q given the previous drafts.
        let mut drafts = Vec::new();
        let mut qs = Vec::new();
        for _ in 0..K {
            let block = [out.as_slice(), &drafts].concat();
            let q = s
                .distribution(&draft_logits(&ctx(&block)), &counts_of(&block))
                .unwrap();
            drafts.push(s.sample_from(&q));
            qs.push(q);
        }
        // Verify in order until the first rejection.
        let mut all = true;
        for i in 0..K {
            let block = [out.as_slice(), &drafts[..i]].concat();
            let p = s
                .distribution(&target_logits(&ctx(&block)), &counts_of(&block))
                .unwrap();
            let accepted = s.accept(&p, &qs[i], drafts[i]) || bug == Bug::AcceptAll;
            if !accepted {
                out.extend_from_slice(&drafts[..i]);
                let correction = if bug == Bug::CorrectFromP {
                    p
                } else {
                    Sampler::residual(&p, &qs[i])
                };
                pending = Some(s.sample_from(&correction));
                all = false;
                break;
            }
        }
        if all {
            out.extend_from_slice(&drafts);
            let p = s
                .distribution(&target_logits(&ctx(&out)), &counts_of(&out))
                .unwrap();
            pending = Some(s.sample_from(&p));
        }
    }
    if let Some(t) = pending {
        out.push(t);
    }
    out.truncate(LEN);
    out
}

/// Exact AR probability of every length-LEN sequence.
fn ar_law(law: Law, params: SamplingParams) -> HashMap<Vec<u32>, f64> {
    let mut s = Sampler::new(law, params, 0).unwrap();
    let mut law_map = HashMap::new();
    let mut stack = vec![(Vec::<u32>::new(), 1.0f64)];
    while let Some((seq, prob)) = stack.pop() {
        if seq.len() == LEN {
            law_map.insert(seq, prob);
            continue;
        }
        let ctx = [PROMPT.as_slice(), &seq].concat();
        let p = s
            .distribution(&target_logits(&ctx), &counts_of(&seq))
            .unwrap();
        for (&t, &pt) in p.ids().iter().zip(p.probs()) {
            let mut next = seq.clone();
            next.push(t);
            stack.push((next, prob * pt));
        }
    }
    law_map
}

/// Chi-square statistic (cells with expectation < 5 pooled) and its df;
/// infinite when a sequence of AR probability 0 was generated.
fn chi_square(
    expected: &HashMap<Vec<u32>, f64>,
    observed: &HashMap<Vec<u32>, u64>,
    n: u64,
) -> (f64, usize) {
    if let Some(seq) = observed.keys().find(|seq| !expected.contains_key(*seq)) {
        eprintln!("impossible sequence {seq:?} was generated");
        return (f64::INFINITY, 0);
    }
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pool_e, mut pool_o) = (0.0, 0.0);
    for (seq, &p) in expected {
        let e = p * n as f64;
        let o = observed.get(seq).copied().unwrap_or(0) as f64;
        if e < 5.0 {
            pool_e += e;
            pool_o += o;
        } else {
            stat += (o - e).powi(2) / e;
            cells += 1;
        }
    }
    if pool_e > 0.0 {
        stat += (pool_o - pool_e).powi(2) / pool_e;
        cells += 1;
    }
    (stat, cells - 1)
}

/// Upper 1e-6 quantile of chi-square(df), Wilson-Hilferty approximation.
fn chi_square_critical(df: usize) -> f64 {
    let z = 4.753_424; // standard normal upper 1e-6 quantile
    let d = df as f64;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

fn run_cycle_test(law: Law, params: SamplingParams, seed: u64) {
    const N: u64 = 20_000;
    let expected = ar_law(law, params);
    let total: f64 = expected.values().sum();
    assert!((total - 1.0).abs() < 1e-9, "AR law sums to {total}");
    let run = |bug: Bug| {
        let mut s = Sampler::new(law, params, seed).unwrap();
        let mut obs: HashMap<Vec<u32>, u64> = HashMap::new();
        for _ in 0..N {
            *obs.entry(speculative_generate(&mut s, bug)).or_default() += 1;
        }
        obs
    };
    let (stat, df) = chi_square(&expected, &run(Bug::None), N);
    assert!(
        stat.is_finite(),
        "{law}: the speculative cycle generated a sequence AR cannot"
    );
    let crit = chi_square_critical(df);
    eprintln!("{law}: chi2 {stat:.1}, df {df}, critical (1e-6) {crit:.1}");
    assert!(
        df >= 10,
        "{law}: too few cells ({df}) for a meaningful test"
    );
    assert!(
        stat < crit,
        "{law}: speculative cycle differs from AR: chi2 {stat:.1} >= {crit:.1} (df {df})"
    );
    // Negative controls: the same test must reject classic mistakes.
    for bug in [Bug::AcceptAll, Bug::CorrectFromP] {
        let (bad, _) = chi_square(&expected, &run(bug), N);
        eprintln!("{law}: negative control chi2 {bad:.1}");
        assert!(
            bad > crit,
            "{law}: the test cannot tell a broken cycle apart (chi2 {bad:.1})"
        );
    }
}

#[test]
fn k3_cycle_matches_ar_nucleus_law() {
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 3,
        min_p: 0.0,
        presence_penalty: 0.2,
        frequency_penalty: 0.3,
    };
    run_cycle_test(Law::Nucleus, params, 7);
}

#[test]
fn k3_cycle_matches_ar_ds4_law() {
    let params = SamplingParams {
        temperature: 1.1,
        top_p: 0.97,
        top_k: 0,
        min_p: 0.05,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
    };
    run_cycle_test(Law::Ds4, params, 11);
}
