//! DeepSeek-V4 against transformers 5.24 (`tools/oracle/deepseek_v4`): two
//! tiny random checkpoints (transformers' saved names with explicit layer
//! types, f32, 300 tokens; upstream names with the legacy config forms,
//! bf16, 96 tokens over six HCA blocks), logits at every position of a full
//! forward, a chunked prefill, prefill + single steps and a verify window;
//! per-layer streams; CSA indexer selections (as sets; the oracle asserts a
//! clear top-k boundary); MTP draft logits at depth 1..3 against a head
//! composed from transformers' own layer classes.
//!
//! Tolerance 1e-4 absolute (logits of magnitude ~3): both sides run f32 in
//! different orders; observed differences are printed and are ~1e-6. A
//! mis-wired part (a missing inverse rotation, a wrong overlap slot, a sink
//! that adds value) moves logits by 1e-1 or more.

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use common::{Reference, max_abs_diff};
use ds4_engine::families::deepseek_v4::{DeepseekV4Model, DeepseekV4State};
use ds4_engine::{LogitsRows, Model, ModelState};

const TOL: f32 = 1e-4;
const BACK: usize = 10;
const WINDOW: usize = 4;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/deepseek_v4")
}

fn load(name: &str) -> (DeepseekV4Model, Reference) {
    let m =
        DeepseekV4Model::from_hf_dir(&dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = Reference::open(&dir().join(format!("{name}.ref.safetensors")));
    (m, r)
}

fn check(name: &str, what: &str, ours: &[f32], want: &[f32]) {
    let d = max_abs_diff(ours, want);
    println!("{name} {what}: max |Δ| = {d:.3e}");
    assert!(d < TOL, "{name} {what}: max |Δ| = {d}");
}

fn full_forward_and_selections(name: &str) {
    let (m, r) = load(name);
    let ids = r.ids("input_ids");
    let t = ids.len();
    let mut s = m.new_state();
    let out = m.forward_ext(&ids, &mut s, LogitsRows::All, true).unwrap();
    check(
        name,
        "full logits",
        &out.logits.logits,
        &r.f32("logits_full").1,
    );
    let nd = m.config().hc_mult * m.config().hidden_size;
    for (l, tr) in out.trace.iter().enumerate() {
        let key = format!("layer{l}_out_streams");
        if r.has(&key) {
            check(name, &key, &tr.streams, &r.f32(&key).1);
            assert_eq!(tr.streams.len(), t * nd);
        }
        let key = format!("layer{l}_indexer_topk");
        if r.has(&key) {
            let (shape, _) = r.f32(&key);
            let k = shape[1];
            let want: Vec<i64> = r.f32(&key).1.iter().map(|&x| x as i64).collect();
            let ours = tr.selection.as_ref().expect("a CSA layer selects");
            let mut pruned = 0;
            for (i, got) in ours.iter().enumerate() {
                let w: BTreeSet<u32> = want[i * k..(i + 1) * k]
                    .iter()
                    .filter(|&&x| x >= 0)
                    .map(|&x| x as u32)
                    .collect();
                let g: BTreeSet<u32> = got.iter().copied().collect();
                assert_eq!(g, w, "{name} layer {l} query {i}: selection differs");
                let visible = (i + 1) / m.config().csa_rate;
                pruned += visible - g.len();
            }
            assert!(pruned > 0, "{name} layer {l}: the indexer pruned nothing");
            println!("{name} layer {l}: selections identical, {pruned} visible entries pruned");
        }
    }
    // Every routed expert is used somewhere (MoE routes to several).
    let used: BTreeSet<usize> = out
        .trace
        .iter()
        .flat_map(|t| t.experts.iter().copied())
        .collect();
    assert_eq!(used.len(), m.config().n_routed_experts);
}

fn chunked_stepped_window(name: &str) {
    let (m, r) = load(name);
    let ids = r.ids("input_ids");
    let t = ids.len();
    let v = m.vocab_size();
    // Chunked prefill, every row.
    let chunks = r.ids("chunks");
    let mut s = m.new_state();
    let mut rows = Vec::new();
    let mut at = 0;
    for &n in &chunks {
        let n = n as usize;
        rows.extend(
            m.forward(&ids[at..at + n], &mut s, LogitsRows::All)
                .unwrap()
                .logits,
        );
        at += n;
    }
    check(name, "chunked logits", &rows, &r.f32("logits_chunked").1);
    // Prefill then single steps.
    let mut s = m.new_state();
    let pre = m
        .forward(&ids[..t - BACK], &mut s, LogitsRows::Last)
        .unwrap();
    let mut steps = pre.last_row().to_vec();
    for &tok in &ids[t - BACK..] {
        steps.extend(m.forward(&[tok], &mut s, LogitsRows::Last).unwrap().logits);
    }
    check(name, "stepped logits", &steps, &r.f32("logits_steps").1);
    assert_eq!(steps.len(), (BACK + 1) * v);
    // A verify window after a prefix, then a commit of a shorter prefix
    // equals the shorter forward.
    let mut s = m.new_state();
    m.forward(&ids[..t - BACK], &mut s, LogitsRows::Last)
        .unwrap();
    let base = s.snapshot();
    let w = m
        .forward_window(&ids[t - BACK..t - BACK + WINDOW], &mut s)
        .unwrap();
    check(
        name,
        "window logits",
        &w.logits.logits,
        &r.f32("logits_window").1,
    );
    s.commit(&w.record, 2).unwrap();
    let mut short = base.snapshot();
    m.forward(&ids[t - BACK..t - BACK + 2], &mut short, LogitsRows::Last)
        .unwrap();
    assert!(
        s == short,
        "{name}: commit of 2 rows differs from a 2-row forward"
    );
}

fn mtp_depths(name: &str) {
    let (m, r) = load(name);
    let ids = r.ids("input_ids");
    let t = ids.len();
    let prefill = t - BACK;
    let mut s = m.new_state();
    let out = m
        .forward_ext(&ids, &mut s, LogitsRows::Last, false)
        .unwrap();
    let nd = m.config().hc_mult * m.config().hidden_size;
    let streams = out.streams;
    let mut h = m.new_mtp_state().expect("the fixture has an MTP head");
    let (lp, _) = m
        .mtp_forward(
            &ids[1..prefill + 1],
            &streams[..prefill * nd].to_vec(),
            &mut h,
            LogitsRows::All,
        )
        .unwrap();
    check(
        name,
        "mtp teacher-forced logits",
        &lp.logits,
        &r.f32("mtp_logits_prefill").1,
    );
    let mut x = streams[prefill * nd..(prefill + 1) * nd].to_vec();
    let mut chain = Vec::new();
    for d in 0..3 {
        let tok = ids[prefill + 1 + d];
        let (lg, x1) = m.mtp_forward(&[tok], &x, &mut h, LogitsRows::Last).unwrap();
        chain.extend(lg.logits);
        x = x1;
    }
    check(
        name,
        "mtp depth 1..3 logits",
        &chain,
        &r.f32("mtp_logits_chain").1,
    );
}

#[test]
fn tiny_a_full_forward_streams_and_selections() {
    full_forward_and_selections("tiny_a");
}

#[test]
fn tiny_b_full_forward_streams_and_selections() {
    full_forward_and_selections("tiny_b");
}

#[test]
fn tiny_a_chunked_stepped_and_window() {
    chunked_stepped_window("tiny_a");
}

#[test]
fn tiny_b_chunked_stepped_and_window() {
    chunked_stepped_window("tiny_b");
}

#[test]
fn tiny_a_mtp_depths() {
    mtp_depths("tiny_a");
}

#[test]
fn tiny_b_mtp_depths() {
    mtp_depths("tiny_b");
}

/// State bytes stay bounded for the raw rows and grow only with the
/// compressed entries.
#[test]
fn state_is_compressed() {
    let (m, r) = load("tiny_a");
    let ids = r.ids("input_ids");
    let mut s: DeepseekV4State = m.new_state();
    m.forward(&ids, &mut s, LogitsRows::Last).unwrap();
    let c = m.config();
    let plain_kv = ids.len() * c.num_layers * 2 * c.head_dim * 4;
    println!(
        "tiny_a after {} tokens: {} state bytes (a plain KV cache: {plain_kv})",
        ids.len(),
        s.byte_size()
    );
    assert!(s.truncate_floor() > 0 && s.truncate_floor() <= ids.len());
    assert!(s.truncate(s.truncate_floor() - 1).is_err());
}

// ---- strict binding: broken copies of tiny_a ----

mod broken {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    use ds4_engine::EngineError;
    use ds4_engine::families::deepseek_v4::DeepseekV4Model;
    use safetensors::{Dtype, SafeTensors, View};

    struct Raw {
        dtype: Dtype,
        shape: Vec<usize>,
        data: Vec<u8>,
    }

    impl View for &Raw {
        fn dtype(&self) -> Dtype {
            self.dtype
        }
        fn shape(&self) -> &[usize] {
            &self.shape
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            std::borrow::Cow::Borrowed(&self.data)
        }
        fn data_len(&self) -> usize {
            self.data.len()
        }
    }

    /// A copy of tiny_a whose tensor table went through `edit`.
    fn broken(edit: impl FnOnce(&mut BTreeMap<String, Raw>)) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny_a");
        std::fs::create_dir(&dir).unwrap();
        for e in std::fs::read_dir(super::dir().join("tiny_a")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        let file = dir.join("model.safetensors");
        let bytes = std::fs::read(&file).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut map: BTreeMap<String, Raw> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let raw = Raw {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                };
                (n, raw)
            })
            .collect();
        edit(&mut map);
        let out = safetensors::serialize(map.iter().map(|(k, v)| (k.clone(), v)), None).unwrap();
        std::fs::write(&file, out).unwrap();
        (tmp, dir)
    }

    fn err(dir: &Path) -> String {
        match DeepseekV4Model::from_hf_dir(dir) {
            Err(e @ EngineError::Tensor { .. }) => e.to_string(),
            Err(e) => panic!("expected a tensor error, got {e}"),
            Ok(_) => panic!("a broken checkpoint loaded"),
        }
    }

    #[test]
    fn missing_compressor_tensor_is_named() {
        let (_t, dir) = broken(|m| {
            m.remove("model.layers.2.attn.compressor.ape");
        });
        let msg = err(&dir);
        assert!(
            msg.contains("model.layers.2.attn.compressor.ape") && msg.contains("missing"),
            "{msg}"
        );
    }

    #[test]
    fn wrong_shape_names_tensor_and_shapes() {
        let (_t, dir) = broken(|m| {
            let t = m
                .get_mut("model.layers.1.attn.indexer.wq_b.weight")
                .unwrap();
            t.shape = vec![t.shape[1], t.shape[0]];
        });
        let msg = err(&dir);
        assert!(
            msg.contains("model.layers.1.attn.indexer.wq_b.weight"),
            "{msg}"
        );
        assert!(msg.contains("expected [256, 32], found [32, 256]"), "{msg}");
    }

    #[test]
    fn hash_table_out_of_range_is_named() {
        let (_t, dir) = broken(|m| {
            let t = m.get_mut("model.layers.0.ffn.gate.tid2eid").unwrap();
            t.data[..8].copy_from_slice(&99i64.to_le_bytes());
        });
        let msg = err(&dir);
        assert!(
            msg.contains("model.layers.0.ffn.gate.tid2eid") && msg.contains("expert 99"),
            "{msg}"
        );
    }

    #[test]
    fn partial_mtp_head_and_stray_tensors_are_named() {
        let (_t, dir) = broken(|m| {
            m.remove("mtp.0.h_proj.weight");
        });
        let msg = err(&dir);
        assert!(msg.contains("mtp.0.h_proj.weight"), "{msg}");
        let (_t, dir) = broken(|m| {
            let extra = Raw {
                dtype: Dtype::F32,
                shape: vec![1],
                data: vec![0; 4],
            };
            m.insert("model.layers.0.attn.compressor.ape".into(), extra);
        });
        let msg = err(&dir);
        assert!(msg.contains("model.layers.0.attn.compressor.ape"), "{msg}");
    }

    #[test]
    fn bad_config_field_is_named() {
        let (_t, dir) = broken(|_| {});
        let cfg = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg).unwrap();
        std::fs::write(&cfg, text.replace("\"o_groups\": 2", "\"o_groups\": 3")).unwrap();
        match DeepseekV4Model::from_hf_dir(&dir) {
            Err(EngineError::Config { field, .. }) => assert_eq!(field, "o_groups"),
            Err(e) => panic!("expected a config error, got {e}"),
            Ok(_) => panic!("a bad config loaded"),
        }
    }
}
