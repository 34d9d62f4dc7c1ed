//! Pinned bits: the exact logits, MTP rows and checkpoint files the engine
//! produced before the op-inventory refactor, reproduced bit for bit.
//!
//! For the default model and every tiny `qwen4_exp`, `deepseek_v4` and `glm5_next` fixture, one fixed
//! prompt is run as one forward, as uneven chunks and as single steps (all
//! logits rows), plus (qwen4_exp) the MTP head over the trunk's hidden, a
//! verify window with a commit of a prefix, and a seeded MTP turn whose
//! session is written as a checkpoint file. Each logits row, hidden block
//! and file is recorded as an FNV-1a-64 hash of its bytes (plus the first
//! values, to make a failure readable) in
//! `tests/fixtures/bits/{case}.{kernels}.txt`.
//!
//! The default model's bits depend on the CPU kernel set (AVX2 or AVX-512
//! block matmul), so it has one file per set; a set the machine cannot run
//! is skipped. Regenerate (only when a change is *meant* to change bits, and
//! say so in the commit): `DS4_BLESS_BITS=1 cargo nextest run --release -E
//! 'test(/pinned_bits/)'`, once per kernel set (`DS4_CPU_KERNELS=avx2` for
//! the baseline).

use std::collections::BTreeMap;
use std::path::PathBuf;

use ds4_engine::decode::{self, Flow, LiveSession, TurnConfig, TurnRequest, on_tokens};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::llama::load_llama;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::state::checkpoint::format;
use ds4_engine::state::checkpoint::{Identity, STATE_FORMAT_VERSION, fnv_hex};
use ds4_engine::table::{NamedTensor, TensorData};
use ds4_engine::{ForwardOutput, HiddenRows, LogitsRows, Model, ModelState};
use ds4_sampling::Sampler;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The kernel set this process runs (`DS4_CPU_KERNELS` chooses).
fn kernels() -> String {
    format!("{:?}", ds4_engine::backend::cpu::block_matmul::isa()).to_lowercase()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn table_bytes(t: &NamedTensor) -> Vec<u8> {
    match &t.data {
        TensorData::F32(v) => f32_bytes(v),
        TensorData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// What one case produced: name → "hash first-values".
#[derive(Default)]
struct Record(BTreeMap<String, String>);

impl Record {
    fn values(&mut self, name: impl Into<String>, v: &[f32]) {
        let head: Vec<String> = v.iter().take(3).map(|x| format!("{x:e}")).collect();
        self.0.insert(
            name.into(),
            format!("{} {}", fnv_hex(&f32_bytes(v)), head.join(",")),
        );
    }

    fn rows(&mut self, name: &str, out: &ForwardOutput, first: usize) {
        for r in 0..out.rows {
            self.values(format!("{name}.row{:03}", first + r), out.row(r));
        }
    }

    fn bytes(&mut self, name: &str, b: &[u8]) {
        self.0.insert(name.into(), fnv_hex(b));
    }

    fn text(&self) -> String {
        self.0.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
    }

    /// Compare with (or, under `DS4_BLESS_BITS=1`, write) the fixture.
    fn check(&self, case: &str) {
        let path = fixtures().join("bits").join(format!("{case}.txt"));
        if std::env::var("DS4_BLESS_BITS").is_ok_and(|v| v == "1") {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, self.text()).unwrap();
            return;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (bless with DS4_BLESS_BITS=1)", path.display()));
        let want: BTreeMap<&str, &str> = want.lines().filter_map(|l| l.split_once(' ')).collect();
        let got: BTreeMap<&str, &str> = self.0.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let diff: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k}: want {v}, got {:?}", got.get(k)))
            .take(8)
            .collect();
        assert!(
            diff.is_empty(),
            "{case}: bits changed:\n{}",
            diff.join("\n")
        );
        assert_eq!(want.len(), got.len(), "{case}: a different set of entries");
    }
}

const CHUNKS: [usize; 3] = [5, 16, 27];

/// One forward, uneven chunks and single steps over `prompt`.
fn trunk<M: Model>(model: &M, prompt: &[u32], rec: &mut Record) {
    let mut s = model.new_state();
    let out = model.forward(prompt, &mut s, LogitsRows::All).unwrap();
    rec.rows("forward", &out, 0);
    let mut s = model.new_state();
    let mut at = 0;
    for (i, &n) in CHUNKS.iter().enumerate() {
        let out = model
            .forward(&prompt[at..at + n], &mut s, LogitsRows::All)
            .unwrap();
        rec.rows(&format!("chunk{i}"), &out, at);
        at += n;
    }
    assert_eq!(at, prompt.len());
    let mut s = model.new_state();
    for (i, &t) in prompt.iter().enumerate() {
        let out = model.forward(&[t], &mut s, LogitsRows::All).unwrap();
        rec.rows("step", &out, i);
    }
}

fn prompt(vocab: usize) -> Vec<u32> {
    let n: usize = CHUNKS.iter().sum();
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % (vocab as u64 - 3)) as u32 + 3)
        .collect()
}

fn identity(family: &str) -> Identity {
    Identity {
        model: "pinned".into(),
        tokenizer: "pinned".into(),
        family: family.into(),
        state_version: STATE_FORMAT_VERSION,
    }
}

