//! Family isolation: GLM-5 (`glm5_next`), DeepSeek-V4 (`deepseek_v4`) and
//! Qwen4-Exp (`qwen4_exp`) share
//! layers, the decode loops, the MTP machinery and the session cache, but
//! no policy. GLM and DeepSeek are bound to the ds4 law through its descriptor (never to
//! the nucleus/MTPLX law Qwen uses), and changing one family's law
//! parameters, sampling stream (seed) or cache policy (bank budget,
//! boundary spacing, MTP depth) leaves the other family's tokens, draws,
//! logprobs, sessions and cache counters bit-identical.

use std::path::PathBuf;

use ds4_engine::Model;
use ds4_engine::decode::{Flow, TokenSource, TurnConfig, TurnRequest, on_tokens};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::state::table::TensorData;
use ds4_engine::state::warm::{CacheStats, SessionCache};
use ds4_sampling::{Law, Sampler, SamplingParams};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn glm() -> Glm5NextModel {
    Glm5NextModel::from_hf_dir(&fixtures().join("glm5_next/tiny_a")).unwrap()
}

fn deepseek() -> DeepseekV4Model {
    DeepseekV4Model::from_hf_dir(&fixtures().join("deepseek_v4/tiny_b")).unwrap()
}

fn qwen() -> Qwen4ExpModel {
    Qwen4ExpModel::from_hf_dir(&fixtures().join("qwen4_exp/tiny_a")).unwrap()
}

/// How a family's turns are run: law parameters, seed and cache policy.
#[derive(Clone, Copy)]
struct Policy {
    params: SamplingParams,
    seed: u64,
    bank_bytes: usize,
    boundary_every: usize,
    depth: usize,
}

fn defaults<M: Model>(m: &M) -> Policy {
    Policy {
        params: m.descriptor().sampling_defaults,
        seed: 11,
        bank_bytes: 64 << 20,
        boundary_every: 0,
        depth: 2,
    }
}

/// Everything two turns through a session cache produced, as bits:
/// tokens, their sources, logprobs, the banked session and the counters.
#[derive(Debug, PartialEq)]
struct Record {
    tokens: Vec<u32>,
    sources: Vec<TokenSource>,
    logprobs: Vec<u32>,
    session: Vec<(String, Vec<u32>)>,
    stats: CacheStats,
}

/// Two sampled MTP turns (the second extends the first) with a sampler
/// built from the model's own descriptor law.
fn record<M: Model>(m: &M, p: Policy) -> Record {
    record_law(m, p, m.descriptor().law)
}

/// [`record`] under `law` (to show that the law matters).
fn record_law<M: Model>(m: &M, p: Policy, law: Law) -> Record {
    let mut cache = SessionCache::new(m, p.bank_bytes).with_boundary_every(p.boundary_every);
    let mut sampler = Sampler::new(law, p.params, p.seed).unwrap();
    let v = m.vocab_size() as u32;
    let mut prompt: Vec<u32> = (0..9).map(|i| (i * 7 + 3) % v).collect();
    let (mut tokens, mut sources, mut logprobs) = (Vec::new(), Vec::new(), Vec::new());
    for turn in 0..2 {
        let config = TurnConfig {
            max_tokens: 10,
            stop_token_ids: vec![],
            prefill_chunk: 4,
            logprobs: Some(3),
            cancel: Default::default(),
        };
        let request = TurnRequest {
            prompt: &prompt,
            sampler: &mut sampler,
            config,
            mtp_depth: Some(p.depth),
        };
        let mut obs = on_tokens(|e| {
            sources.push(e.source);
            let l = e.logprobs.expect("asked for logprobs");
            logprobs.push(l.logprob.to_bits());
            logprobs.extend(l.top.iter().flat_map(|&(t, lp)| [t, lp.to_bits()]));
            Flow::Continue
        });
        let (_, r) = cache.generate(m, request, &mut obs);
        let r = r.unwrap();
        tokens.extend(&r.tokens);
        prompt.extend(&r.tokens);
        prompt.push((turn * 5 + 1) as u32 % v);
    }
    let image = cache.live().export().unwrap();
    let session = image
        .tensors
        .iter()
        .map(|t| {
            let bits = match &t.data {
                TensorData::F32(x) => x.iter().map(|f| f.to_bits()).collect(),
                TensorData::U32(x) => x.clone(),
            };
            (t.name.clone(), bits)
        })
        .collect();
    Record {
        tokens,
        sources,
        logprobs,
        session,
        stats: cache.stats(),
    }
}

