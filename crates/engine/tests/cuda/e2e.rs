//! The tiny fixtures end to end on the GPU: logits against the transformers
//! references (1e-4, the CPU tests' bound, with the difference to the CPU
//! printed), and the exactness properties of the conformance suite on the
//! GPU's own bits: one forward == chunks == single steps, a warm turn == a
//! cold one (AR and MTP, greedy and sampled), every committed prefix of a
//! verify window == the shorter forward, greedy MTP == greedy AR at depths
//! 1..=3. And a checkpoint made on one backend is refused by the other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ds4_engine::backend::cuda::Pdl;
use ds4_engine::backend::{Backend, CpuOps, CudaOps};
use ds4_engine::decode::{self, LiveSession, Observe, TurnConfig, TurnRequest};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::llama::LlamaModel;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::state::checkpoint::{self, CheckpointStore};
use ds4_engine::table::{NamedTensor, TensorData};
use ds4_engine::{LogitsRows, Model, ModelState};
use ds4_sampling::{Sampler, SamplingParams};
use safetensors::{Dtype, SafeTensors};

use crate::support::{bits, gpu};

const TOL: f32 = 1e-4;

pub(crate) fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A reference file: name → (shape, values).
struct Reference(HashMap<String, (Vec<usize>, Vec<f64>)>);

