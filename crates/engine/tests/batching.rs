//! Continuous batching keeps every session's bits: several sessions' turns
//! on their own threads through one [`BatchingModel`] give each session
//! exactly the tokens, logprobs and final logits of the same turn served
//! alone (greedy and sampled, long prompts prefilled in chunks between the
//! others' decode steps, sessions finishing at different times), and the
//! forwards really ran in batches. The llama, DeepSeek-V4, Qwen4-Exp and
//! GLM-5 families have batched passes of their own (the recurrent families
//! also through `forward_batch` directly: sessions at different points, one
//! wanting every row, one refused, each state continuing as alone).
//!
//! MTP turns batch too: their prefills and verify windows share passes
//! with the others' forwards, and each turn's tokens, logprobs and logits
//! are those of the same MTP turn alone; `forward_batch` called directly
//! with windows and hidden rows returns each call's logits, hidden rows
//! and a window record whose commit leaves the state of the window alone.

use std::path::PathBuf;
use std::time::Duration;

use ds4_engine::batching::{BatchConfig, BatchingModel};
use ds4_engine::decode::{self, Flow, LiveSession, TurnConfig, TurnRequest, on_tokens};
use ds4_engine::{
    BatchCall, BatchWant, HiddenRows, LogitsRows, Model, ModelState, MtpCall, MtpHistory,
};
use ds4_sampling::{Sampler, SamplingParams};

/// What a turn produced, every logit-derived value as bits.
#[derive(Debug, PartialEq)]
struct Trace {
    tokens: Vec<u32>,
    logprobs: Vec<u32>,
    last_logits: Vec<u32>,
}

struct Job {
    prompt: Vec<u32>,
    temperature: f64,
    seed: u64,
    max_tokens: usize,
}

/// Four turns; the long prompt fits the model's context with its tokens.
fn jobs(vocab: u32, context: usize) -> Vec<Job> {
    let long = 150.min(context - 16);
    let prompt = |seed: u64, len: usize| -> Vec<u32> {
        let mut x = seed.wrapping_mul(6364136223846793005) | 1;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % (vocab as u64 - 3)) as u32 + 3
            })
            .collect()
    };
    vec![
        Job {
            prompt: prompt(1, 12),
            temperature: 0.0,
            seed: 1,
            max_tokens: 24,
        },
        Job {
            prompt: prompt(2, long),
            temperature: 0.8,
            seed: 2,
            max_tokens: 12,
        },
        Job {
            prompt: prompt(3, 5),
            temperature: 0.8,
            seed: 3,
            max_tokens: 30,
        },
        Job {
            prompt: prompt(4, 40),
            temperature: 1.0,
            seed: 4,
            max_tokens: 6,
        },
    ]
}

fn run<M: Model>(model: &M, job: &Job, mtp_depth: usize) -> Trace {
    let d = model.descriptor();
    let params = SamplingParams {
        temperature: job.temperature,
        ..d.sampling_defaults
    };
    let mut sampler = Sampler::new(d.law, params, job.seed).unwrap();
    let mut session = LiveSession::new(model);
    let mut logprobs = Vec::new();
    let r = decode::generate(
        model,
        &mut session,
        TurnRequest {
            prompt: &job.prompt,
            sampler: &mut sampler,
            config: TurnConfig {
                max_tokens: job.max_tokens,
                stop_token_ids: vec![],
                // Small chunks: a long prompt's prefill interleaves with
                // the others' decode steps.
                prefill_chunk: 32,
                logprobs: Some(3),
                cancel: Default::default(),
            },
            mtp_depth: Some(mtp_depth),
        },
        &mut on_tokens(|e| {
            let l = e.logprobs.expect("logprobs requested");
            logprobs.push(l.logprob.to_bits());
            logprobs.extend(l.top.iter().flat_map(|&(t, p)| [t, p.to_bits()]));
            Flow::Continue
        }),
    )
    .unwrap();
    Trace {
        tokens: r.tokens,
        logprobs,
        last_logits: session
            .last_logits()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect(),
    }
}

fn batched_equals_solo<M: Model>(model: M, vocab: u32, expect_batches: bool) {
    batched_turns_equal_solo(&model, vocab, expect_batches, 0);
}