#[test]
fn glm_is_bound_to_the_ds4_law_through_its_descriptor() {
    let (g, q) = (glm(), qwen());
    assert_eq!(g.descriptor().law, Law::Ds4);
    assert_eq!(g.descriptor().sampling_defaults, Law::Ds4.default_params());
    assert_eq!(q.descriptor().law, Law::Nucleus);
    // The registry hands out the same binding.
    let family = ds4_engine::families::FAMILIES
        .iter()
        .find(|f| f.descriptor.name == "glm5_next")
        .unwrap();
    assert_eq!(family.descriptor.law, Law::Ds4);
    // A GLM turn samples under ds4 (xorshift64*): the same turn forced
    // onto the nucleus law (PCG64) draws differently.
    let base = record(&g, defaults(&g));
    assert_eq!(base, record_law(&g, defaults(&g), Law::Ds4));
    let mut p = defaults(&g);
    p.params = SamplingParams {
        temperature: 1.0,
        ..Law::Nucleus.default_params()
    };
    let nucleus = record_law(&g, p, Law::Nucleus);
    assert_ne!(base.tokens, nucleus.tokens, "the law must matter");
    assert!(
        base.sources
            .iter()
            .any(|s| matches!(s, TokenSource::Draft(_))),
        "{:?}",
        base.sources
    );
}

#[test]
fn changing_qwen_leaves_glm_bit_identical_and_the_reverse() {
    let (g, q) = (glm(), qwen());
    let glm0 = record(&g, defaults(&g));
    let qwen0 = record(&q, defaults(&q));
    // Qwen with other law parameters, another stream and another cache
    // policy, then GLM again.
    let mut qp = defaults(&q);
    qp.params.top_p = 0.5;
    qp.params.top_k = 3;
    qp.params.temperature = 1.3;
    qp.seed = 999;
    qp.bank_bytes = 1 << 12;
    qp.boundary_every = 3;
    qp.depth = 3;
    let qwen1 = record(&q, qp);
    assert_ne!(qwen1.tokens, qwen0.tokens, "the Qwen change must matter");
    assert_eq!(
        record(&g, defaults(&g)),
        glm0,
        "GLM changed after a Qwen change"
    );
    // And the reverse.
    let mut gp = defaults(&g);
    gp.params.min_p = 0.2;
    gp.params.temperature = 0.7;
    gp.seed = 4242;
    gp.bank_bytes = 1 << 12;
    gp.boundary_every = 5;
    gp.depth = 1;
    let glm1 = record(&g, gp);
    assert_ne!(glm1.tokens, glm0.tokens, "the GLM change must matter");
    assert_eq!(
        record(&q, defaults(&q)),
        qwen0,
        "Qwen changed after a GLM change"
    );
    assert_eq!(record(&g, defaults(&g)), glm0);
}

/// DeepSeek-V4 the same way: the ds4 law through its descriptor, and a
/// Qwen change (law parameters, stream, cache policy, MTP depth) leaves its
/// tokens, draws, sessions and cache counters bit-identical, and the
/// reverse.
#[test]
fn deepseek_is_bound_to_the_ds4_law_and_apart_from_qwen() {
    let (d, q) = (deepseek(), qwen());
    assert_eq!(d.descriptor().law, Law::Ds4);
    assert_eq!(d.descriptor().sampling_defaults, Law::Ds4.default_params());
    let ds0 = record(&d, defaults(&d));
    let mut p = defaults(&d);
    p.params = SamplingParams {
        temperature: 1.0,
        ..Law::Nucleus.default_params()
    };
    assert_ne!(
        ds0.tokens,
        record_law(&d, p, Law::Nucleus).tokens,
        "the law must matter"
    );
    let qwen0 = record(&q, defaults(&q));
    let mut qp = defaults(&q);
    qp.params.top_p = 0.5;
    qp.params.temperature = 1.3;
    qp.seed = 999;
    qp.bank_bytes = 1 << 12;
    qp.boundary_every = 3;
    qp.depth = 3;
    assert_ne!(
        record(&q, qp).tokens,
        qwen0.tokens,
        "the Qwen change must matter"
    );
    assert_eq!(
        record(&d, defaults(&d)),
        ds0,
        "DeepSeek changed after a Qwen change"
    );
    let mut dp = defaults(&d);
    dp.params.min_p = 0.2;
    dp.params.temperature = 0.7;
    dp.seed = 4242;
    dp.boundary_every = 5;
    dp.depth = 1;
    assert_ne!(
        record(&d, dp).tokens,
        ds0.tokens,
        "the DeepSeek change must matter"
    );
    assert_eq!(
        record(&q, defaults(&q)),
        qwen0,
        "Qwen changed after a DeepSeek change"
    );
}
