//! Qwen4-Exp against transformers 5.24 (`tools/oracle/qwen4_exp`): three tiny
//! random checkpoints (text-only / VL prefix, per-expert / fused experts,
//! sharded / single PLE table, tied / untied, f32 / bf16), full logits at
//! every position.
//!
//! Tolerance 1e-4 absolute on logits of magnitude ~2 and streams up to ~10
//! (printed per test): both sides run f32 arithmetic in a different order (candle gemm vs
//! torch, our sequential GDN scan vs transformers' chunked UT-transform
//! prefill, host softmax), each step adding ~1e-7 relative error through a
//! 4–6 layer network; observed differences are ~1e-6. A mis-wired
//! component (a norm without its `1+w`, a swapped query/gate, a wrong QSA
//! block) moves logits by 1e-2 or more. The bf16 reference is the f32
//! forward of the bf16-rounded weights, which is what we compute after
//! upcasting on load. QSA selections must be identical (the oracle asserts a
//! clear top-k boundary gap, so a correct port cannot differ).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use ds4_engine::families::qwen4_exp::{Qwen4ExpModel, Qwen4ExpState};
use ds4_engine::state::table::TensorData;
use ds4_engine::{EngineError, LogitsRows, Model, ModelState};
use safetensors::{Dtype, SafeTensors};

const TOL: f32 = 1e-4;
const PREFILL: usize = 30;
const FIXTURES: [&str; 3] = ["tiny_a", "tiny_b", "tiny_bf16"];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp")
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
    fn f32(&self, k: &str) -> Vec<f32> {
        self.0[k].1.iter().map(|&x| x as f32).collect()
    }
    fn shape(&self, k: &str) -> Vec<usize> {
        self.0[k].0.clone()
    }
    fn ids(&self, k: &str) -> Vec<u32> {
        self.0[k].1.iter().map(|&x| x as u32).collect()
    }
}

