//! Stored weight types from safetensors, end to end, for the three Flash
//! families (`tools/oracle/quant_safetensors`): each tiny checkpoint in the
//! form its release ships —
//!
//! * `deepseek_v4_fp8_fp4`: FP8 E4M3 linears with E8M0 `.scale` per 128×128
//!   block, routed experts as FP4 E2M1 pairs in `I8` with an E8M0 `.scale`
//!   per 32 inputs, BF16 / F32 elsewhere, upstream names;
//! * `glm5_next_fp8`: FP8 E4M3 linears with f32 `weight_scale_inv` blocks
//!   (transformers' naming), BF16 elsewhere;
//! * `qwen4_exp_bf16`: BF16 everywhere —
//!
//! beside a twin (`<family>_f32`) with the same config whose weights are the
//! f32 values the stored form dequantizes to (computed by torch). The CPU
//! reference product dequantizes rows exactly and runs the f32 kernel, so
//! the two loads must give the same logits bit for bit: one shot, in chunks
//! of 3 and as single steps; and they must differ from the unquantized
//! checkpoint's (the quantization is real). Greedy MTP equals AR on the
//! stored models; the loader keeps the stored types (file dtypes, the host
//! weights it reads and their values, the backend matrices and expert
//! stacks it places); FP4 experts load the same from `I8` pairs or
//! safetensors' `F4`; broken files (a missing scale, a scale grid of the
//! wrong shape, an FP4 weight of the wrong packed shape) are refused naming
//! the tensor. The tiny dims are not multiples of 128, so every FP8 grid has
//! partial edge blocks (⌈out/128⌉ × ⌈in/128⌉, as the release's `Linear`
//! sizes them). Release build: under a second in all; debug: the DeepSeek
//! logits test (300 tokens three ways, two models) takes ~18 s.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::Reference;
use ds4_engine::backend::cpu::CpuMatrix;
use ds4_engine::backend::{Backend, CpuOps, HostWeight};
use ds4_engine::decode::{self, FinalState, LiveSession, TurnConfig, TurnRequest};
use ds4_engine::families::LoadedModel;
use ds4_engine::load::binder::WeightSource;
use ds4_engine::load::safetensors::SafetensorsDir;
use ds4_engine::quant::{QuantTensor, WeightType};
use ds4_engine::{EngineError, LogitsRows, Model};
use ds4_sampling::{Sampler, SamplingParams};
use safetensors::{Dtype, SafeTensors, View};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn stored(name: &str) -> PathBuf {
    fixtures().join("stored").join(name)
}

/// One family's pair of directories and the prompt it runs.
struct Case {
    family: &'static str,
    stored: &'static str,
    twin: &'static str,
    /// Tokens: the family's tiny_a reference prompt.
    reference: &'static str,
    /// The f32 checkpoint both were made from (before quantization).
    original: &'static str,
}

const DEEPSEEK: Case = Case {
    family: "deepseek_v4",
    stored: "deepseek_v4_fp8_fp4",
    twin: "deepseek_v4_f32",
    reference: "deepseek_v4/tiny_a.ref.safetensors",
    original: "deepseek_v4/tiny_a",
};
const GLM: Case = Case {
    family: "glm5_next",
    stored: "glm5_next_fp8",
    twin: "glm5_next_f32",
    reference: "glm5_next/tiny_a.ref.safetensors",
    original: "glm5_next/tiny_a",
};
const QWEN: Case = Case {
    family: "qwen4_exp",
    stored: "qwen4_exp_bf16",
    twin: "qwen4_exp_f32",
    reference: "qwen4_exp/tiny_a.ref.safetensors",
    original: "qwen4_exp/tiny_a",
};

impl Case {
    fn tokens(&self) -> Vec<u32> {
        Reference::open(&fixtures().join(self.reference)).ids("input_ids")
    }

    fn load(&self, dir: &str) -> LoadedModel {
        load_path(self.family, &stored(dir))
    }
}

