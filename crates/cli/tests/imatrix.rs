//! `ds4server imatrix` end to end: the file is llama.cpp's GGUF imatrix
//! form, the sums are those of the activations entering each product (the
//! first layer's q/k/v input recomputed here from the checkpoint's own
//! tensors), counts are tokens (per expert: routed rows, summing to tokens
//! × experts per token), `quantize --imatrix` reads it and it changes
//! what is written, and bad input is refused naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ds4_gguf::{Gguf, Value};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(p)
}

/// Runs `ds4server ARGS`; (success, stdout + stderr).
fn ds4(args: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .args(args)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
    )
}

fn imatrix(model: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "imatrix",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, log) = ds4(&args);
    assert!(ok, "imatrix {} failed:\n{log}", model.display());
}

/// Entry name → (in_sum2, counts).
fn entries(path: &Path) -> BTreeMap<String, (Vec<f32>, Vec<f32>)> {
    let g = Gguf::open(path).unwrap();
    let f32s = |name: &str| -> Vec<f32> {
        let info = &g.tensors[name];
        assert_eq!(info.ggml_type, 0, "{name} is F32");
        g.bytes(info)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    g.order
        .iter()
        .filter_map(|n| n.strip_suffix(".in_sum2"))
        .map(|w| {
            (
                w.to_string(),
                (f32s(&format!("{w}.in_sum2")), f32s(&format!("{w}.counts"))),
            )
        })
        .collect()
}

/// The pseudo-random tokens `--tokens N` feeds (the command's documented
/// 64-bit LCG).
fn lcg_tokens(vocab: usize, n: usize) -> Vec<usize> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 33) % vocab as u64) as usize
        })
        .collect()
}

fn safetensor_f32(dir: &Path, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn llama_sums_are_the_squares_of_each_products_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let src = fixture("llama/tiny/f32_untied");
    // 64 tokens in 4 chunks of 16 (no tokenizer: no BOS).
    imatrix(
        &src,
        &out,
        &["--tokens", "64", "-c", "16", "--kernels", "reference"],
    );
    let g = Gguf::open(&out).unwrap();
    assert!(matches!(g.metadata.get("general.type"), Some(Value::String(s)) if s == "imatrix"));
    assert!(matches!(
        g.metadata.get("imatrix.chunk_count"),
        Some(Value::U32(4))
    ));
    assert!(matches!(
        g.metadata.get("imatrix.chunk_size"),
        Some(Value::U32(16))
    ));
    assert!(matches!(g.metadata.get("imatrix.datasets"), Some(Value::Array(a)) if a.len() == 1));
    let e = entries(&out);
    // Every block matrix of both layers, named as llama.cpp names them;
    // the head is left out as llama-imatrix leaves it.
    assert_eq!(e.len(), 14, "{:?}", e.keys());
    assert!(!e.contains_key("output.weight"));
    for (name, (sums, counts)) in &e {
        assert_eq!(counts, &[64.0], "{name}: every token of every chunk");
        let width = if name.ends_with("ffn_down.weight") {
            64
        } else {
            32
        };
        assert_eq!(sums.len(), width, "{name}");
        assert!(sums.iter().all(|&s| s > 0.0 && s.is_finite()), "{name}");
    }
    // Products of one input have one entry's values.
    for l in 0..2 {
        let q = &e[&format!("blk.{l}.attn_q.weight")];
        assert_eq!(q, &e[&format!("blk.{l}.attn_k.weight")]);
        assert_eq!(q, &e[&format!("blk.{l}.attn_v.weight")]);
        assert_eq!(
            e[&format!("blk.{l}.ffn_gate.weight")],
            e[&format!("blk.{l}.ffn_up.weight")]
        );
    }
    // Layer 0's q/k/v input is RMSNorm(embedding) of each token:
    // recomputed from the checkpoint in f64.
    let (h, eps) = (32, 1e-5);
    let embed = safetensor_f32(&src, "model.embed_tokens.weight");
    let norm = safetensor_f32(&src, "model.layers.0.input_layernorm.weight");
    let mut want = vec![0f64; h];
    for t in lcg_tokens(96, 64) {
        let x = &embed[t * h..(t + 1) * h];
        let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / h as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for (j, w) in want.iter_mut().enumerate() {
            *w += (f64::from(x[j]) * r * f64::from(norm[j])).powi(2);
        }
    }
    let got = &e["blk.0.attn_q.weight"].0;
    for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= 1e-5 * w,
            "column {j}: {g} against {w}"
        );
    }
}