/// [`batched_equals_solo`] for MTP turns at `depth`: their prefills and
/// verify windows shared batches with the other sessions' forwards.
fn batched_mtp_equals_solo<M: Model>(model: &M, vocab: u32, depth: usize) {
    assert!(
        model.mtp_contract().is_some(),
        "the fixture has an MTP head"
    );
    let stats = batched_turns_equal_solo(model, vocab, true, depth);
    assert!(
        stats.shared_mtp > 0,
        "no MTP window or prefill shared a batch: {stats:?}"
    );
    assert!(
        stats.shared_drafts > 0,
        "no draft step shared a batch: {stats:?}"
    );
}

fn batched_turns_equal_solo<M: Model>(
    model: &M,
    vocab: u32,
    expect_batches: bool,
    mtp_depth: usize,
) -> ds4_engine::batching::BatchStats {
    let jobs = jobs(vocab, model.context_length());
    let solo: Vec<Trace> = jobs.iter().map(|j| run(model, j, mtp_depth)).collect();
    let batching = BatchingModel::new(
        model,
        BatchConfig {
            max_tokens: 64,
            gather: Duration::from_millis(2),
        },
    );
    for executor in [false, true] {
        let before = batching.stats();
        let together = together(&batching, &jobs, executor, mtp_depth);
        let after = batching.stats();
        assert_eq!(
            after.executed - before.executed,
            if executor {
                after.batches - before.batches
            } else {
                0
            },
            "the executor runs every batch while it runs, and only then"
        );
        for (i, (a, b)) in together.iter().zip(&solo).enumerate() {
            assert_eq!(
                a, b,
                "session {i}: batched differs from alone (executor {executor}, MTP depth \
                 {mtp_depth})"
            );
            assert_eq!(a.tokens.len(), jobs[i].max_tokens);
        }
    }
    let stats = batching.stats();
    if expect_batches {
        assert!(stats.largest >= 2, "no forward shared a batch: {stats:?}");
        assert!(stats.batches < stats.forwards, "{stats:?}");
    }
    stats
}