fn load_path(family: &str, dir: &Path) -> LoadedModel {
    let m = LoadedModel::load(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert_eq!(m.family_name(), family, "{}", dir.display());
    m
}

// ---- bit-identical logits ----

/// Logits rows of `ids` fed as `chunk`-token forwards (every row kept).
fn chunked<M: Model>(m: &M, ids: &[u32], chunk: usize) -> Vec<f32> {
    let mut s = m.new_state();
    let mut rows = Vec::with_capacity(ids.len() * m.vocab_size());
    for part in ids.chunks(chunk) {
        rows.extend(m.forward(part, &mut s, LogitsRows::All).unwrap().logits);
    }
    rows
}

/// Panics unless `a` and `b` have the same bits; says where and by how much
/// they differ (largest relative difference) when they do not.
fn assert_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let differ: Vec<usize> = (0..a.len())
        .filter(|&i| a[i].to_bits() != b[i].to_bits())
        .collect();
    if let Some(&first) = differ.first() {
        let rel = differ
            .iter()
            .map(|&i| ((a[i] - b[i]) / b[i].abs().max(f32::MIN_POSITIVE)).abs())
            .fold(0f32, f32::max);
        panic!(
            "{what}: {} of {} logits differ (first at {first}: {} vs {}), max relative difference {rel:e}",
            differ.len(),
            a.len(),
            a[first],
            b[first]
        );
    }
}

fn same_logits<M: Model>(name: &str, a: &M, b: &M, ids: &[u32]) {
    for (what, chunk) in [
        ("one shot", ids.len()),
        ("chunks of 3", 3),
        ("single steps", 1),
    ] {
        let la = chunked(a, ids, chunk);
        let lb = chunked(b, ids, chunk);
        assert_eq!(la.len(), ids.len() * a.vocab_size());
        assert!(
            la.iter().all(|x| x.is_finite()),
            "{name} {what}: non-finite"
        );
        assert_bits(&format!("{name} {what}"), &la, &lb);
        println!(
            "{name} {what}: {} tokens, {} logits bit-identical",
            ids.len(),
            la.len()
        );
    }
}

/// The stored model's logits are not the unquantized checkpoint's: the
/// quantization is real, so a loader that misread the stored bytes (or
/// ignored their scales) could not match the twin by accident. Prints the
/// quantization's effect on the logits.
fn quantization_moves_logits<M: Model>(name: &str, q: &M, original: &M, ids: &[u32]) {
    let a = chunked(q, ids, ids.len());
    let b = chunked(original, ids, ids.len());
    let max = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    println!("{name}: max |logit − unquantized logit| = {d:.3e} (logits up to {max:.2})");
    assert!(d > 0.0, "{name}: quantization changed nothing");
}

fn logits_case(case: &Case) {
    let ids = case.tokens();
    let (a, b) = (case.load(case.stored), case.load(case.twin));
    let o = load_path(case.family, &fixtures().join(case.original));
    match (&a, &b, &o) {
        (LoadedModel::DeepseekV4(a), LoadedModel::DeepseekV4(b), LoadedModel::DeepseekV4(o)) => {
            same_logits(case.stored, &**a, &**b, &ids);
            quantization_moves_logits(case.stored, &**a, &**o, &ids);
        }
        (LoadedModel::Glm5Next(a), LoadedModel::Glm5Next(b), LoadedModel::Glm5Next(o)) => {
            same_logits(case.stored, &**a, &**b, &ids);
            quantization_moves_logits(case.stored, &**a, &**o, &ids);
        }
        (LoadedModel::Qwen4Exp(a), LoadedModel::Qwen4Exp(b), LoadedModel::Qwen4Exp(o)) => {
            same_logits(case.stored, a, b, &ids);
            quantization_moves_logits(case.stored, a, o, &ids);
        }
        _ => panic!("{}: unexpected families", case.stored),
    }
}

