//! The pinned-bits records (`pinned_bits.rs`, `fast_kernels.rs`): logits
//! rows, hidden blocks and files as hashes, compared with (or blessed into)
//! `tests/fixtures/bits/{case}.txt`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use ds4_engine::decode::{self, Flow, LiveSession, TurnConfig, TurnRequest, on_tokens};
use ds4_engine::state::checkpoint::format;
use ds4_engine::state::checkpoint::{Identity, STATE_FORMAT_VERSION, fnv_hex};
use ds4_engine::table::{NamedTensor, TensorData};
use ds4_engine::{ForwardOutput, LogitsRows, Model, ModelState};
use ds4_sampling::Sampler;

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The CPU kernel set this process runs (`DS4_CPU_KERNELS` picks the ISA,
/// `DS4_KERNELS` the precision): `avx512`, `avx2-fast`, …
pub fn kernels() -> String {
    use ds4_engine::backend::Backend;
    ds4_engine::backend::CpuOps.id().kernels
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn table_bytes(t: &NamedTensor) -> Vec<u8> {
    match &t.data {
        TensorData::F32(v) => f32_bytes(v),
        TensorData::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// What one case produced: name → "hash first-values".
#[derive(Default)]
pub struct Record(pub BTreeMap<String, String>);

impl Record {
    pub fn values(&mut self, name: impl Into<String>, v: &[f32]) {
        let head: Vec<String> = v.iter().take(3).map(|x| format!("{x:e}")).collect();
        self.0.insert(
            name.into(),
            format!("{} {}", fnv_hex(&f32_bytes(v)), head.join(",")),
        );
    }

    pub fn rows(&mut self, name: &str, out: &ForwardOutput, first: usize) {
        for r in 0..out.rows {
            self.values(format!("{name}.row{:03}", first + r), out.row(r));
        }
    }

    pub fn bytes(&mut self, name: &str, b: &[u8]) {
        self.0.insert(name.into(), fnv_hex(b));
    }

    pub fn text(&self) -> String {
        self.0.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
    }

    /// Compare with (or, under `DS4_BLESS_BITS=1`, write) the fixture.
    pub fn check(&self, case: &str) {
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

pub const CHUNKS: [usize; 3] = [5, 16, 27];

/// One forward, uneven chunks and single steps over `prompt`.
pub fn trunk<M: Model>(model: &M, prompt: &[u32], rec: &mut Record) {
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

pub fn prompt(vocab: usize) -> Vec<u32> {
    let n: usize = CHUNKS.iter().sum();
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % (vocab as u64 - 3)) as u32 + 3)
        .collect()
}

pub fn identity(family: &str) -> Identity {
    Identity {
        model: "pinned".into(),
        tokenizer: "pinned".into(),
        family: family.into(),
        state_version: STATE_FORMAT_VERSION,
    }
}

/// A seeded turn (MTP when `depth` is set) and its session as a checkpoint
/// file: the tokens, the state tables and the file bytes.
pub fn turn_and_checkpoint<M: Model>(
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