impl Reference {
    fn open(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let st = SafeTensors::deserialize(&bytes).expect("a valid reference file");
        let mut map = HashMap::new();
        for (k, v) in st.tensors() {
            let vals: Vec<f64> = match v.dtype() {
                Dtype::F32 => v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                Dtype::I64 => v
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                d => panic!("unexpected dtype {d:?}"),
            };
            map.insert(k, (v.shape().to_vec(), vals));
        }
        Self(map)
    }
    fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
    fn f32(&self, k: &str) -> Vec<f32> {
        self.0[k].1.iter().map(|&x| x as f32).collect()
    }
    fn ids(&self, k: &str) -> Vec<u32> {
        self.0[k].1.iter().map(|&x| x as u32).collect()
    }
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// All logits rows of `tokens` from a fresh state.
fn logits<M: Model>(m: &M, tokens: &[u32]) -> Vec<f32> {
    let mut s = m.new_state();
    m.forward(tokens, &mut s, LogitsRows::All).unwrap().logits
}

/// GPU logits against the reference (bound) and the CPU (printed).
fn against_reference<G: Model, C: Model>(what: &str, g: &G, c: &C, ids: &[u32], want: &[f32]) {
    let gl = logits(g, ids);
    let cl = logits(c, ids);
    let d_ref = max_diff(&gl, want);
    let d_cpu = max_diff(&gl, &cl);
    let same = bits(&gl)
        .iter()
        .zip(bits(&cl))
        .filter(|(a, b)| **a == *b)
        .count();
    println!(
        "REPORT e2e={what} tokens={} max_abs_vs_transformers={d_ref:.3e} max_abs_vs_cpu={d_cpu:.3e} \
         cpu_identical_bits={same}/{}",
        ids.len(),
        gl.len()
    );
    assert!(
        d_ref <= TOL,
        "{what}: max |Δ| vs transformers {d_ref} > {TOL}"
    );
}

/// `len` pseudo-random token ids in `3..vocab`.
fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
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

fn table_bits(t: &[NamedTensor]) -> Vec<(String, Vec<u32>)> {
    t.iter()
        .map(|t| {
            let b = match &t.data {
                TensorData::F32(v) => bits(v),
                TensorData::U32(v) => v.clone(),
            };
            (t.name.clone(), b)
        })
        .collect()
}

fn rows_bits<M: Model>(m: &M, s: &mut M::State, tokens: &[u32]) -> Vec<u32> {
    bits(&m.forward(tokens, s, LogitsRows::All).unwrap().logits)
}

/// One forward == uneven chunks == single steps (rows and state).
fn chunking<M: Model>(what: &str, m: &M) {
    let p = prompt(1, 17, m.vocab_size());
    let mut one = m.new_state();
    let whole = rows_bits(m, &mut one, &p);
    for pieces in [vec![5, 1, 9, 2], vec![1; 17]] {
        let mut s = m.new_state();
        let mut rows = Vec::new();
        let mut at = 0;
        for n in pieces {
            rows.extend(rows_bits(m, &mut s, &p[at..at + n]));
            at += n;
        }
        assert_eq!(rows, whole, "{what}: chunked logits");
        assert_eq!(
            table_bits(&s.export().unwrap()),
            table_bits(&one.export().unwrap()),
            "{what}: chunked state"
        );
    }
    println!("REPORT e2e={what} one_forward==chunks==steps (logits and state, bit for bit)");
}

/// One turn: tokens and per-token logprob bits.
fn turn<M: Model>(
    m: &M,
    s: &mut LiveSession<M>,
    p: &[u32],
    depth: usize,
    max_tokens: usize,
    temperature: f64,
    chunk: usize,
) -> (Vec<u32>, Vec<Vec<u32>>, usize) {
    let d = m.descriptor();
    let params = SamplingParams {
        temperature,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        ..d.sampling_defaults
    };
    let mut sampler = Sampler::new(d.law, params, 7).unwrap();
    let mut lp = Vec::new();
    let request = TurnRequest {
        prompt: p,
        sampler: &mut sampler,
        config: TurnConfig {
            max_tokens,
            stop_token_ids: vec![],
            prefill_chunk: chunk,
            logprobs: Some(4),
            cancel: Default::default(),
        },
        mtp_depth: Some(depth),
    };
    let mut observer = Observe::new(
        |_| {},
        |e: decode::TokenEvent| {
            let l = e.logprobs.expect("logprobs");
            let mut b = vec![l.logprob.to_bits()];
            b.extend(l.top.iter().flat_map(|&(t, p)| [t, p.to_bits()]));
            lp.push(b);
            decode::Flow::Continue
        },
    );
    let r = decode::generate(m, s, request, &mut observer).unwrap();
    (r.tokens, lp, r.reused_tokens)
}

fn session_bits<M: Model>(s: &LiveSession<M>) -> (Vec<u32>, Vec<(String, Vec<u32>)>) {
    let image = s.export().unwrap();
    (image.tokens.clone(), table_bits(&image.tensors))
}

/// A warm second turn == a cold turn over the whole prompt in one prefill.
fn warm_equals_cold<M: Model>(what: &str, m: &M) {
    let v = m.vocab_size();
    let mut depths = vec![0];
    depths.extend(m.mtp_contract().map(|c| c.default_depth));
    for depth in depths {
        for temperature in [0.0, 0.8] {
            let p1 = prompt(11, 12, v);
            let mut warm = LiveSession::new(m);
            let (t1, _, _) = turn(m, &mut warm, &p1, depth, 3, temperature, 5);
            let mut p2 = p1.clone();
            p2.extend(&t1);
            p2.extend(prompt(12, 7, v));
            let w = turn(m, &mut warm, &p2, depth, 5, temperature, 4);
            assert_eq!(w.2, p1.len() + t1.len(), "{what}: the second turn is warm");
            let mut cold = LiveSession::new(m);
            let c = turn(m, &mut cold, &p2, depth, 5, temperature, p2.len());
            assert_eq!(c.2, 0, "{what}: cold");
            assert_eq!(
                (&w.0, &w.1),
                (&c.0, &c.1),
                "{what} depth {depth} T={temperature}"
            );
            assert_eq!(session_bits(&warm), session_bits(&cold), "{what}: sessions");
        }
    }
    println!("REPORT e2e={what} warm==cold (AR and MTP, T=0 and T=0.8, tokens, logprobs, session)");
}

/// Greedy MTP at depths 1..=3 == greedy AR; every committed prefix of a
/// verify window == the shorter forward.
fn mtp_exactness<M: Model>(what: &str, m: &M) {
    let Some(contract) = m.mtp_contract() else {
        return;
    };
    let v = m.vocab_size();
    for (seed, len) in [(41u64, 5usize), (42, 11)] {
        let p = prompt(seed, len, v);
        let mut ar = LiveSession::new(m);
        let (a, _, _) = turn(m, &mut ar, &p, 0, 14, 0.0, 64);
        for depth in 1..=contract.max_depth.min(3) {
            let mut s = LiveSession::new(m);
            let (t, _, _) = turn(m, &mut s, &p, depth, 14, 0.0, 64);
            assert_eq!(t, a, "{what}: greedy MTP depth {depth} vs AR");
        }
    }
    let p = prompt(31, 9, v);
    let mut base = m.new_state();
    m.forward(&p, &mut base, LogitsRows::All).unwrap();
    for rows in 1..=contract.max_depth + 1 {
        let w = prompt(32 + rows as u64, rows, v);
        let mut plain = base.snapshot();
        let forward_rows = rows_bits(m, &mut plain, &w);
        for accepted in 0..=rows {
            let mut s = base.snapshot();
            let win = m.forward_window(&w, &mut s).unwrap();
            assert_eq!(
                bits(&win.logits.logits),
                forward_rows,
                "{what}: window rows"
            );
            s.commit(&win.record, accepted).unwrap();
            let mut r = base.snapshot();
            if accepted > 0 {
                m.forward(&w[..accepted], &mut r, LogitsRows::All).unwrap();
            }
            assert_eq!(
                table_bits(&s.export().unwrap()),
                table_bits(&r.export().unwrap()),
                "{what}: window of {rows}, commit {accepted}"
            );
        }
    }
    println!(
        "REPORT e2e={what} greedy MTP (depths 1..={}) == AR; window commits == shorter forwards",
        contract.max_depth.min(3)
    );
}

pub(crate) fn exactness<M: Model>(what: &str, m: &M) {
    chunking(what, m);
    warm_equals_cold(what, m);
    mtp_exactness(what, m);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_llama_tiny_matches_transformers_and_is_exact() {
    let g = gpu();
    for variant in [
        "f32_untied",
        "f32_tied",
        "f32_sharded",
        "bf16",
        "rope_llama3",
        "rope_linear",
    ] {
        let dir = fixtures().join("llama/tiny").join(variant);
        let gm = LlamaModel::load_hf(&dir, g.clone()).unwrap();
        let cm = LlamaModel::load_hf(&dir, CpuOps).unwrap();
        let r =
            Reference::open(&fixtures().join(format!("llama/tiny/{variant}.logits.safetensors")));
        let mut p = 0;
        while r.has(&format!("p{p}.tokens")) {
            let ids = r.ids(&format!("p{p}.tokens"));
            against_reference(
                &format!("llama {variant} p{p}"),
                &gm,
                &cm,
                &ids,
                &r.f32(&format!("p{p}.logits")),
            );
            p += 1;
        }
        assert!(p >= 2, "{variant}: at least two prompts");
        if variant == "f32_untied" {
            exactness("llama f32_untied", &gm);
        }
    }
}

fn qwen4(name: &str) {
    let dir = fixtures().join("qwen4_exp").join(name);
    let gm = Qwen4ExpModel::load(&dir, gpu()).unwrap();
    let cm = Qwen4ExpModel::load(&dir, CpuOps).unwrap();
    let r = Reference::open(&fixtures().join(format!("qwen4_exp/{name}.ref.safetensors")));
    against_reference(
        &format!("qwen4_exp {name}"),
        &gm,
        &cm,
        &r.ids("input_ids"),
        &r.f32("logits_full"),
    );
    exactness(&format!("qwen4_exp {name}"), &gm);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_qwen4_exp_tiny_a_matches_transformers_and_is_exact() {
    qwen4("tiny_a");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_qwen4_exp_tiny_b_matches_transformers_and_is_exact() {
    qwen4("tiny_b");
}

/// The tiny qwen4_exp shape with synthetic 4-bit block weights made on the
/// device (the fixtures above are f32, so only this runs the block-format
/// kernels end to end): one forward == chunks == single steps, warm ==
/// cold, greedy MTP == AR and every verify window (2..=4 rows: the one-row
/// kernels per row) == the shorter forwards, bit for bit.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_qwen4_exp_synthetic_block_weights_are_exact() {
    use ds4_engine::families::{Device, LoadedModel};
    let config = ds4_engine::load::synthetic::shape_config("qwen4_exp", "tiny").unwrap();
    let (loaded, _) =
        LoadedModel::synthetic("qwen4_exp", &config, 11, true, Device::Cuda(0)).unwrap();
    let LoadedModel::Qwen4ExpCuda(m) = loaded else {
        panic!("a CUDA model was asked for");
    };
    assert!(
        m.mtp_contract().is_some(),
        "the synthetic model has its MTP head"
    );
    exactness("qwen4_exp synthetic tiny (Q4_1)", m.as_ref());
}

fn deepseek(name: &str) {
    let dir = fixtures().join("deepseek_v4").join(name);
    let gm = DeepseekV4Model::load(&dir, gpu()).unwrap();
    let cm = DeepseekV4Model::load(&dir, CpuOps).unwrap();
    let r = Reference::open(&fixtures().join(format!("deepseek_v4/{name}.ref.safetensors")));
    against_reference(
        &format!("deepseek_v4 {name}"),
        &gm,
        &cm,
        &r.ids("input_ids"),
        &r.f32("logits_full"),
    );
    exactness(&format!("deepseek_v4 {name}"), &gm);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_deepseek_v4_tiny_a_matches_transformers_and_is_exact() {
    deepseek("tiny_a");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_deepseek_v4_tiny_b_matches_transformers_and_is_exact() {
    deepseek("tiny_b");
}

fn glm5(name: &str) {
    let dir = fixtures().join("glm5_next").join(name);
    let gm = Glm5NextModel::load(&dir, gpu()).unwrap();
    let cm = Glm5NextModel::load(&dir, CpuOps).unwrap();
    let r = Reference::open(&fixtures().join(format!("glm5_next/{name}.ref.safetensors")));
    against_reference(
        &format!("glm5_next {name}"),
        &gm,
        &cm,
        &r.ids("input_ids"),
        &r.f32("logits_full"),
    );
    exactness(&format!("glm5_next {name}"), &gm);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_glm5_next_tiny_a_matches_transformers_and_is_exact() {
    glm5("tiny_a");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_glm5_next_tiny_b_matches_transformers_and_is_exact() {
    glm5("tiny_b");
}

/// A checkpoint written by a GPU model is another identity for the CPU
/// model of the same files (and the reverse): counted as foreign, never
/// loaded, the turn starts cold.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_checkpoints_do_not_cross_backends() {
    let dir = fixtures().join("qwen4_exp/tiny_a");
    let gm = Qwen4ExpModel::load(&dir, gpu()).unwrap();
    let cm = Qwen4ExpModel::load(&dir, CpuOps).unwrap();
    assert_ne!(gm.backend().tag, cm.backend().tag);
    let p = prompt(5, 20, gm.vocab_size());
    let gid = checkpoint::identity(&dir, "qwen4_exp", &gm.backend()).unwrap();
    let cid = checkpoint::identity(&dir, "qwen4_exp", &cm.backend()).unwrap();
    for (maker_is_gpu, label) in [(true, "GPU → CPU"), (false, "CPU → GPU")] {
        let tmp = tempfile::tempdir().unwrap();
        let (maker_id, reader_id) = if maker_is_gpu {
            (gid.clone(), cid.clone())
        } else {
            (cid.clone(), gid.clone())
        };
        let mut store = CheckpointStore::open(tmp.path(), maker_id.clone(), 1 << 30).unwrap();
        // The saved session covers the prompt and its reply; a recurrent
        // state resumes only at its end, so the next prompt extends it.
        let covered = if maker_is_gpu {
            let mut s = LiveSession::new(&gm);
            turn(&gm, &mut s, &p, 0, 3, 0.0, 64);
            store.save(&s).unwrap();
            s.tokens().to_vec()
        } else {
            let mut s = LiveSession::new(&cm);
            turn(&cm, &mut s, &p, 0, 3, 0.0, 64);
            store.save(&s).unwrap();
            s.tokens().to_vec()
        };
        let mut next = covered;
        next.extend(prompt(6, 4, gm.vocab_size()));
        // The maker finds its own checkpoint again …
        let mut own = CheckpointStore::open(tmp.path(), maker_id, 1 << 30).unwrap();
        assert_eq!(own.entries().len(), 1, "{label}: the maker's own store");
        // … the other backend counts it as foreign and starts cold.
        let mut other = CheckpointStore::open(tmp.path(), reader_id, 1 << 30).unwrap();
        assert_eq!(other.entries().len(), 0, "{label}: loaded across backends");
        assert_eq!(other.foreign_files(), 1, "{label}: not counted");
        let (found, own_found) = if maker_is_gpu {
            (
                other.lookup(&cm, &next).is_some(),
                own.lookup(&gm, &next).is_some(),
            )
        } else {
            (
                other.lookup(&gm, &next).is_some(),
                own.lookup(&cm, &next).is_some(),
            )
        };
        assert!(!found, "{label}: a foreign checkpoint was used");
        assert!(own_found, "{label}: the maker's lookup");
        println!("REPORT e2e=checkpoint {label}: refused (foreign), served cold");
    }
}

/// One decode session's logits bits: a 5-token prefill, single steps, then
/// verify windows of 2..=4 rows (every row), a snapshot, a step, a
/// restore, a truncate and a window from there.
fn step_session(m: &LlamaModel<ds4_engine::backend::CudaOps>, v: usize) -> Vec<Vec<u32>> {
    let toks = prompt(77, 120, v);
    let mut out = Vec::new();
    let mut s = m.new_state();
    out.push(rows_bits(m, &mut s, &toks[..5]));
    let (mut at, mut rows) = (5, 1);
    while at + rows <= 118 {
        let w = &toks[at..at + rows];
        let mode = if rows == 1 {
            LogitsRows::Last
        } else {
            LogitsRows::All
        };
        let (o, h) = m.forward_hidden(w, &mut s, mode).unwrap();
        out.push(bits(&o.logits));
        out.push(bits(&m.ops().download(h.buf()).unwrap()));
        at += rows;
        rows = if at < 60 { 1 } else { rows % 4 + 1 };
    }
    let snap = s.snapshot();
    out.push(bits(
        &m.forward(&toks[..1], &mut s, LogitsRows::Last)
            .unwrap()
            .logits,
    ));
    s.restore(&snap).unwrap();
    out.push(bits(
        &m.forward(&toks[3..4], &mut s, LogitsRows::Last)
            .unwrap()
            .logits,
    ));
    s.truncate(40).unwrap();
    out.push(bits(
        &m.forward(&toks[7..10], &mut s, LogitsRows::All)
            .unwrap()
            .logits,
    ));
    out.push(bits(
        &m.forward(&toks[10..11], &mut s, LogitsRows::Last)
            .unwrap()
            .logits,
    ));
    out
}

/// Decode steps and verify windows replayed as CUDA graphs give the eager
/// launches' bits: over many steps (the caches cross their growth points,
/// each a new capture), windows of 2..=4 rows, snapshot / restore /
/// truncate between replays; and the exactness suite (one forward ==
/// chunks == steps, warm == cold) with graphs on.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_llama_graph_steps_equal_eager() {
    let g = gpu();
    for variant in ["f32_untied", "rope_llama3"] {
        let dir = fixtures().join("llama/tiny").join(variant);
        let gm = LlamaModel::load_hf(&dir, g.clone()).unwrap();
        let v = gm.vocab_size();
        g.set_graphs(false);
        let eager = step_session(&gm, v);
        g.set_graphs(true);
        let (c0, r0) = g.graph_counts();
        let graphs = step_session(&gm, v);
        let (c1, r1) = g.graph_counts();
        assert!(g.graphs(), "{variant}: no capture may fail");
        assert_eq!(graphs.len(), eager.len());
        for (i, (a, b)) in graphs.iter().zip(&eager).enumerate() {
            assert!(a == b, "{variant}: graph step {i} differs from eager");
        }
        assert!(r1 - r0 > 50, "{variant}: {} replays", r1 - r0);
        assert!(c1 - c0 >= 5, "{variant}: {} captures", c1 - c0);
        println!(
            "REPORT e2e=llama {variant} graphs==eager over {} outputs ({} captures, {} replays)",
            eager.len(),
            c1 - c0,
            r1 - r0
        );
        if variant == "f32_untied" {
            exactness("llama f32_untied (graphs)", &gm);
        }
    }
}

/// A session of any model: a 6-token prefill, then single steps and
/// windows of 2–4 rows, every forward's logits as bits.
fn window_session<M: Model>(gm: &M) -> Vec<Vec<u32>> {
    let toks = prompt(78, 80, gm.vocab_size());
    let mut s = gm.new_state();
    let mut out = vec![bits(
        &gm.forward(&toks[..6], &mut s, LogitsRows::All)
            .unwrap()
            .logits,
    )];
    let (mut at, mut rows) = (6, 1);
    while at + rows <= 78 {
        let mode = if rows == 1 {
            LogitsRows::Last
        } else {
            LogitsRows::All
        };
        let o = gm.forward(&toks[at..at + rows], &mut s, mode).unwrap();
        out.push(bits(&o.logits));
        at += rows;
        rows = if at < 30 { 1 } else { rows % 4 + 1 };
    }
    out
}

/// Programmatic dependent launch (a kernel launched while the one before
/// it runs, waiting at its entry) changes no bit: qwen4_exp and llama
/// sessions under every mode, eager and as graphs, against PDL off and
/// eager.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_dependent_launch_changes_no_bit() {
    let g = gpu();
    let qm = Qwen4ExpModel::load(&fixtures().join("qwen4_exp").join("tiny_a"), g.clone()).unwrap();
    let lm = LlamaModel::load_hf(&fixtures().join("llama/tiny/f32_untied"), g.clone()).unwrap();
    let before = g.dependent_launch();
    g.set_dependent_launch(Pdl::All);
    let supported = g.dependent_launch() == Pdl::All;
    let mut runs = Vec::new();
    for mode in [Pdl::Off, Pdl::Captures, Pdl::All] {
        g.set_dependent_launch(mode);
        for graphs in [false, true] {
            // Off then on drops the steps captured under another mode.
            g.set_graphs(false);
            g.set_graphs(graphs);
            let q = window_session(&qm);
            let l = step_session(&lm, lm.vocab_size());
            runs.push((mode, graphs, q, l));
        }
    }
    g.set_dependent_launch(before);
    g.set_graphs(true);
    let (_, _, q0, l0) = &runs[0];
    for (mode, graphs, q, l) in &runs[1..] {
        assert!(q == q0, "qwen4_exp, {mode:?}, graphs {graphs}: bits differ");
        assert!(l == l0, "llama, {mode:?}, graphs {graphs}: bits differ");
    }
    println!(
        "REPORT e2e=dependent_launch supported={supported} identical over {} qwen4_exp and {} llama forwards × 6 runs",
        q0.len(),
        l0.len()
    );
}

/// A model's pure units (replayed graphs) give the eager forward's bits
/// over [`window_session`] (single steps and windows of 2–4 rows), graphs
/// off then on, every logit compared; they were captured and replayed.
fn pure_units_equal_eager<M: Model>(what: &str, g: &CudaOps, gm: &M) {
    g.set_graphs(false);
    let eager = window_session(gm);
    g.set_graphs(true);
    let (c0, r0) = g.graph_counts();
    let graphs = window_session(gm);
    let (c1, r1) = g.graph_counts();
    assert!(g.graphs(), "{what}: no capture may fail");
    assert_eq!(graphs.len(), eager.len());
    for (i, (a, b)) in graphs.iter().zip(&eager).enumerate() {
        assert!(
            a == b,
            "{what}: forward {i}: replayed units differ from eager"
        );
    }
    assert!(r1 - r0 > 100, "{what}: {} replays", r1 - r0);
    assert!(c1 - c0 >= 4, "{what}: {} captures", c1 - c0);
    println!(
        "REPORT e2e={what} pure units == eager over {} forwards ({} captures, {} replays)",
        eager.len(),
        c1 - c0,
        r1 - r0
    );
}

/// qwen4_exp's pure units: each layer's MoE half replayed as a graph for
/// decode steps and verify windows (`Backend::run_pure`).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_qwen4_exp_pure_units_equal_eager() {
    let g = gpu();
    let dir = fixtures().join("qwen4_exp").join("tiny_a");
    let gm = Qwen4ExpModel::load(&dir, g.clone()).unwrap();
    pure_units_equal_eager("qwen4_exp tiny_a", &g, &gm);
}

/// DeepSeek-V4's pure units (each layer's attention input and its
/// combine + MoE half; hash layers keep their MoE eager), on both tiny
/// fixtures.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_deepseek_v4_pure_units_equal_eager() {
    let g = gpu();
    for name in ["tiny_a", "tiny_b"] {
        let dir = fixtures().join("deepseek_v4").join(name);
        let gm = DeepseekV4Model::load(&dir, g.clone()).unwrap();
        pure_units_equal_eager(&format!("deepseek_v4 {name}"), &g, &gm);
    }
}

/// GLM-5's pure units (each layer's mixer input and its combine + FFN
/// half, KDA and MLA layers, dense and sparse FFNs alike).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_glm5_next_pure_units_equal_eager() {
    let g = gpu();
    let dir = fixtures().join("glm5_next").join("tiny_a");
    let gm = Glm5NextModel::load(&dir, g.clone()).unwrap();
    pure_units_equal_eager("glm5_next tiny_a", &g, &gm);
}

/// Continuous batching on the GPU: four concurrent turns through one
/// `BatchingModel` (their forwards as eager batches, where a turn alone
/// replays step graphs) give each session the tokens and logprobs of its
/// turn alone, and batches of two or more ran. Every family has a batched
/// pass of its own (shared row-wise work, per-session attention and
/// recurrent state). With an MTP head the same turns run again at depth 2:
/// their prefills and verify windows share the batches (windows with
/// their hidden rows and records), with every bit as alone.
fn batched_sessions_equal_solo<M: Model + Sync>(what: &str, m: &M)
where
    M::State: Send,
{
    use ds4_engine::batching::{BatchConfig, BatchingModel};
    let v = m.vocab_size();
    let long = 90.min(m.context_length().saturating_sub(32));
    let jobs: Vec<(Vec<u32>, f64, usize)> = vec![
        (prompt(1, 12, v), 0.0, 20),
        (prompt(2, long, v), 0.8, 10),
        (prompt(3, 5, v), 0.8, 24),
        (prompt(4, 40.min(long), v), 1.0, 6),
    ];
    let depths: &[usize] = if m.mtp_contract().is_some() {
        &[0, 2]
    } else {
        &[0]
    };
    for &depth in depths {
        let solo: Vec<_> = jobs
            .iter()
            .map(|(p, t, n)| turn(m, &mut LiveSession::new(m), p, depth, *n, *t, 16))
            .collect();
        let bm = BatchingModel::new(
            m,
            BatchConfig {
                max_tokens: 64,
                gather: std::time::Duration::from_millis(2),
            },
        );
        let ready = std::sync::Barrier::new(jobs.len());
        let together: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = jobs
                .iter()
                .map(|(p, t, n)| {
                    let (bm, ready) = (bm.clone(), &ready);
                    s.spawn(move || {
                        // All join before any forwards (see tests/batching.rs).
                        let _turn = bm.join();
                        ready.wait();
                        turn(&bm, &mut LiveSession::new(&bm), p, depth, *n, *t, 16)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, (a, b)) in together.iter().zip(&solo).enumerate() {
            assert_eq!(a.0, b.0, "{what}: MTP depth {depth}: session {i}: tokens");
            assert_eq!(a.1, b.1, "{what}: MTP depth {depth}: session {i}: logprobs");
        }
        let st = bm.stats();
        println!(
            "REPORT batching {what} mtp_depth={depth} batches={} forwards={} largest={} \
             shared_mtp={}",
            st.batches, st.forwards, st.largest, st.shared_mtp
        );
        assert!(st.largest >= 2, "{what}: {st:?}");
        if depth > 0 {
            assert!(
                st.shared_mtp > 0,
                "{what}: no MTP window shared a batch: {st:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_llama_batched_sessions_equal_solo() {
    let m = LlamaModel::load_hf(&fixtures().join("llama/tiny/f32_untied"), gpu()).unwrap();
    batched_sessions_equal_solo("llama", &m);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_deepseek_v4_batched_sessions_equal_solo() {
    for name in ["tiny_a", "tiny_b"] {
        let m = DeepseekV4Model::load(&fixtures().join("deepseek_v4").join(name), gpu()).unwrap();
        batched_sessions_equal_solo(&format!("deepseek_v4 {name}"), &m);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_qwen4_exp_batched_sessions_equal_solo() {
    let m = Qwen4ExpModel::load(&fixtures().join("qwen4_exp").join("tiny_a"), gpu()).unwrap();
    batched_sessions_equal_solo("qwen4_exp tiny_a", &m);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_glm5_next_batched_sessions_equal_solo() {
    for name in ["tiny_a", "tiny_b"] {
        let m = Glm5NextModel::load(&fixtures().join("glm5_next").join(name), gpu()).unwrap();
        batched_sessions_equal_solo(&format!("glm5_next {name}"), &m);
    }
}