fn load(name: &str) -> Qwen4ExpModel {
    Qwen4ExpModel::from_hf_dir(&fixtures().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
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
fn qwen4_full_forward_streams_qsa_and_routing_match() {
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
        assert_eq!(state.len(), ids.len());
        let cfg = model.config();
        let mut qsa_layers = 0;
        for (l, tr) in out.trace.iter().enumerate() {
            let key = format!("layer{l}_out_streams");
            check(&format!("{name} {key}"), &tr.streams, &r.f32(&key));
            // Every expert is used somewhere and tokens spread over several.
            let used: BTreeSet<usize> = tr.routing.experts.iter().copied().collect();
            assert!(used.len() >= 3, "{name} layer {l}: experts {used:?}");
            if let Some(sel) = &tr.qsa {
                qsa_layers += 1;
                let want = r.ids(&format!("layer{l}_qsa_selected"));
                let t = ids.len();
                let mut pruned = 0;
                let mut dropped_diag = 0;
                for (i, keep) in sel.iter().enumerate() {
                    let got: BTreeSet<u32> = keep.iter().copied().collect();
                    let exp: BTreeSet<u32> = (0..t as u32)
                        .filter(|&j| want[i * t + j as usize] == 1)
                        .collect();
                    assert_eq!(
                        got, exp,
                        "{name} layer {l} query {i}: QSA selection differs"
                    );
                    pruned += i + 1 - keep.len();
                    dropped_diag += usize::from(!got.contains(&(i as u32)));
                    assert!(keep.len() < cfg.indexer_budget + cfg.indexer_compress_ratio);
                }
                assert!(pruned > 0, "{name} layer {l}: QSA pruned nothing");
                // Nothing is pruned before a query sees budget + ratio tokens.
                let onset = cfg.indexer_budget + cfg.indexer_compress_ratio;
                let first = sel.iter().enumerate().position(|(i, k)| k.len() < i + 1);
                assert_eq!(
                    first,
                    Some(onset - 1),
                    "{name} layer {l}: first pruned query"
                );
                eprintln!(
                    "{name} layer {l}: QSA identical; {pruned} pairs pruned, diagonal dropped {dropped_diag}×"
                );
            }
        }
        assert!(qsa_layers >= 2);
        // The prompt crosses EOS segments (PLE n-gram context resets).
        assert!(ids.iter().filter(|&&t| Some(t) == cfg.eos_token_id).count() >= 2);
        assert!(!cfg.ple_layer_ids.is_empty());
    }
}

#[test]
fn qwen4_chunked_and_stepwise_match() {
    for name in FIXTURES {
        let model = load(name);
        let r = Reference::open(name);
        let ids = r.ids("input_ids");
        // Uneven chunks through the cache.
        let mut state = model.new_state();
        let mut got = Vec::new();
        let mut s = 0;
        for n in r.ids("chunks") {
            let n = n as usize;
            let out = model
                .forward(&ids[s..s + n], &mut state, LogitsRows::All)
                .unwrap();
            got.extend(out.logits);
            s += n;
        }
        check(&format!("{name} chunked"), &got, &r.f32("logits_chunked"));
        // Prefill then one token at a time.
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
        // A 4-row verify window after the prefix.
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

fn assert_states_close(what: &str, a: &Qwen4ExpState, b: &Qwen4ExpState) -> f32 {
    common::table_max_diff(what, a.export().unwrap(), b.export().unwrap())
}

/// Committing any prefix of a verify window leaves every cache equal to a
/// teacher-forced run over the same tokens, and decoding continues equally.
/// Bound 1e-5, observed exactly 0: the same per-row arithmetic (the
/// kernels are row-independent; the GDN state is replayed through the same
/// scan). `qwen4_rows_are_bit_identical_across_chunkings` asserts the bits.
#[test]
fn qwen4_verify_window_commit_equals_teacher_forced() {
    for name in FIXTURES {
        commit_case(name);
    }
}

fn commit_case(name: &str) {
    let model = load(name);
    let ids = Reference::open(name).ids("input_ids");
    let window = &ids[PREFILL..PREFILL + 4];
    let mut prefix = model.new_state();
    model
        .forward(&ids[..PREFILL], &mut prefix, LogitsRows::Last)
        .unwrap();
    let mut worst = 0f32;
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
        assert_eq!(st.len(), tf.len());
        worst = worst.max(assert_states_close(
            &format!("accepted {accepted}"),
            &st,
            &tf,
        ));
        // Continue both with the true next tokens.
        let next = &ids[PREFILL + accepted..PREFILL + accepted + 3];
        let a = model.forward(next, &mut st, LogitsRows::All).unwrap();
        let b = model.forward(next, &mut tf, LogitsRows::All).unwrap();
        worst = worst.max(max_diff(&a.logits, &b.logits));
    }
    eprintln!("{name} verify commit vs teacher-forced: max |Δ| = {worst:e}");
    assert!(worst <= 1e-5, "{worst}");
    // A capture from another window length is refused.
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

#[test]
fn qwen4_snapshot_restore_truncate_and_size() {
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
    assert_ne!(st.export().unwrap(), snap.export().unwrap());
    st.restore(&snap);
    assert_eq!(st.export().unwrap(), snap.export().unwrap());
    let b = model
        .forward(&ids[20..30], &mut st, LogitsRows::All)
        .unwrap();
    assert_eq!(a.logits, b.logits, "restore must be exact");
    // Recurrent layers refuse truncation; a no-op truncate is fine.
    assert!(matches!(st.truncate(10), Err(EngineError::State(_))));
    st.truncate(30).unwrap();
    assert_eq!(st.len(), 30);
    // Byte size: attention caches grow per token, recurrent states don't.
    let s30 = st.byte_size();
    model
        .forward(&ids[30..31], &mut st, LogitsRows::Last)
        .unwrap();
    let cfg = model.config();
    let attn_layers = cfg
        .layer_kinds
        .iter()
        .filter(|k| **k == ds4_engine::families::qwen4_exp::config::LayerKind::Indexed)
        .count();
    let per_token =
        attn_layers * 4 * (2 * cfg.num_kv_heads * cfg.head_dim + cfg.indexer_head_dim) + 12;
    let delta = st.byte_size() - s30;
    // Position 30 completes no block for ratio 2 (31 tokens), so no block key.
    assert_eq!(delta, per_token, "byte size growth per token");
}

#[test]
fn qwen4_mtp_matches_composed_reference() {
    for name in FIXTURES {
        let model = load(name);
        let r = Reference::open(name);
        let ids = r.ids("input_ids");
        let mut st = model.new_state();
        let trunk = model
            .forward_ext(&ids[..PREFILL + 1], &mut st, LogitsRows::Last, false)
            .unwrap();
        let mut mtp = model.new_mtp_state().expect("fixture has an MTP head");
        let ch = model.config().hc_count * model.config().hidden_size;
        // Teacher-forced prefill: row t = (token t+1, trunk streams t, position t).
        let positions: Vec<u32> = (0..PREFILL as u32).collect();
        let out = model
            .mtp_forward(
                &ids[1..PREFILL + 1],
                &trunk.streams[..PREFILL * ch].to_vec(),
                &positions,
                &mut mtp,
                LogitsRows::All,
            )
            .unwrap();
        let mut worst = check(
            &format!("{name} MTP prefill rows"),
            &out.logits.logits,
            &r.f32("mtp_logits_prefill"),
        );
        // Depths 1..3 from trunk position 30, chaining pre-mixer streams.
        let want = r.f32("mtp_logits_chain");
        let vocab = r.shape("mtp_logits_chain")[1];
        let mut x = trunk.streams[PREFILL * ch..(PREFILL + 1) * ch].to_vec();
        for d in 0..3 {
            let tok = ids[PREFILL + 1 + d];
            let o = model
                .mtp_forward(
                    &[tok],
                    &x,
                    &[(PREFILL + d) as u32],
                    &mut mtp,
                    LogitsRows::Last,
                )
                .unwrap();
            worst = worst.max(check(
                &format!("{name} MTP depth {}", d + 1),
                &o.logits.logits,
                &want[d * vocab..(d + 1) * vocab],
            ));
            x = o.streams;
        }
        assert_eq!(mtp.len(), PREFILL + 3);
        // Rolling back drafted rows is legal for the MTP's attention caches.
        mtp.truncate(PREFILL).unwrap();
        assert_eq!(mtp.len(), PREFILL);
        eprintln!("{name} MTP worst {worst:e}");
    }
}

fn rewrite(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>),
) {
    std::fs::create_dir_all(dst).unwrap();
    std::fs::copy(src.join("config.json"), dst.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

#[test]
fn qwen4_strict_binding_names_missing_and_extra_tensors() {
    let src = fixtures().join("tiny_a");
    let tmp = tempfile::tempdir().unwrap();
    let missing = "model.layers.3.linear_attn.dt_bias";
    let dir = tmp.path().join("missing");
    rewrite(&src, &dir, |t| t.retain(|(n, ..)| n != missing));
    let err = Qwen4ExpModel::from_hf_dir(&dir)
        .err()
        .expect("missing tensor is an error");
    assert!(
        matches!(&err, EngineError::Tensor { tensor, .. } if tensor == missing),
        "{err}"
    );
    let extra = "model.layers.0.linear_attn.surprise";
    let dir = tmp.path().join("extra");
    rewrite(&src, &dir, |t| {
        t.push((extra.into(), Dtype::F32, vec![2], vec![0; 8]))
    });
    let err = Qwen4ExpModel::from_hf_dir(&dir)
        .err()
        .expect("extra tensor is an error");
    assert!(err.to_string().contains(extra), "{err}");
    // A shard of the n-gram table missing: rows no longer match the config.
    let dir = tmp.path().join("shard");
    rewrite(&src, &dir, |t| {
        t.retain(|(n, ..)| !n.ends_with("ngram_embedding.shard_3.weight"))
    });
    let err = Qwen4ExpModel::from_hf_dir(&dir)
        .err()
        .expect("short table is an error");
    assert!(err.to_string().contains("ngram_embedding"), "{err}");
    // The loader picks the family from config.json.
    let loaded = ds4_engine::families::LoadedModel::load(&src).unwrap();
    assert_eq!(loaded.family_name(), "qwen4_exp");
}

#[test]
fn qwen4_rejects_out_of_vocab_tokens_without_touching_state() {
    let model = load("tiny_a");
    let mut st = model.new_state();
    let err = model
        .forward(&[5, 100_000], &mut st, LogitsRows::Last)
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::TokenOutOfRange { token: 100_000, .. }
    ));
    assert!(st.is_empty());
}

/// M-RoPE with distinct (t, h, w) positions (what image tokens carry)
/// against transformers' rotary tables: rotating unit vectors exposes
/// cos/sin per frequency. Bound 1e-5: f32 `sin_cos` of angles up to ~200 rad.
#[test]
fn qwen4_mrope_tables_match_transformers() {
    use ds4_engine::backend::CpuOps;
    use ds4_engine::layers::rope::MRope;
    for name in FIXTURES {
        let model = load(name);
        let cfg = model.config();
        let r = Reference::open(name);
        let pos = r.ids("mrope_positions");
        let (cos, sin) = (r.f32("mrope_cos"), r.f32("mrope_sin"));
        let rd = cfg.rotary_dim;
        assert_eq!(r.shape("mrope_cos"), vec![8, rd]);
        let rope = MRope::new(cfg.rope_theta, rd, cfg.mrope_section);
        let half = rd / 2;
        let mut worst = 0f32;
        let mut distinct = false;
        for p in 0..8 {
            let pp = [pos[p], pos[8 + p], pos[16 + p]];
            distinct |= pp[0] != pp[1] || pp[1] != pp[2];
            let t = rope.tables(&CpuOps, &[pp]).unwrap();
            for i in 0..half {
                // Rotating the unit vector e_i gives (cos, sin) of frequency i.
                let mut x = vec![0f32; rd];
                x[i] = 1.0;
                t.apply(&CpuOps, &mut x, rd).unwrap();
                for (got, want) in [
                    (x[i], cos[p * rd + i]),
                    (x[i + half], sin[p * rd + i]),
                    (x[i], cos[p * rd + half + i]),
                ] {
                    worst = worst.max((got - want).abs());
                }
            }
        }
        assert!(distinct);
        eprintln!("{name} M-RoPE tables: max |Δ| = {worst:e}");
        assert!(worst <= 1e-5, "{name}: {worst}");
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The whole MTP contract in a greedy speculative loop (2 drafts per
/// round): trunk pre-mixer streams feed the head, drafts chain the head's
/// streams, a 3-row verify window is committed at the accepted length and
/// the MTP state is rolled back and refilled with the trunk's rows. The
/// output must equal plain greedy decoding token for token.
#[test]
fn qwen4_mtp_speculative_greedy_equals_plain_greedy() {
    let model = load("tiny_a");
    let prompt = &Reference::open("tiny_a").ids("input_ids")[..20];
    let n_new = 24;

    let mut st = model.new_state();
    let mut plain = vec![argmax(
        model
            .forward(prompt, &mut st, LogitsRows::Last)
            .unwrap()
            .last_row(),
    )];
    while plain.len() < n_new {
        let last = *plain.last().unwrap();
        plain.push(argmax(
            model
                .forward(&[last], &mut st, LogitsRows::Last)
                .unwrap()
                .last_row(),
        ));
    }

    let mut st = model.new_state();
    let trunk = model
        .forward_ext(prompt, &mut st, LogitsRows::Last, false)
        .unwrap();
    let mut out = vec![argmax(trunk.logits.last_row())];
    let mut mtp = model.new_mtp_state().unwrap();
    // MTP row t: token t+1 with trunk streams t at position t.
    let mut tokens: Vec<u32> = prompt[1..].to_vec();
    tokens.push(out[0]);
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut head = model
        .mtp_forward(
            &tokens,
            &trunk.streams,
            &positions,
            &mut mtp,
            LogitsRows::Last,
        )
        .unwrap();
    let mut accepted_drafts = 0;
    let mut seen = BTreeSet::new();
    while out.len() < n_new {
        let base = st.len() as u32; // position of out.last()
        let d1 = argmax(head.logits.last_row());
        let ch = model.config().hc_count * model.config().hidden_size;
        let last_streams = head.streams[head.streams.len() - ch..].to_vec();
        let deep = model
            .mtp_forward(&[d1], &last_streams, &[base], &mut mtp, LogitsRows::Last)
            .unwrap();
        let d2 = argmax(deep.logits.last_row());
        let window = [*out.last().unwrap(), d1, d2];
        let w = model.forward_window(&window, &mut st).unwrap();
        let mut matches = 0;
        for (i, d) in [d1, d2].into_iter().enumerate() {
            if argmax(w.logits.row(i)) != d {
                break;
            }
            matches += 1;
            out.push(d);
        }
        accepted_drafts += matches;
        seen.insert(matches);
        st.commit(w.capture.as_ref().unwrap(), 1 + matches).unwrap();
        let next = argmax(w.logits.row(matches));
        out.push(next);
        // Drop the drafted MTP rows; add the trunk's rows base..=base+matches.
        mtp.truncate(base as usize).unwrap();
        let toks: Vec<u32> = out[out.len() - 1 - matches..].to_vec();
        let pos: Vec<u32> = (base..=base + matches as u32).collect();
        let streams = w.streams[..(matches + 1) * ch].to_vec();
        head = model
            .mtp_forward(&toks, &streams, &pos, &mut mtp, LogitsRows::Last)
            .unwrap();
        assert_eq!(mtp.len(), st.len());
    }
    out.truncate(n_new);
    assert_eq!(out, plain, "speculative greedy must equal plain greedy");
    eprintln!(
        "speculative greedy: {accepted_drafts} drafts accepted over {n_new} tokens; per-round matches {seen:?}"
    );
    // Both a rejected round and an accepted draft happened.
    assert!(seen.contains(&0) && seen.iter().any(|&m| m > 0), "{seen:?}");
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every cache of two states, bit for bit.
fn assert_states_identical(what: &str, a: &Qwen4ExpState, b: &Qwen4ExpState) {
    let (a, b) = (a.export().unwrap(), b.export().unwrap());
    assert_eq!(a.len(), b.len(), "{what}: table sizes");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((&x.name, &x.shape), (&y.name, &y.shape), "{what}");
        match (&x.data, &y.data) {
            (TensorData::F32(p), TensorData::F32(q)) => {
                assert_eq!(bits(p), bits(q), "{what}: {}", x.name)
            }
            (p, q) => assert_eq!(p, q, "{what}: {}", x.name),
        }
    }
}

/// Row independence, the property behind warm == cold: a token's logits,
/// pre-mixer streams and cache entries have the same bits whatever forward
/// it ran in — one 150-token forward, chunks of 1, 2, 3, 8, 9 or 33 rows,
/// or verify windows of 1..=8 rows — and the MTP head's rows likewise. The
/// sequence is long enough for QSA to prune (budget 8 + ratio 4) and has
/// EOS tokens (PLE segments).
#[test]
fn qwen4_rows_are_bit_identical_across_chunkings() {
    for name in FIXTURES {
        let model = load(name);
        let vocab = model.vocab_size() as u32;
        let eos = model.config().eos_token_id.unwrap();
        let len = 150;
        let ids: Vec<u32> = (0..len as u32)
            .map(|i| {
                if i % 37 == 36 {
                    eos
                } else {
                    3 + i.wrapping_mul(2_654_435_761) % (vocab - 3)
                }
            })
            .collect();
        let mut one = model.new_state();
        let whole = model
            .forward_ext(&ids, &mut one, LogitsRows::All, false)
            .unwrap();
        let want = bits(&whole.logits.logits);
        let want_streams = bits(&whole.streams);
        let row = whole.logits.vocab;
        let srow = want_streams.len() / len;
        for chunk in [1, 2, 3, 8, 9, 33] {
            let mut st = model.new_state();
            let (mut got, mut streams) = (Vec::new(), Vec::new());
            for c in ids.chunks(chunk) {
                let out = model
                    .forward_ext(c, &mut st, LogitsRows::All, false)
                    .unwrap();
                got.extend(bits(&out.logits.logits));
                streams.extend(bits(&out.streams));
            }
            assert_eq!(got, want, "{name}: chunks of {chunk}, logits");
            assert_eq!(streams, want_streams, "{name}: chunks of {chunk}, streams");
            assert_states_identical(&format!("{name} chunks of {chunk}"), &st, &one);
        }
        // Verify windows after a 100-token prefix, then commit all rows.
        let base = 100;
        for w in 1..=8 {
            let mut st = model.new_state();
            model
                .forward(&ids[..base], &mut st, LogitsRows::Last)
                .unwrap();
            let out = model.forward_window(&ids[base..base + w], &mut st).unwrap();
            assert_eq!(
                bits(&out.logits.logits),
                want[base * row..(base + w) * row],
                "{name}: verify window of {w}"
            );
            st.commit(out.capture.as_ref().unwrap(), w).unwrap();
            let next = model
                .forward(&ids[base + w..base + w + 1], &mut st, LogitsRows::Last)
                .unwrap();
            assert_eq!(
                bits(&next.logits),
                want[(base + w) * row..(base + w + 1) * row],
                "{name}: after a committed window of {w}"
            );
        }
        // The MTP head over the trunk's streams: row t = (token t+1,
        // streams t, position t), in one call or in chunks.
        let n = len - 1;
        let positions: Vec<u32> = (0..n as u32).collect();
        let mtp_rows = |chunk: usize| {
            let mut mtp = model.new_mtp_state().expect("fixture has an MTP head");
            let mut got = Vec::new();
            let mut s = 0;
            while s < n {
                let e = (s + chunk).min(n);
                let out = model
                    .mtp_forward(
                        &ids[s + 1..e + 1],
                        &whole.streams[s * srow..e * srow].to_vec(),
                        &positions[s..e],
                        &mut mtp,
                        LogitsRows::All,
                    )
                    .unwrap();
                got.extend(bits(&out.logits.logits));
                got.extend(bits(&out.streams));
                s = e;
            }
            got
        };
        // Logits and streams are interleaved per call: compare per row.
        let per_row = |v: Vec<u32>, chunk: usize| {
            let mut rows = Vec::new();
            let mut s = 0;
            let mut off = 0;
            while s < n {
                let m = chunk.min(n - s);
                for r in 0..m {
                    let mut one = v[off + r * row..off + (r + 1) * row].to_vec();
                    let so = off + m * row + r * srow;
                    one.extend_from_slice(&v[so..so + srow]);
                    rows.push(one);
                }
                off += m * (row + srow);
                s += m;
            }
            rows
        };
        let want_mtp = per_row(mtp_rows(n), n);
        for chunk in [1, 2, 3, 8, 9, 33] {
            assert_eq!(
                per_row(mtp_rows(chunk), chunk),
                want_mtp,
                "{name}: MTP rows in chunks of {chunk}"
            );
        }
    }
}
