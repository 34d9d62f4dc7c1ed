//! Rule 6 (c) of `shared/specs/backend.md` on CUDA: the fast set's logits
//! against the reference set's on every quantized tiny fixture, both sets
//! on the GPU (the CPU's numbers are `tests/fast_kernels.rs`). The fast set
//! rounds each activation row to int8 before its Q8_0 / Q4_1 / K-quant /
//! IQ2_XXS products; everything else (norms, attention, routing) runs the
//! same kernels in both sets. A random tiny model's routing can flip under
//! that rounding (a flipped expert is a large local change), so the bound
//! is stated on the largest logit with the top-1 agreement beside it.
//! Measured on an H100 (run 37): DeepSeek-V4 (ds4's GGUF) 2.09e-2 of the
//! largest logit, top-1 48/48 (the CPU fast set against f32: 2.09e-2);
//! qwen4_exp in GGUF blocks 5.27e-2, top-1 46/48. Stated bounds: 1e-1 of
//! the largest logit and top-1 equal at ≥ 90 % of the positions. Every
//! case prints a `REPORT` line before any is asserted.

use std::path::Path;

use ds4_engine::backend::{CudaOps, KernelSet};
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::llama::{GgufWeights, LlamaModel};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::{LogitsRows, Model};

use crate::ops::kq8::fast_gpu;
use crate::support::gpu;

const TOL: f32 = 1e-1;
const T: usize = 48;

fn fixture(p: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(p)
}

/// `T` pseudo-random token ids below `vocab` (xorshift, fixed seed).
fn tokens(vocab: usize) -> Vec<u32> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..T)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv { (i, x) } else { (bi, bv) }
        })
        .0
}

/// Every position's logits of one forward over [`tokens`].
fn logits<M: Model>(m: &M) -> Vec<f32> {
    let ids = tokens(m.vocab_size());
    m.forward(&ids, &mut m.new_state(), LogitsRows::All)
        .unwrap()
        .logits
}

/// One case's measurement: the largest difference relative to the
/// largest reference logit, the top-1 agreement, and whether any bit
/// differs at all (else the fast products did not run).
struct Quality {
    what: &'static str,
    rel: f32,
    same_top: usize,
    rows: usize,
    differs: bool,
}

/// The fast set's logits (`fast`) against the reference set's
/// (`reference`), reported.
fn compare(what: &'static str, reference: &[f32], fast: &[f32], vocab: usize) -> Quality {
    assert_eq!(reference.len(), fast.len(), "{what}: lengths");
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = reference
        .iter()
        .zip(fast)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let rel = diff / scale.max(1e-30);
    let rows = reference.len() / vocab;
    let same_top = reference
        .chunks(vocab)
        .zip(fast.chunks(vocab))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count();
    println!(
        "REPORT fast_quality={what} max_abs_diff={diff:.4e} max_abs_logit={scale:.4} \
         rel={rel:.4e} top1_equal={same_top}/{rows}"
    );
    Quality {
        what,
        rel,
        same_top,
        rows,
        differs: diff > 0.0,
    }
}

/// `load` on the reference GPU and on the fast one, compared.
fn both<M: Model>(what: &'static str, load: impl Fn(CudaOps) -> M) -> Quality {
    let (r, f) = (gpu(), fast_gpu());
    assert_eq!(r.kernel_set(), KernelSet::Reference);
    assert_eq!(f.kernel_set(), KernelSet::Fast);
    let (mr, mf) = (load(r), load(f));
    compare(what, &logits(&mr), &logits(&mf), mr.vocab_size())
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_set_logits_are_within_the_stated_bound_of_the_reference() {
    // antirez/ds4's layout: Q8_0 attention and shared expert, IQ2_XXS
    // routed gate/up, Q2_K routed down.
    let (model, mtp) = (
        fixture("deepseek_v4/ds4_gguf/model.gguf"),
        fixture("deepseek_v4/ds4_gguf/mtp.gguf"),
    );
    let qwen = fixture("hf_gguf/qwen4_exp_tiny_a.gguf");
    let glm = fixture("hf_gguf/glm5_next_tiny_a.gguf");
    // The default model's shape and types (Q4_1 with a Q8_0 table), random
    // weights: the default model itself is measured by `bench --nll`.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smollm2-shaped.gguf");
    crate::bench::smollm2_shaped_gguf(&path);
    let cases = [
        both("deepseek_v4_ds4_gguf", |g| {
            DeepseekV4Model::load_gguf(&model, Some(&mtp), g).unwrap()
        }),
        // Transformers' names in GGUF blocks.
        both("qwen4_exp_hf_gguf", |g| {
            Qwen4ExpModel::load(&qwen, g).unwrap()
        }),
        both("glm5_next_hf_gguf", |g| {
            Glm5NextModel::load(&glm, g).unwrap()
        }),
        both("llama_smollm2_shaped_q4_1", |g| {
            LlamaModel::load_gguf(&path, GgufWeights::Quantized, g).unwrap()
        }),
    ];
    for q in &cases {
        let what = q.what;
        assert!(q.differs, "{what}: the fast set gave the reference's bits");
        assert!(
            q.rel <= TOL,
            "{what}: {:e} of the largest logit (bound {TOL:e})",
            q.rel
        );
        assert!(
            q.same_top * 10 >= q.rows * 9,
            "{what}: top-1 equal at {}/{}",
            q.same_top,
            q.rows
        );
    }
}