#[test]
fn deepseek_v4_fp8_fp4_logits_equal_f32_twin_bit_for_bit() {
    logits_case(&DEEPSEEK);
}

#[test]
fn glm5_next_fp8_logits_equal_f32_twin_bit_for_bit() {
    logits_case(&GLM);
}

#[test]
fn qwen4_exp_bf16_logits_equal_f32_twin_bit_for_bit() {
    logits_case(&QWEN);
}

// ---- greedy MTP == AR on the stored model ----

/// A greedy turn at `depth` (0: AR): emitted tokens and, for MTP, (drafts
/// accepted, drafts made).
fn greedy<M: Model>(
    m: &M,
    session: &mut LiveSession<M>,
    prompt: &[u32],
    depth: usize,
) -> (Vec<u32>, (usize, usize)) {
    let d = m.descriptor();
    let params = SamplingParams {
        temperature: 0.0,
        ..d.sampling_defaults
    };
    let mut sampler = Sampler::new(d.law, params, 0).unwrap();
    let r = decode::generate(
        m,
        session,
        TurnRequest {
            prompt,
            sampler: &mut sampler,
            config: TurnConfig {
                max_tokens: 16,
                stop_token_ids: vec![],
                prefill_chunk: 2048,
                logprobs: None,
                cancel: Default::default(),
            },
            mtp_depth: Some(depth),
        },
        &mut (),
    )
    .unwrap();
    assert_eq!(r.final_state, FinalState::Complete);
    let stats = r
        .mtp
        .map_or((0, 0), |st| (st.accepted_total(), st.drafted_total()));
    (r.tokens, stats)
}

/// Greedy MTP at depths 1..3 emits AR's tokens and ends on AR's logits bit
/// for bit; returns (drafts accepted, drafts made) over every run.
fn mtp_equals_ar<M: Model>(name: &str, m: &M, ids: &[u32]) -> (usize, usize) {
    assert!(
        m.mtp_contract().is_some(),
        "{name}: the fixture has an MTP head"
    );
    let (mut accepted, mut drafted) = (0, 0);
    for (p, len) in [
        (0usize, 9usize),
        (11, 16),
        (30, 5),
        (3, 2),
        (20, 12),
        (7, 25),
    ] {
        let prompt = &ids[p..p + len];
        let mut ar = LiveSession::new(m);
        let (want, _) = greedy(m, &mut ar, prompt, 0);
        for depth in 1..=3 {
            let mut s = LiveSession::new(m);
            let (got, (a, d)) = greedy(m, &mut s, prompt, depth);
            assert_eq!(got, want, "{name} prompt {p}+{len} depth {depth}: tokens");
            assert_eq!(s.tokens(), ar.tokens());
            let (x, y) = (s.last_logits().unwrap(), ar.last_logits().unwrap());
            assert_bits(&format!("{name} depth {depth}: last logits"), x, y);
            accepted += a;
            drafted += d;
        }
    }
    println!("{name}: greedy MTP == AR, {accepted}/{drafted} drafts accepted");
    (accepted, drafted)
}

fn mtp_case(case: &Case) -> (usize, usize) {
    let ids = case.tokens();
    match case.load(case.stored) {
        LoadedModel::DeepseekV4(m) => mtp_equals_ar(case.stored, &*m, &ids),
        LoadedModel::Glm5Next(m) => mtp_equals_ar(case.stored, &*m, &ids),
        LoadedModel::Qwen4Exp(m) => mtp_equals_ar(case.stored, &m, &ids),
        _ => panic!("{}: unexpected family", case.stored),
    }
}

/// tiny_a's DeepSeek MTP head is random (only tiny_b's was distilled), so
/// its drafts are all rejected: this covers the reject-and-correct path.
#[test]
fn deepseek_v4_fp8_fp4_greedy_mtp_equals_ar() {
    let (_, drafted) = mtp_case(&DEEPSEEK);
    assert!(drafted > 0);
}