/// Every job on a thread of its own through `batching`: the batches run
/// by their leaders, or with `executor` on `BatchingModel::with_executor`'s
/// thread.
fn together<M: Model + Sync>(
    batching: &BatchingModel<'_, M>,
    jobs: &[Job],
    executor: bool,
    mtp_depth: usize,
) -> Vec<Trace>
where
    M::State: Send,
{
    let run_all = || {
        let ready = std::sync::Barrier::new(jobs.len());
        std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .iter()
                .map(|j| {
                    let (m, ready) = (batching.clone(), &ready);
                    s.spawn(move || {
                        // Every session joins before any forwards, so the
                        // first batches wait for all four (however fast the
                        // model, and however the threads are scheduled).
                        let _turn = m.join();
                        ready.wait();
                        run(&m, j, mtp_depth)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    if executor {
        batching.with_executor(run_all)
    } else {
        run_all()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `forward_batch` called directly with an MTP turn's calls next to a
/// decode step: two verify windows (after prefills made by `prep`), an
/// MTP prefill wanting hidden rows (a fresh session) and a plain decode
/// row. Each call's logits and hidden rows have the bits of the same
/// forward alone; each window's record commits a prefix of it (as the
/// decode loop does after a rejection), and every state then continues
/// with the bits of its solo twin.
fn direct_windows_equal_solo<M: Model>(model: &M, prep: impl Fn(&M, &mut M::State, usize)) {
    assert!(
        model.mtp_contract().is_some(),
        "the fixture has an MTP head"
    );
    let mut states: Vec<M::State> = (0..4).map(|_| model.new_state()).collect();
    prep(model, &mut states[0], 1);
    prep(model, &mut states[2], 2);
    prep(model, &mut states[3], 3);
    let mut solo: Vec<M::State> = states.iter().map(|s| s.snapshot()).collect();
    let inputs: [(Vec<u32>, BatchWant); 4] = [
        (vec![5, 9, 13, 17], BatchWant::Window),
        (vec![8, 6, 4, 12, 10, 3], BatchWant::Hidden),
        (vec![7], BatchWant::Logits),
        (vec![11, 3, 8], BatchWant::Window),
    ];
    let mut calls: Vec<BatchCall<'_, M::State>> = states
        .iter_mut()
        .zip(&inputs)
        .map(|(state, (tokens, want))| match want {
            BatchWant::Window => BatchCall::window(tokens, state),
            BatchWant::Hidden => BatchCall::hidden(tokens, state, LogitsRows::All),
            BatchWant::Logits => BatchCall::logits(tokens, state, LogitsRows::Last),
        })
        .collect();
    let batched: Vec<_> = model
        .forward_batch(&mut calls)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    drop(calls);
    let hidden_bits = |h: &M::Hidden| bits(&h.to_host().unwrap().2);
    let mut records = Vec::new();
    for (i, (b, (tokens, want))) in batched.into_iter().zip(&inputs).enumerate() {
        let (logits, hidden, record) = match want {
            BatchWant::Window => {
                let w = model.forward_window(tokens, &mut solo[i]).unwrap();
                (w.logits, Some(w.hidden), Some(w.record))
            }
            BatchWant::Hidden => {
                let (l, h) = model
                    .forward_hidden(tokens, &mut solo[i], LogitsRows::All)
                    .unwrap();
                (l, Some(h), None)
            }
            BatchWant::Logits => {
                let l = model
                    .forward(tokens, &mut solo[i], LogitsRows::Last)
                    .unwrap();
                (l, None, None)
            }
        };
        assert_eq!(b.logits.rows, logits.rows, "call {i}");
        assert_eq!(
            bits(&b.logits.logits),
            bits(&logits.logits),
            "call {i}: batched logits differ"
        );
        assert_eq!(b.hidden.is_some(), hidden.is_some(), "call {i}");
        if let (Some(a), Some(h)) = (&b.hidden, &hidden) {
            assert_eq!(a.rows(), tokens.len(), "call {i}");
            assert_eq!(
                hidden_bits(a),
                hidden_bits(h),
                "call {i}: hidden rows differ"
            );
        }
        assert_eq!(b.record.is_some(), record.is_some(), "call {i}");
        records.push(b.record.zip(record));
    }
    // Windows keep 2 of 4 rows and none of 3 (what each layer's record
    // held from before the window), batched record on the batched state,
    // solo record on the solo state.
    for (i, keep) in [(0, 2), (3, 0)] {
        let (b, a) = records[i].take().unwrap();
        states[i].commit(&b, keep).unwrap();
        solo[i].commit(&a, keep).unwrap();
    }
    let vocab = model.vocab_size() as u32;
    for i in 0..4 {
        assert_eq!(states[i].len(), solo[i].len(), "state {i}");
        let next = [(i as u32 * 7 + 2) % vocab, 6];
        let a = model
            .forward(&next, &mut states[i], LogitsRows::All)
            .unwrap();
        let b = model.forward(&next, &mut solo[i], LogitsRows::All).unwrap();
        assert_eq!(
            bits(&a.logits),
            bits(&b.logits),
            "state {i}: continues differently after the batch"
        );
    }
}

/// `mtp_forward_batch` called directly: four sessions' MTP histories at
/// different lengths (each filled from its own prompt's trunk hidden, as
/// an MTP turn's prefill does), three draft steps of one row and one of
/// three rows in one call, and one refused (hidden rows that do not match
/// its tokens). Each accepted call's logits and output hidden have the
/// bits of the same call alone, the refused one gets its own error, and
/// every history then continues with its solo twin's bits.
fn direct_drafts_equal_solo<M: Model>(model: &M) {
    assert!(
        model.mtp_contract().is_some(),
        "the fixture has an MTP head"
    );
    let vocab = model.vocab_size() as u32;
    let tok = |i: u32| (i * 11 + 5) % (vocab - 3) + 3;
    let mut histories = Vec::new();
    let mut lasts = Vec::new();
    for k in 0..5u32 {
        let prompt: Vec<u32> = (0..4 + 3 * k).map(|i| tok(i + 7 * k)).collect();
        let mut state = model.new_state();
        let (_, hidden) = model
            .forward_hidden(&prompt, &mut state, LogitsRows::Last)
            .unwrap();
        let n = prompt.len() - 1;
        let mut h = model.new_mtp_history().unwrap();
        model
            .mtp_forward(&prompt[1..], &hidden.narrow(0, n).unwrap(), &mut h)
            .unwrap();
        lasts.push(hidden);
        histories.push(h);
    }
    let mut solo = histories.clone();
    let tokens: Vec<Vec<u32>> = vec![
        vec![tok(1)],
        vec![tok(2), tok(3), tok(4)],
        vec![tok(5)],
        vec![tok(6)],
        vec![tok(7)],
    ];
    // Call 3's hidden rows: two for one token (refused).
    let inputs: Vec<M::Hidden> = lasts
        .iter()
        .zip(&tokens)
        .enumerate()
        .map(|(i, (h, t))| {
            let rows = if i == 3 { 2 } else { t.len() };
            h.narrow(h.rows() - rows, rows).unwrap()
        })
        .collect();
    let mut calls: Vec<MtpCall<'_, M::Hidden, M::MtpHistory>> = histories
        .iter_mut()
        .zip(&tokens)
        .zip(&inputs)
        .map(|((history, tokens), hidden)| MtpCall {
            tokens,
            hidden,
            history,
        })
        .collect();
    let batched = model.mtp_forward_batch(&mut calls);
    drop(calls);
    let hidden_bits = |h: &M::Hidden| bits(&h.to_host().unwrap().2);
    for (i, b) in batched.iter().enumerate() {
        let a = model.mtp_forward(&tokens[i], &inputs[i], &mut solo[i]);
        match (b, a) {
            (Ok(b), Ok(a)) => {
                assert_eq!(bits(&b.logits), bits(&a.logits), "draft {i}: logits differ");
                assert_eq!(
                    hidden_bits(&b.hidden),
                    hidden_bits(&a.hidden),
                    "draft {i}: hidden"
                );
            }
            (Err(_), Err(_)) => assert_eq!(i, 3, "draft {i} refused"),
            (b, a) => panic!("draft {i}: batched {:?}, alone {:?}", b.is_ok(), a.is_ok()),
        }
    }
    for i in 0..5 {
        assert_eq!(histories[i].len(), solo[i].len(), "history {i}");
        let next = [tok(20 + i as u32)];
        let h = lasts[i].narrow(lasts[i].rows() - 1, 1).unwrap();
        let a = model.mtp_forward(&next, &h, &mut histories[i]).unwrap();
        let b = model.mtp_forward(&next, &h, &mut solo[i]).unwrap();
        assert_eq!(
            bits(&a.logits),
            bits(&b.logits),
            "history {i} continues differently"
        );
    }
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

#[test]
fn default_model_batched_sessions_equal_solo() {
    let path = ds4_models::default_model_path().expect("default model available");
    let model = ds4_engine::families::llama::load_llama(&path).unwrap();
    batched_equals_solo(model, 49152, true);
}

#[test]
fn llama_tiny_batched_sessions_equal_solo() {
    let model =
        ds4_engine::families::llama::load_llama(&fixtures().join("llama/tiny/f32_untied")).unwrap();
    let vocab = model.vocab_size() as u32;
    batched_equals_solo(model, vocab, true);
}

/// An f16 KV cache: every session's attention in one call reads f16
/// rows (`attention_causal_half_batch`), with each session's bits alone.
#[test]
fn llama_tiny_f16_cache_batched_sessions_equal_solo() {
    let mut model =
        ds4_engine::families::llama::load_llama(&fixtures().join("llama/tiny/f32_untied")).unwrap();
    model
        .set_kv_type(ds4_engine::state::kv_cache::KvType::F16)
        .unwrap();
    let vocab = model.vocab_size() as u32;
    batched_equals_solo(model, vocab, true);
}

/// DeepSeek-V4's batched pass (shared hyper-connections and MoE, each
/// session's own attention, compressor and indexer): the same bits.
#[test]
fn deepseek_v4_batched_sessions_equal_solo() {
    let model = ds4_engine::families::deepseek_v4::DeepseekV4Model::from_hf_dir(
        &fixtures().join("deepseek_v4/tiny_b"),
    )
    .unwrap();
    let vocab = model.vocab_size() as u32;
    batched_equals_solo(model, vocab, true);
}

/// antirez/ds4's GGUF layout (IQ2_XXS / Q2_K / Q4_K experts, Q8_0
/// attention, F16 router and hyper-connections) through the batched pass.
#[test]
fn deepseek_v4_ds4_gguf_batched_sessions_equal_solo() {
    let dir = fixtures().join("deepseek_v4/ds4_gguf");
    let model = ds4_engine::families::deepseek_v4::DeepseekV4Model::load_gguf(
        &dir.join("model.gguf"),
        None,
        ds4_engine::backend::CpuOps,
    )
    .unwrap();
    let vocab = model.vocab_size() as u32;
    batched_equals_solo(model, vocab, true);
}

/// `forward_batch` called directly on sessions at different points (one
/// fresh, two after prefills made by `prep`), one wanting every row and
/// one refused (a token outside the vocabulary): each accepted call gets
/// its solo logits, the refused one its own error, and every state then
/// continues with the bits of its solo twin.
fn direct_batch_equals_solo<M: Model>(model: &M, prep: impl Fn(&M, &mut M::State, usize)) {
    let vocab = model.vocab_size() as u32;
    let mut states: Vec<M::State> = (0..4).map(|_| model.new_state()).collect();
    prep(model, &mut states[1], 1);
    prep(model, &mut states[2], 2);
    prep(model, &mut states[3], 3);
    let mut solo: Vec<M::State> = states.iter().map(|s| s.snapshot()).collect();
    let calls_of = |i: usize| -> (Vec<u32>, LogitsRows) {
        match i {
            0 => (vec![5, 9, 13, 17, 21], LogitsRows::All),
            1 => (vec![7], LogitsRows::Last),
            2 => (vec![11, 3, 8], LogitsRows::Last),
            _ => (vec![4, vocab], LogitsRows::Last),
        }
    };
    let inputs: Vec<(Vec<u32>, LogitsRows)> = (0..4).map(calls_of).collect();
    let mut calls: Vec<BatchCall<'_, M::State>> = states
        .iter_mut()
        .zip(&inputs)
        .map(|(state, (tokens, rows))| BatchCall::logits(tokens, state, *rows))
        .collect();
    let batched = model.forward_batch(&mut calls);
    drop(calls);
    for (i, (b, (tokens, rows))) in batched.iter().zip(&inputs).enumerate() {
        let alone = model.forward(tokens, &mut solo[i], *rows);
        match (b, alone) {
            (Ok(b), Ok(a)) => {
                assert!(b.hidden.is_none() && b.record.is_none(), "call {i}");
                let b = &b.logits;
                assert_eq!((b.rows, b.vocab), (a.rows, a.vocab), "call {i}");
                assert_eq!(
                    bits(&b.logits),
                    bits(&a.logits),
                    "call {i}: batched differs"
                );
            }
            (Err(_), Err(_)) => assert_eq!(i, 3, "call {i} refused"),
            (b, a) => panic!("call {i}: batched {:?}, alone {:?}", b.is_ok(), a.is_ok()),
        }
    }
    // The accepted calls' states continue as their solo twins.
    for i in 0..3 {
        let next = [(i as u32 * 7 + 2) % vocab, 6];
        let a = model
            .forward(&next, &mut states[i], LogitsRows::All)
            .unwrap();
        let b = model.forward(&next, &mut solo[i], LogitsRows::All).unwrap();
        assert_eq!(states[i].len(), solo[i].len(), "state {i}");
        assert!(
            a.logits
                .iter()
                .zip(&b.logits)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "state {i}: continues differently after the batch"
        );
    }
}

/// Qwen4-Exp's batched pass (shared hyper-connections, DeltaNet and
/// attention projections, MoE and head; each session's PLE window,
/// DeltaNet conv and recurrent state, indexer, M-RoPE positions and
/// attention on its own state): the same bits. One session of the direct
/// batch carries an image's M-RoPE positions (its text continues after
/// their largest).
#[test]
fn qwen4_exp_batched_sessions_equal_solo() {
    use ds4_engine::MediaChunk;
    use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
    let model = Qwen4ExpModel::from_hf_dir(&fixtures().join("qwen4_exp/tiny_a")).unwrap();
    direct_batch_equals_solo(&model, |m, state, k| {
        let tokens: Vec<u32> = (0..4 + 3 * k as u32)
            .map(|i| (i * 5 + k as u32) % 100 + 3)
            .collect();
        if k == 3 {
            // An "image" of 2×3 placeholders (positions only) between text.
            let mut positions = vec![[0, 0, 0], [1, 1, 1]];
            for h in 0..2 {
                for w in 0..3 {
                    positions.push([2, 2 + h, 2 + w]);
                }
            }
            let next = 5;
            positions.extend((0..(tokens.len() - positions.len()) as u32).map(|i| [next + i; 3]));
            let media = MediaChunk {
                spans: &[],
                positions: &positions,
            };
            m.forward_media(&tokens, &media, state, LogitsRows::Last)
                .unwrap();
        } else {
            m.forward(&tokens, state, LogitsRows::Last).unwrap();
        }
    });
    let vocab = model.vocab_size() as u32;
    batched_equals_solo(model, vocab, true);
}

/// GLM-5's batched pass (shared mHC, norms, MLA query and latent
/// projections, FFN and head; each session's KDA layers, latent cache,
/// pooled indexer or inherited selection and attention on its own state):
/// the same bits. tiny_a has a shared-indexer layer.
#[test]
fn glm5_next_batched_sessions_equal_solo() {
    use ds4_engine::families::glm5_next::Glm5NextModel;
    for name in ["tiny_a", "tiny_b"] {
        let model = Glm5NextModel::from_hf_dir(&fixtures().join("glm5_next").join(name)).unwrap();
        direct_batch_equals_solo(&model, |m, state, k| {
            let tokens: Vec<u32> = (0..4 + 5 * k as u32)
                .map(|i| (i * 7 + k as u32) % 60 + 3)
                .collect();
            m.forward(&tokens, state, LogitsRows::Last).unwrap();
        });
        let vocab = model.vocab_size() as u32;
        batched_equals_solo(model, vocab, true);
    }
}

/// Prefill `3 + 4k` tokens (a session at its own point before a window).
fn prefill<M: Model>(m: &M, state: &mut M::State, k: usize) {
    let vocab = m.vocab_size() as u32;
    let tokens: Vec<u32> = (0..3 + 4 * k as u32)
        .map(|i| (i * 5 + k as u32) % (vocab - 3) + 3)
        .collect();
    m.forward(&tokens, state, LogitsRows::Last).unwrap();
}

/// The default model with its trained MTP head: MTP turns' prefills and
/// verify windows in the batches, every session's bits as alone.
#[test]
fn default_model_mtp_batched_turns_equal_solo() {
    let path = ds4_models::default_model_path().expect("default model available");
    let head = ds4_models::mtp_head_for(&path)
        .expect("the default model has a head")
        .expect("the head file checks out");
    let mut model = ds4_engine::families::llama::load_llama(&path).unwrap();
    model.attach_mtp_head(&head).unwrap();
    direct_windows_equal_solo(&model, prefill);
    direct_drafts_equal_solo(&model);
    batched_mtp_equals_solo(&model, 49152, 2);
}

#[test]
fn deepseek_v4_mtp_batched_turns_equal_solo() {
    let model = ds4_engine::families::deepseek_v4::DeepseekV4Model::from_hf_dir(
        &fixtures().join("deepseek_v4/tiny_b"),
    )
    .unwrap();
    direct_windows_equal_solo(&model, prefill);
    direct_drafts_equal_solo(&model);
    let vocab = model.vocab_size() as u32;
    batched_mtp_equals_solo(&model, vocab, 2);
}

/// Qwen4-Exp's windows in a batch record each session's PLE and DeltaNet
/// replays from its own caches: a prefix commit restores what alone does.
#[test]
fn qwen4_exp_mtp_batched_turns_equal_solo() {
    use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
    let model = Qwen4ExpModel::from_hf_dir(&fixtures().join("qwen4_exp/tiny_a")).unwrap();
    direct_windows_equal_solo(&model, prefill);
    direct_drafts_equal_solo(&model);
    let vocab = model.vocab_size() as u32;
    batched_mtp_equals_solo(&model, vocab, 2);
}

/// GLM-5's windows in a batch record each session's KDA replays.
#[test]
fn glm5_next_mtp_batched_turns_equal_solo() {
    use ds4_engine::families::glm5_next::Glm5NextModel;
    let model = Glm5NextModel::from_hf_dir(&fixtures().join("glm5_next/tiny_b")).unwrap();
    direct_windows_equal_solo(&model, prefill);
    direct_drafts_equal_solo(&model);
    let vocab = model.vocab_size() as u32;
    batched_mtp_equals_solo(&model, vocab, 2);
}