#[test]
fn expert_counts_sum_to_tokens_times_experts_per_token() {
    let dir = tempfile::tempdir().unwrap();
    // DeepSeek-V4 in ds4's layout: one [E, out, in] stack per projection,
    // one count per expert.
    let out = dir.path().join("ds.gguf");
    imatrix(
        &fixture("deepseek_v4/tiny_a"),
        &out,
        &["--tokens", "96", "-c", "32", "--kernels", "reference"],
    );
    let e = entries(&out);
    for l in 0..5 {
        let (sums, counts) = &e[&format!("blk.{l}.ffn_gate_exps.weight")];
        assert_eq!(counts.len(), 8, "layer {l}: 8 experts");
        assert_eq!(counts.iter().sum::<f32>(), 96.0 * 2.0, "layer {l}");
        assert_eq!(sums.len(), 8 * 64);
        for (x, &c) in counts.iter().enumerate() {
            let s = &sums[x * 64..(x + 1) * 64];
            assert_eq!(
                c == 0.0,
                s.iter().all(|&v| v == 0.0),
                "layer {l} expert {x}"
            );
        }
        assert_eq!(
            &e[&format!("blk.{l}.ffn_down_exps.weight")].1,
            counts,
            "down sees the rows gate/up saw"
        );
        assert_eq!(e[&format!("blk.{l}.ffn_down_shexp.weight")].1, [96.0]);
    }
    // The same model as a ds4 GGUF (bound by the engine under upstream
    // names): the same entries under the same names.
    let gguf = dir.path().join("ds-f32.gguf");
    let (ok, log) = ds4(&[
        "quantize",
        fixture("deepseek_v4/tiny_a").to_str().unwrap(),
        gguf.to_str().unwrap(),
        "--recipe",
        "f32",
    ]);
    assert!(ok, "{log}");
    let again = dir.path().join("ds-again.gguf");
    imatrix(
        &gguf,
        &again,
        &["--tokens", "96", "-c", "32", "--kernels", "reference"],
    );
    assert_eq!(entries(&again), e);
    // qwen4_exp in Hugging Face names: one entry per expert tensor.
    let out = dir.path().join("qwen.gguf");
    imatrix(
        &fixture("qwen4_exp/tiny_a"),
        &out,
        &["--tokens", "96", "-c", "32", "--kernels", "reference"],
    );
    let e = entries(&out);
    for l in 0..6 {
        let routed: f32 = (0..4)
            .filter_map(|x| {
                e.get(&format!(
                    "model.layers.{l}.mlp.experts.{x}.gate_proj.weight"
                ))
            })
            .map(|(_, c)| c[0])
            .sum();
        assert_eq!(routed, 96.0 * 2.0, "layer {l}");
        assert_eq!(
            e[&format!("model.layers.{l}.mlp.shared_expert.gate_proj.weight")].1,
            [96.0]
        );
    }
}

#[test]
fn glm5_next_expert_counts_sum_to_tokens_times_experts_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("glm.gguf");
    imatrix(
        &fixture("glm5_next/tiny_a"),
        &out,
        &["--tokens", "96", "-c", "32", "--kernels", "reference"],
    );
    let e = entries(&out);
    let p = |l: usize, x: usize| format!("model.language_model.layers.{l}.mlp.experts.{x}");
    let mut moe_layers = 0;
    for l in 0..6 {
        let routed: Vec<f32> = (0..8)
            .filter_map(|x| e.get(&format!("{}.gate_proj.weight", p(l, x))))
            .map(|(_, c)| c[0])
            .collect();
        if routed.is_empty() {
            continue; // a dense layer
        }
        moe_layers += 1;
        assert_eq!(routed.iter().sum::<f32>(), 96.0 * 3.0, "layer {l}");
        for x in 0..8 {
            if let Some((_, c)) = e.get(&format!("{}.up_proj.weight", p(l, x))) {
                assert_eq!(e[&format!("{}.down_proj.weight", p(l, x))].1, *c);
            }
        }
    }
    assert!(moe_layers > 0, "{:?}", e.keys());
}