/// GLM's and Qwen's tiny_a heads draft right sometimes: accept paths too.
#[test]
fn glm5_next_fp8_greedy_mtp_equals_ar() {
    let (accepted, drafted) = mtp_case(&GLM);
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
}

#[test]
fn qwen4_exp_bf16_greedy_mtp_equals_ar() {
    let (accepted, drafted) = mtp_case(&QWEN);
    assert!(accepted > 0 && accepted < drafted, "{accepted}/{drafted}");
}

// ---- the stored types are kept ----

/// The twin's tensors as f32 values (the file is f32 but for integers).
fn twin_values(dir: &str) -> BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(stored(dir).join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .filter(|(_, v)| v.dtype() == Dtype::F32)
        .map(|(n, v)| {
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (n, vals)
        })
        .collect()
}

fn is_scale(name: &str) -> bool {
    name.ends_with(".scale") || name.ends_with("_scale_inv")
}

/// Every weight of `case.stored` read as the loader reads it: the type it
/// keeps (per file dtype), dequantized values equal to the twin's bit for
/// bit, and what the CPU backend makes of it (stored matrices stay
/// stored). Returns the count of tensors per kept type.
fn kept_types(case: &Case) -> BTreeMap<String, usize> {
    let dir = stored(case.stored);
    let info = ds4_engine::inspect::inspect(&dir).unwrap();
    assert_eq!(info.family, Some(case.family));
    let twin = twin_values(case.twin);
    let mut st = SafetensorsDir::open(&dir).unwrap();
    let entries: Vec<(String, Dtype, Vec<usize>)> = st
        .entries()
        .map(|(n, e)| (n.to_string(), e.dtype, e.shape.clone()))
        .collect();
    let ops = CpuOps;
    let mut kept = BTreeMap::new();
    for (name, dtype, shape) in entries {
        if is_scale(&name) {
            continue;
        }
        if matches!(dtype, Dtype::I64 | Dtype::I32) {
            // Integer tables (hash routing, PLE offsets) are not weights.
            WeightSource::ignore(&mut st, &name);
            continue;
        }
        let mut logical = shape.clone();
        let want = match dtype {
            Dtype::F32 => None,
            Dtype::BF16 => Some(WeightType::BF16),
            Dtype::F8_E4M3 => Some(WeightType::FP8_E4M3),
            Dtype::I8 => {
                *logical.last_mut().unwrap() *= 2;
                Some(WeightType::FP4_E2M1)
            }
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        let w =
            WeightSource::read(&mut st, &name, &logical).unwrap_or_else(|e| panic!("{name}: {e}"));
        let values = match (&w, want) {
            (HostWeight::Quant(q), Some(ty)) => {
                assert_eq!(q.ty, ty, "{name}: kept type");
                assert_eq!(q.dims, logical, "{name}: logical shape");
                q.to_f32_vec()
            }
            (HostWeight::F32(_), None) => w
                .clone()
                .to_f32()
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap(),
            (other, _) => panic!("{name}: read as {:?}, want {want:?}", other.dims()),
        };
        let t = twin
            .get(&name)
            .unwrap_or_else(|| panic!("{name}: not in the twin"));
        assert_bits(&format!("{name}: dequantized values"), &values, t);
        if let (Some(ty), [out, inp]) = (want, logical.as_slice()) {
            match ops.matrix(w, *out, *inp).unwrap() {
                CpuMatrix::Stored(q) => assert_eq!(q.ty, ty, "{name}: placed type"),
                _ => panic!("{name}: the CPU placed a {ty} matrix as another form"),
            }
        }
        *kept.entry(format!("{dtype:?}")).or_insert(0) += 1;
    }
    // Every scale tensor was consumed by its weight.
    st.finish(&[]).unwrap();
    println!(
        "{}: {kept:?}; file dtypes {:?}",
        case.stored, info.dtype_histogram
    );
    kept
}

#[test]
fn deepseek_v4_keeps_fp8_and_fp4() {
    let kept = kept_types(&DEEPSEEK);
    for (dtype, n) in [("F8_E4M3", 46), ("I8", 144), ("BF16", 62)] {
        assert_eq!(kept.get(dtype), Some(&n), "{dtype}: {kept:?}");
    }
    let info = ds4_engine::inspect::inspect(&stored(DEEPSEEK.stored)).unwrap();
    assert_eq!(info.dtype_histogram.get("F8_E8M0"), Some(&(46 + 144)));
    // An expert stack of FP4 experts stays FP4 on the CPU.
    let mut st = SafetensorsDir::open(&stored(DEEPSEEK.stored)).unwrap();
    let parts: Vec<HostWeight> = (0..8)
        .map(|e| {
            WeightSource::read(
                &mut st,
                &format!("layers.2.ffn.experts.{e}.w2.weight"),
                &[64, 32],
            )
            .unwrap()
        })
        .collect();
    let qs: Vec<&QuantTensor> = parts
        .iter()
        .map(|p| match p {
            HostWeight::Quant(q) => &**q,
            _ => panic!("an FP4 expert read as f32"),
        })
        .collect();
    let stack = QuantTensor::join(vec![8, 64, 32], &qs).unwrap();
    type Experts = <CpuOps as Backend>::Experts;
    match CpuOps
        .experts(HostWeight::Quant(stack.into()), 8, 64, 32)
        .unwrap()
    {
        Experts::Stored(q) => assert_eq!(q.ty, WeightType::FP4_E2M1),
        _ => panic!("the FP4 expert stack was widened"),
    }
}

#[test]
fn glm5_next_keeps_fp8() {
    let kept = kept_types(&GLM);
    assert_eq!(kept.get("F8_E4M3"), Some(&195), "{kept:?}");
    assert!(kept.get("BF16").is_some_and(|&n| n > 0), "{kept:?}");
    assert_eq!(kept.get("F32"), None, "{kept:?}");
}

#[test]
fn qwen4_exp_keeps_bf16() {
    let kept = kept_types(&QWEN);
    assert_eq!(kept.keys().collect::<Vec<_>>(), ["BF16"], "{kept:?}");
}

// ---- broken files ----

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

/// A copy of fixture `name` whose tensor table went through `edit`.
fn broken(
    name: &str,
    edit: impl FnOnce(&mut BTreeMap<String, Raw>),
) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(stored(name).join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(stored(name).join("model.safetensors")).unwrap();
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
    std::fs::write(dir.join("model.safetensors"), out).unwrap();
    (tmp, dir)
}

/// The load error, which must name `tensor` (and the file).
fn refused(dir: &Path, tensor: &str) -> String {
    match LoadedModel::load(dir) {
        Err(e @ EngineError::Tensor { .. }) => {
            let EngineError::Tensor {
                tensor: t, path, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(t, tensor, "{e}");
            assert!(path.ends_with("model.safetensors"), "{e}");
            e.to_string()
        }
        Err(e) => panic!("expected a tensor error naming {tensor}, got {e}"),
        Ok(_) => panic!("a broken checkpoint loaded (wanted an error naming {tensor})"),
    }
}

#[test]
fn missing_scales_are_named() {
    // An FP8 linear without its E8M0 `.scale`.
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        m.remove("layers.1.attn.wq_b.scale").unwrap();
    });
    let msg = refused(&dir, "layers.1.attn.wq_b.weight");
    assert!(msg.contains("layers.1.attn.wq_b.scale"), "{msg}");
    // An FP4 expert without its `.scale`.
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        m.remove("layers.3.ffn.experts.5.w3.scale").unwrap();
    });
    let msg = refused(&dir, "layers.3.ffn.experts.5.w3.weight");
    assert!(msg.contains("scale"), "{msg}");
    // GLM's FP8 linear without `weight_scale_inv`.
    let name = "model.language_model.layers.1.self_attn.kv_b_proj.weight";
    let (_t, dir) = broken(GLM.stored, |m| {
        m.remove(&format!("{name}_scale_inv")).unwrap();
    });
    let msg = refused(&dir, name);
    assert!(msg.contains(&format!("{name}_scale_inv")), "{msg}");
}

