//! GLM-5.3-Flash (`glm5_next`) against transformers 5.24
//! (`tools/oracle/glm5_next`): two tiny random checkpoints (wrapper / text-only
//! layout, upstream / internal leaf names, per-expert / fused experts, f32 /
//! bf16, bounded / softplus KDA gate, with / without a shared indexer layer),
//! both pruning (T = 40 > index_topk + P − 1).
//!
//! Tolerance 1e-4 absolute on logits (max differences printed): both sides
//! run f32 in a different order (our recurrent KDA scan vs transformers'
//! chunked prefill, absorbed vs expanded MLA, expert sums in slot vs expert
//! order); observed differences are ~1e-6. A mis-wired part (a missing
//! norm weight, the wrong gate form, a wrong pool) moves logits by 1e-2 or
//! more. Indexer selections must be identical: the oracle asserts a clear
//! gap at every pruning top-k boundary.

use std::collections::HashMap;
use std::path::PathBuf;

use ds4_engine::backend::Backend;
use ds4_engine::families::glm5_next::config::{IndexerKind, LayerKind};
use ds4_engine::families::glm5_next::state::state_bytes;
use ds4_engine::families::glm5_next::{Glm5NextModel, Glm5NextState};
use ds4_engine::{EngineError, LogitsRows, Model, ModelState};
use safetensors::{Dtype, SafeTensors};

const TOL: f32 = 1e-4;
const PREFILL: usize = 30;
const FIXTURES: [&str; 2] = ["tiny_a", "tiny_b"];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm5_next")
}

struct Reference(HashMap<String, (Vec<usize>, Vec<f64>)>);