#[test]
fn quantize_reads_the_matrix_and_it_changes_the_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("llama/tiny/f32_untied");
    let im = dir.path().join("m.gguf");
    imatrix(&src, &im, &["--tokens", "64", "-c", "16"]);
    // Q2_K on rows of 32/64 falls back to Q4_0, which an imatrix weights.
    let q2 = [
        "--recipe",
        "q4_k",
        "--type",
        "attention=Q2_K",
        "--type",
        "ffn=Q2_K",
        "--type",
        "ffn-down=Q2_K",
    ];
    let quantize = |out: &Path, extra: &[&str]| {
        let mut a = vec!["quantize", src.to_str().unwrap(), out.to_str().unwrap()];
        a.extend_from_slice(&q2);
        a.extend_from_slice(extra);
        let (ok, log) = ds4(&a);
        assert!(ok, "{log}");
        Gguf::open(out).unwrap()
    };
    let with = quantize(
        &dir.path().join("with.gguf"),
        &["--imatrix", im.to_str().unwrap()],
    );
    let without = quantize(&dir.path().join("without.gguf"), &[]);
    assert!(matches!(
        with.metadata.get("quantize.imatrix.entries_count"),
        Some(Value::I32(14) | Value::U32(14))
    ));
    for name in ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"] {
        assert_ne!(
            with.bytes(&with.tensors[name]),
            without.bytes(&without.tensors[name]),
            "{name}"
        );
    }
}

#[test]
fn default_model_imatrix_drives_iq2_xxs() {
    let model = ds4_models::default_model_path().expect("default model available");
    let dir = tempfile::tempdir().unwrap();
    let im = dir.path().join("m.gguf");
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/corpus.txt");
    imatrix(
        &model,
        &im,
        &[
            "--text",
            text.to_str().unwrap(),
            "-c",
            "64",
            "--chunks",
            "2",
        ],
    );
    let e = entries(&im);
    // 30 layers × 7 matrices, each over 2 chunks of 64 tokens.
    assert_eq!(e.len(), 210);
    assert!(e.values().all(|(_, c)| c == &[128.0]));
    // ffn_down's rows of 1536 are whole IQ2_XXS blocks.
    let quantize = |out: &Path, extra: &[&str]| {
        let mut a = vec![
            "quantize",
            model.to_str().unwrap(),
            out.to_str().unwrap(),
            "--recipe",
            "q8_0",
            "--type",
            "ffn-down=IQ2_XXS",
        ];
        a.extend_from_slice(extra);
        let (ok, log) = ds4(&a);
        assert!(ok, "{log}");
        Gguf::open(out).unwrap()
    };
    let with = quantize(
        &dir.path().join("with.gguf"),
        &["--imatrix", im.to_str().unwrap()],
    );
    let own = quantize(&dir.path().join("own.gguf"), &["--allow-no-imatrix"]);
    let name = "blk.3.ffn_down.weight";
    assert_eq!(with.tensors[name].ggml_type, 16, "IQ2_XXS");
    assert_ne!(
        with.bytes(&with.tensors[name]),
        own.bytes(&own.tensors[name])
    );
}

#[test]
fn bad_input_is_refused_naming_it_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let src = fixture("qwen4_exp/tiny_a");
    let run = |extra: &[&str]| {
        let mut a = vec![
            "imatrix",
            src.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        let (ok, log) = ds4(&a);
        assert!(!ok, "{extra:?} was accepted");
        assert!(!out.exists() && !dir.path().join("m.gguf.partial").exists());
        log
    };
    let missing = dir.path().join("nope.txt");
    let log = run(&["--text", missing.to_str().unwrap()]);
    assert!(log.contains("nope.txt"), "{log}");
    let log = run(&["--tokens", "40", "-c", "32"]);
    assert!(log.contains("at least 2 × --chunk-size = 64"), "{log}");
    let log = run(&["--tokens", "64", "-c", "8"]);
    assert!(log.contains("--chunk-size 8"), "{log}");
    let log = run(&[]);
    assert!(log.contains("--text FILE"), "{log}");
    let model = dir.path().join("absent");
    let (ok, log) = ds4(&["imatrix", model.to_str().unwrap(), "--tokens", "64"]);
    assert!(!ok && log.contains("absent"), "{log}");
}