#[test]
fn scales_of_the_wrong_shape_are_named() {
    // FP8 grid of the indexer's wq_b [256, 32]: 2×1 blocks, given as 1×2.
    let scale = "layers.1.attn.indexer.wq_b.scale";
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        m.get_mut(scale).unwrap().shape = vec![1, 2];
    });
    let msg = refused(&dir, scale);
    assert!(msg.contains("[1, 2]") && msg.contains("[2, 1]"), "{msg}");
    assert!(msg.contains("layers.1.attn.indexer.wq_b.weight"), "{msg}");
    // FP4 expert scales [32, 2] (per 32 inputs) given per 64 inputs.
    let scale = "layers.0.ffn.experts.2.w1.scale";
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        let s = m.get_mut(scale).unwrap();
        s.shape = vec![32, 1];
        s.data.truncate(32);
    });
    let msg = refused(&dir, scale);
    assert!(msg.contains("[32, 1]") && msg.contains("[32, 2]"), "{msg}");
    // GLM f32 scale_inv with one block too many.
    let scale = "model.language_model.layers.0.mlp.up_proj.weight_scale_inv";
    let (_t, dir) = broken(GLM.stored, |m| {
        let s = m.get_mut(scale).unwrap();
        s.shape = vec![1, 2];
        s.data = s.data.repeat(2);
    });
    let msg = refused(&dir, scale);
    assert!(msg.contains("[1, 2]") && msg.contains("[1, 1]"), "{msg}");
}