/// A seeded turn (MTP when `depth` is set) and its session as a checkpoint
/// file: the tokens, the state tables and the file bytes.
fn turn_and_checkpoint<M: Model>(
    model: &M,
    prompt: &[u32],
    depth: Option<usize>,
    rec: &mut Record,
) {
    let mut s = LiveSession::new(model);
    let mut sampler = Sampler::new(
        model.descriptor().law,
        model.descriptor().sampling_defaults,
        11,
    )
    .unwrap();
    let cfg = TurnConfig {
        max_tokens: 12,
        stop_token_ids: vec![],
        prefill_chunk: 16,
        logprobs: None,
        cancel: Default::default(),
    };
    let mut emitted = Vec::new();
    decode::generate(
        model,
        &mut s,
        TurnRequest {
            prompt,
            sampler: &mut sampler,
            config: cfg.clone(),
            mtp_depth: depth,
        },
        &mut on_tokens(|ev| {
            emitted.push(ev.token);
            Flow::Continue
        }),
    )
    .unwrap();
    let ids: Vec<f32> = emitted.iter().map(|&t| t as f32).collect();
    rec.values("turn.tokens", &ids);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pinned.ckpt");
    format::write(
        &path,
        &identity(model.descriptor().name),
        &s.export().unwrap(),
    )
    .unwrap();
    rec.bytes("turn.checkpoint", &std::fs::read(&path).unwrap());
    for t in s.state().export().unwrap() {
        rec.bytes(&format!("turn.state.{}", t.name), &table_bytes(&t));
    }
}

#[test]
fn pinned_bits_default_model() {
    let path = ds4_models::default_model_path().expect("default model available");
    let model = load_llama(&path).expect("default model loads");
    let p = prompt(model.vocab_size());
    let mut rec = Record::default();
    trunk(&model, &p, &mut rec);
    turn_and_checkpoint(&model, &p, None, &mut rec);
    rec.check(&format!("default_model.{}", kernels()));
}

fn qwen_case(name: &str) {
    let model = Qwen4ExpModel::from_hf_dir(&fixtures().join("qwen4_exp").join(name)).unwrap();
    // qwen4_exp's kernels are compiled for the build baseline: one file for
    // every kernel set.
    family_case(&model, &format!("qwen4_exp_{name}"));
}

fn deepseek_case(name: &str) {
    let model = DeepseekV4Model::from_hf_dir(&fixtures().join("deepseek_v4").join(name)).unwrap();
    family_case(&model, &format!("deepseek_v4_{name}"));
}

fn glm_case(name: &str) {
    let model = Glm5NextModel::from_hf_dir(&fixtures().join("glm5_next").join(name)).unwrap();
    family_case(&model, &format!("glm5_next_{name}"));
}

/// A family written on the op inventory: trunk rows, and (with an MTP
/// head) the head, a verify window, a commit and a seeded MTP turn.
fn family_case<M: Model>(model: &M, case: &str) {
    let p = prompt(model.vocab_size());
    let mut rec = Record::default();
    trunk(model, &p, &mut rec);
    if model.mtp_contract().is_some() {
        // The head over the trunk's hidden of the whole prompt (row t with
        // token t + 1), then a verify window and a commit of two of its rows.
        let mut s = model.new_state();
        let (_, hidden) = model
            .forward_hidden(&p[..p.len() - 4], &mut s, LogitsRows::Last)
            .unwrap();
        let n = p.len() - 5;
        let rows = hidden.narrow(0, n).unwrap();
        let mut h = model.new_mtp_history().unwrap();
        let step = Model::mtp_forward(model, &p[1..=n], &rows, &mut h).unwrap();
        rec.values("mtp.logits", &step.logits);
        rec.values("mtp.hidden", &step.hidden.to_host().unwrap().2);
        let w = Model::forward_window(model, &p[p.len() - 4..], &mut s).unwrap();
        rec.rows("window", &w.logits, p.len() - 4);
        rec.values("window.hidden", &w.hidden.to_host().unwrap().2);
        ModelState::commit(&mut s, &w.record, 2).unwrap();
        for t in s.export().unwrap() {
            rec.bytes(&format!("commit.state.{}", t.name), &table_bytes(&t));
        }
        turn_and_checkpoint(model, &p, Some(3), &mut rec);
    } else {
        turn_and_checkpoint(model, &p, None, &mut rec);
    }
    rec.check(case);
}

#[test]
fn pinned_bits_qwen4_exp_tiny_a() {
    qwen_case("tiny_a");
}

#[test]
fn pinned_bits_qwen4_exp_tiny_b() {
    qwen_case("tiny_b");
}

#[test]
fn pinned_bits_qwen4_exp_tiny_bf16() {
    qwen_case("tiny_bf16");
}

#[test]
fn pinned_bits_deepseek_v4_tiny_a() {
    deepseek_case("tiny_a");
}

#[test]
fn pinned_bits_deepseek_v4_tiny_b() {
    deepseek_case("tiny_b");
}

#[test]
fn pinned_bits_glm5_next_tiny_a() {
    glm_case("tiny_a");
}

#[test]
fn pinned_bits_glm5_next_tiny_b() {
    glm_case("tiny_b");
}