impl Reference {
    fn open(name: &str) -> Self {
        let path = fixtures().join(format!("{name}.ref.safetensors"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let st = SafeTensors::deserialize(&bytes).expect("valid reference file");
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
    /// A `[T, W]` selection with −1 padding, as one list per query.
    fn selection(&self, k: &str) -> Vec<Vec<u32>> {
        let (shape, vals) = &self.0[k];
        vals.chunks_exact(shape[1])
            .map(|row| {
                row.iter()
                    .filter(|&&x| x >= 0.0)
                    .map(|&x| x as u32)
                    .collect()
            })
            .collect()
    }
}

fn load(name: &str) -> Glm5NextModel {
    Glm5NextModel::from_hf_dir(&fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(what: &str, got: &[f32], want: &[f32]) -> f32 {
    let d = max_diff(got, want);
    let mag = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    eprintln!("{what}: max |Δ| = {d:e} (|ref| ≤ {mag:.2})");
    assert!(d <= TOL, "{what}: max |Δ| {d} > {TOL}");
    d
}

#[test]
fn glm5_full_forward_streams_and_selections_match() {
    for name in FIXTURES {
        let model = load(name);
        let r = Reference::open(name);
        let ids = r.ids("input_ids");
        let mut state = model.new_state();
        let out = model
            .forward_ext(&ids, &mut state, LogitsRows::All, true)
            .unwrap();
        check(
            &format!("{name} full logits"),
            &out.logits.logits,
            &r.f32("logits_full"),
        );
        check(
            &format!("{name} final hidden"),
            &Backend::download(model.ops(), &out.hidden).unwrap(),
            &r.f32("hidden_final"),
        );
        assert_eq!(state.len(), ids.len());
        let cfg = model.config();
        let mut compared = 0;
        let mut last_full = None;
        for (l, tr) in out.trace.iter().enumerate() {
            let key = format!("layer{l}_streams");
            if r.has(&key) {
                check(&format!("{name} {key}"), &tr.streams, &r.f32(&key));
            }
            if cfg.layer_kinds[l] != LayerKind::Mla {
                assert!(tr.selection.is_none());
                continue;
            }
            let sel = tr.selection.as_ref().expect("an MLA layer selects");
            // A shared layer attends over its predecessor's selection.
            let src = match cfg.indexer_kinds[l] {
                IndexerKind::Full => l,
                IndexerKind::Shared => last_full.expect("a full layer before"),
            };
            last_full = Some(l);
            let want = r.selection(&format!("layer{src}_selection"));
            assert_eq!(sel, &want, "{name} layer {l}: selection differs");
            // Pruning: a query sees at most index_topk + P − 1 tokens.
            let cap = cfg.index_topk + cfg.index_pool - 1;
            assert!(sel.iter().all(|s| s.len() <= cap));
            let pruned: usize = sel.iter().enumerate().map(|(i, s)| i + 1 - s.len()).sum();
            assert!(pruned > 0, "{name} layer {l} pruned nothing");
            compared += 1;
            eprintln!("{name} layer {l}: selection identical, {pruned} causal pairs pruned");
        }
        assert!(compared >= 2);
    }
}

#[test]
fn glm5_chunked_stepped_and_window_match() {
    for name in FIXTURES {
        let model = load(name);
        let r = Reference::open(name);
        let ids = r.ids("input_ids");
        let mut state = model.new_state();
        let mut got = Vec::new();
        let mut s = 0;
        for n in r.ids("chunks") {
            let n = n as usize;
            got.extend(
                model
                    .forward(&ids[s..s + n], &mut state, LogitsRows::All)
                    .unwrap()
                    .logits,
            );
            s += n;
        }
        check(&format!("{name} chunked"), &got, &r.f32("logits_chunked"));
        let mut state = model.new_state();
        let mut got = model
            .forward(&ids[..PREFILL], &mut state, LogitsRows::Last)
            .unwrap()
            .logits;
        for t in PREFILL..ids.len() {
            got.extend(
                model
                    .forward(&ids[t..t + 1], &mut state, LogitsRows::Last)
                    .unwrap()
                    .logits,
            );
        }
        check(
            &format!("{name} prefill+steps"),
            &got,
            &r.f32("logits_steps"),
        );
        let mut state = model.new_state();
        model
            .forward(&ids[..PREFILL], &mut state, LogitsRows::Last)
            .unwrap();
        let w = model
            .forward_window(&ids[PREFILL..PREFILL + 4], &mut state)
            .unwrap();
        check(
            &format!("{name} verify window"),
            &w.logits.logits,
            &r.f32("logits_window"),
        );
    }
}

/// Committing any prefix of a verify window leaves every cache equal to a
/// teacher-forced run over the same tokens (bit for bit: the same per-row
/// arithmetic), and decoding continues equally.
#[test]
fn glm5_verify_window_commit_equals_teacher_forced() {
    for name in FIXTURES {
        let model = load(name);
        let ids = Reference::open(name).ids("input_ids");
        let window = &ids[PREFILL..PREFILL + 4];
        let mut prefix = model.new_state();
        model
            .forward(&ids[..PREFILL], &mut prefix, LogitsRows::Last)
            .unwrap();
        for accepted in 0..=window.len() {
            let mut st = prefix.snapshot();
            let w = model.forward_window(window, &mut st).unwrap();
            st.commit(w.capture.as_ref().unwrap(), accepted).unwrap();
            let mut tf = prefix.snapshot();
            if accepted > 0 {
                model
                    .forward(&window[..accepted], &mut tf, LogitsRows::Last)
                    .unwrap();
            }
            assert_eq!(st.len(), PREFILL + accepted);
            assert!(
                st == tf,
                "{name}: commit of {accepted} differs from teacher forcing"
            );
            let next = &ids[PREFILL + accepted..PREFILL + accepted + 3];
            let a = model.forward(next, &mut st, LogitsRows::All).unwrap();
            let b = model.forward(next, &mut tf, LogitsRows::All).unwrap();
            assert_eq!(a.logits, b.logits);
        }
        // A capture that is not the last forward is refused.
        let mut st = prefix.snapshot();
        let w = model.forward_window(window, &mut st).unwrap();
        model
            .forward(&ids[PREFILL + 4..PREFILL + 5], &mut st, LogitsRows::Last)
            .unwrap();
        assert!(matches!(
            st.commit(w.capture.as_ref().unwrap(), 2),
            Err(EngineError::State(_))
        ));
    }
}

#[test]
fn glm5_snapshot_restore_truncate_export_and_size() {
    let model = load("tiny_b");
    let ids = Reference::open("tiny_b").ids("input_ids");
    let mut st = model.new_state();
    model
        .forward(&ids[..20], &mut st, LogitsRows::Last)
        .unwrap();
    let snap = st.snapshot();
    let a = model
        .forward(&ids[20..30], &mut st, LogitsRows::All)
        .unwrap();
    assert!(st != snap);
    st.restore(&snap);
    assert!(st == snap);
    let b = model
        .forward(&ids[20..30], &mut st, LogitsRows::All)
        .unwrap();
    assert_eq!(a.logits, b.logits, "restore must be exact");
    // KDA layers refuse truncation; the floor is the length.
    assert_eq!(st.truncate_floor(), 30);
    assert!(matches!(st.truncate(10), Err(EngineError::State(_))));
    st.truncate(30).unwrap();
    // Export → import into a fresh state continues identically.
    let mut back: Glm5NextState = model.new_state();
    back.import(st.export().unwrap()).unwrap();
    assert!(back == st);
    let x = model
        .forward(&ids[30..34], &mut st, LogitsRows::All)
        .unwrap();
    let y = model
        .forward(&ids[30..34], &mut back, LogitsRows::All)
        .unwrap();
    assert_eq!(x.logits, y.logits);
    // A table of another model is refused.
    let other = load("tiny_a").new_state();
    let mut fresh = model.new_state();
    assert!(fresh.import(other.export().unwrap()).is_err());
    // Growth per token: latent + indexer keys and gates on full MLA layers,
    // plus a pool key each time a pool completes (34 → 35: no pool).
    let cfg = model.config();
    let before = st.byte_size();
    model
        .forward(&ids[34..35], &mut st, LogitsRows::Last)
        .unwrap();
    let mla = cfg
        .layer_kinds
        .iter()
        .filter(|k| **k == LayerKind::Mla)
        .count();
    let full = (0..cfg.num_layers)
        .filter(|&l| {
            cfg.layer_kinds[l] == LayerKind::Mla && cfg.indexer_kinds[l] == IndexerKind::Full
        })
        .count();
    let per_token = 4 * (mla * cfg.kv_lora_rank + full * 2 * cfg.index_head_dim);
    assert_eq!(st.byte_size() - before, per_token);
    // The size formula used for the real configuration below agrees with
    // the tiny model's actual caches.
    assert_eq!(st.byte_size(), state_bytes(cfg, 35));
}

#[test]
fn glm5_state_bytes_per_1k_tokens_at_the_real_config() {
    let json = serde_json::json!({"model_type": "glm5_next_text"});
    let cfg = ds4_engine::families::glm5_next::Glm5NextConfig::from_hf(
        std::path::Path::new("defaults.json"),
        &json,
    )
    .unwrap();
    let fixed = state_bytes(&cfg, 0);
    let per_1k = state_bytes(&cfg, 1024) - fixed;
    eprintln!(
        "GLM-5.3-Flash: {:.1} MiB fixed (KDA), {:.2} MiB per 1K tokens",
        fixed as f64 / (1 << 20) as f64,
        per_1k as f64 / (1 << 20) as f64
    );
    // 34 KDA layers: 64·128² f32 state + 3 conv rows of 3·8192; 11 MLA
    // layers: a 512 latent, 2·128 indexer values per token, one 128 pool
    // key per 16 tokens.
    assert_eq!(fixed, 34 * 4 * (64 * 128 * 128 + 3 * 3 * 8192));
    assert_eq!(per_1k, 11 * 4 * (1024 * (512 + 256) + 64 * 128));
}

#[test]
fn glm5_mtp_matches_composed_reference() {
    for name in FIXTURES {
        let model = load(name);
        let r = Reference::open(name);
        let ids = r.ids("input_ids");
        let ops = *model.ops();
        let mut st = model.new_state();
        let trunk = model
            .forward_ext(&ids[..PREFILL + 1], &mut st, LogitsRows::Last, false)
            .unwrap();
        let d = model.config().hidden_size;
        let hidden = Backend::download(&ops, &trunk.hidden).unwrap();
        let rows = |first: usize, n: usize| hidden[first * d..(first + n) * d].to_vec();
        let mut mtp = model
            .new_mtp_state()
            .expect("fixture has a NextN layer")
            .unwrap();
        let (out, _) = model
            .mtp_forward(
                &ids[1..PREFILL + 1],
                &rows(0, PREFILL),
                &mut mtp,
                LogitsRows::All,
            )
            .unwrap();
        check(
            &format!("{name} NextN prefill"),
            &out.logits,
            &r.f32("mtp_logits_prefill"),
        );
        let want = r.f32("mtp_logits_chain");
        let v = model.vocab_size();
        let mut x = rows(PREFILL, 1);
        for depth in 0..3 {
            let tok = [ids[PREFILL + 1 + depth]];
            let (out, h) = model
                .mtp_forward(&tok, &x, &mut mtp, LogitsRows::Last)
                .unwrap();
            check(
                &format!("{name} NextN depth {}", depth + 1),
                &out.logits,
                &want[depth * v..(depth + 1) * v],
            );
            x = h;
        }
    }
}