#[test]
fn fp4_weights_of_the_wrong_packed_shape_are_named() {
    // Unpacked: one byte per value, [out, in] instead of [out, in / 2].
    let name = "layers.4.ffn.experts.7.w1.weight";
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        let w = m.get_mut(name).unwrap();
        w.shape = vec![32, 64];
        w.data = w.data.repeat(2);
    });
    let msg = refused(&dir, name);
    assert!(
        msg.contains("expected [32, 32] (packed FP4 for [32, 64]), found [32, 64]"),
        "{msg}"
    );
    // Packed along the wrong dim: [out / 2, in].
    let name = "mtp.0.ffn.experts.0.w2.weight";
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        m.get_mut(name).unwrap().shape = vec![32, 32];
    });
    let msg = refused(&dir, name);
    assert!(msg.contains("found [32, 32]"), "{msg}");
}

/// The routed experts written with safetensors' own `F4` dtype (shape in
/// values, `[out, in]`, two per byte: what Python's safetensors writes for
/// `torch.float4_e2m1fn_x2`) instead of `I8` pairs load to the same model.
#[test]
fn fp4_as_safetensors_f4_dtype_gives_the_same_logits() {
    let (_t, dir) = broken(DEEPSEEK.stored, |m| {
        for w in m.values_mut().filter(|w| w.dtype == Dtype::I8) {
            w.dtype = Dtype::F4;
            *w.shape.last_mut().unwrap() *= 2;
        }
    });
    let info = ds4_engine::inspect::inspect(&dir).unwrap();
    assert_eq!(info.dtype_histogram.get("F4"), Some(&144));
    let ids = &DEEPSEEK.tokens()[..64];
    let a = load_path(DEEPSEEK.family, &dir);
    let b = DEEPSEEK.load(DEEPSEEK.twin);
    match (&a, &b) {
        (LoadedModel::DeepseekV4(a), LoadedModel::DeepseekV4(b)) => {
            let (x, y) = (chunked(&**a, ids, 7), chunked(&**b, ids, 7));
            assert_bits("F4 experts", &x, &y);
        }
        _ => panic!("unexpected families"),
    }
}
