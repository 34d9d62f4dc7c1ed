//! `ds4server quantize` end to end on the tiny fixtures: every family's
//! output loads in the engine and gives the logits of its source (exactly
//! the same weights for the `f32` recipe, close for block types), the
//! layouts are the ones our loaders read (ds4's trunk + MTP files, llama.cpp
//! names with permuted q/k, HF names with the config embedded), and what
//! must be refused is refused before any file exists.

use std::path::{Path, PathBuf};
use std::process::Command;

use ds4_engine::families::LoadedModel;
use ds4_engine::quant::WeightType;
use ds4_engine::quant::quantize::{QuantizeError, rows};
use ds4_engine::{LogitsRows, Model, ModelState};
use ds4_gguf::{Gguf, Value};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(p)
}

/// Runs the command; (success, stderr).
fn quantize(src: &Path, out: &Path, extra: &[&str]) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .arg("quantize")
        .arg(src)
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn ok(src: &Path, out: &Path, extra: &[&str]) {
    let (ok, err) = quantize(src, out, extra);
    assert!(ok, "quantize {} failed:\n{err}", src.display());
    assert!(!partial(out).exists());
}

fn partial(out: &Path) -> PathBuf {
    let mut n = out.file_name().unwrap().to_os_string();
    n.push(".partial");
    out.with_file_name(n)
}

/// Whether the quantizer writes `ty` (the block types are arriving).
fn writes(ty: WeightType) -> bool {
    let n = ty.block_len();
    let ones = vec![1.0; n];
    !matches!(
        rows(ty, &vec![0.5; n], n, Some(&ones)),
        Err(QuantizeError::Unsupported(_))
    )
}

fn logits(m: &LoadedModel) -> Vec<f32> {
    ds4_engine::with_model!(m, x => {
        let v = x.vocab_size();
        let ids: Vec<u32> = (0..11).map(|i| ((i * 7 + 3) % v) as u32).collect();
        let mut s = x.new_state();
        let out = x.forward(&ids, &mut s, LogitsRows::All).unwrap();
        assert_eq!(s.len(), ids.len());
        out.logits
    })
}

/// Largest |a − b| relative to the largest |b| (at least 1).
fn close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(a.iter().all(|x| x.is_finite()), "{what}: non-finite logits");
    assert!(
        d <= tol * scale,
        "{what}: max diff {d} (scale {scale}, tol {tol})"
    );
}

fn type_of(g: &Gguf, name: &str) -> u32 {
    g.tensors
        .get(name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .ggml_type
}

fn meta_str(g: &Gguf, key: &str) -> String {
    match g.metadata.get(key) {
        Some(Value::String(s)) => s.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

#[test]
fn llama_directory_to_llama_cpp_layout_keeps_its_logits() {
    let dir = tempfile::tempdir().unwrap();
    for case in [
        "f32_untied",
        "f32_tied",
        "bf16",
        "f32_sharded",
        "rope_linear",
    ] {
        let src = fixture(&format!("llama/tiny/{case}"));
        let out = dir.path().join(format!("{case}.gguf"));
        ok(&src, &out, &["--recipe", "f32"]);
        let g = Gguf::open(&out).unwrap();
        assert_eq!(meta_str(&g, "general.architecture"), "llama");
        assert_eq!(meta_str(&g, "ds4server.quantize.recipe"), "f32");
        assert!(g.tensors.contains_key("blk.1.attn_q.weight"));
        assert_eq!(g.tensors.contains_key("output.weight"), case != "f32_tied");
        let want = logits(&LoadedModel::load(&src).unwrap());
        let got = logits(&LoadedModel::load(&out).unwrap());
        // Same weights; RoPE interleaved over permuted q/k instead of
        // half-split sums the head dims in another order.
        close(case, &got, &want, 1e-4);
    }
}

#[test]
fn llama_block_recipes_load_and_stay_close() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("llama/tiny/f32_untied");
    let want = logits(&LoadedModel::load(&src).unwrap());
    let out = dir.path().join("f16.gguf");
    ok(&src, &out, &["--recipe", "f16"]);
    close(
        "f16",
        &logits(&LoadedModel::load(&out).unwrap()),
        &want,
        1e-2,
    );
    assert_eq!(
        type_of(&Gguf::open(&out).unwrap(), "blk.0.attn_k.weight"),
        1
    );

    // Q8_0 (rows of 32 and 64 values): once the quantizer writes it, the
    // file loads and stays close; until then the command refuses it
    // before writing anything.
    let out = dir.path().join("q8.gguf");
    let (done, err) = quantize(&src, &out, &["--recipe", "q8_0"]);
    if writes(WeightType::Q8_0) {
        assert!(done, "{err}");
        let g = Gguf::open(&out).unwrap();
        assert_eq!(type_of(&g, "blk.0.ffn_down.weight"), 8);
        assert_eq!(type_of(&g, "token_embd.weight"), 8);
        assert_eq!(type_of(&g, "output_norm.weight"), 0);
        close(
            "q8_0",
            &logits(&LoadedModel::load(&out).unwrap()),
            &want,
            5e-2,
        );
    } else {
        assert!(!done && err.contains("does not write Q8_0 yet"), "{err}");
        assert!(!out.exists() && !partial(&out).exists());
    }
}

#[test]
fn deepseek_directory_to_ds4_layout_with_its_mtp_file() {
    let dir = tempfile::tempdir().unwrap();
    for (case, src) in [
        ("tiny_a", fixture("deepseek_v4/tiny_a")),
        ("fp8_fp4", fixture("stored/deepseek_v4_fp8_fp4")),
        ("ds4_f32", fixture("deepseek_v4/ds4_gguf/f32")),
    ] {
        let out = dir.path().join(format!("{case}.gguf"));
        ok(&src, &out, &["--recipe", "f32"]);
        let g = Gguf::open(&out).unwrap();
        assert_eq!(meta_str(&g, "general.architecture"), "deepseek4");
        // One [E, out, in] stack per routed projection, ds4's names.
        let up = &g.tensors["blk.0.ffn_up_exps.weight"];
        assert_eq!(up.dims.len(), 3);
        assert!(g.tensors.contains_key("output_hc_fn.weight"));
        assert!(!g.order.iter().any(|n| n.starts_with("mtp.")));
        let want = LoadedModel::load(&src).unwrap();
        let mut got = LoadedModel::load(&out).unwrap();
        close(case, &logits(&got), &logits(&want), 1e-4);
        let mtp = dir.path().join(format!("{case}-mtp.gguf"));
        let has_mtp = ds4_engine::with_model!(&want, x => x.mtp_contract().is_some());
        assert_eq!(mtp.exists(), has_mtp, "{case}");
        if has_mtp {
            got.attach_mtp_head(&mtp).unwrap();
        }
    }
}

#[test]
fn ds4_recipes_type_ds4s_groups() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("deepseek_v4/ds4_gguf/f32");
    let want = logits(&LoadedModel::load(&src).unwrap());
    for recipe in ["ds4-q4", "q8_0"] {
        let out = dir.path().join(format!("{recipe}.gguf"));
        let (done, err) = quantize(&src, &out, &["--recipe", recipe]);
        if !writes(WeightType::Q8_0) || (recipe == "ds4-q4" && !writes(WeightType::Q4_K)) {
            assert!(!done && err.contains("does not write"), "{err}");
            assert!(!out.exists() && !partial(&out).exists());
            continue;
        }
        assert!(done, "{err}");
        let g = Gguf::open(&out).unwrap();
        assert_eq!(type_of(&g, "token_embd.weight"), 1, "embedding F16");
        assert_eq!(type_of(&g, "blk.0.ffn_gate_inp.weight"), 1, "router F16");
        assert_eq!(type_of(&g, "blk.0.hc_attn_fn.weight"), 1, "HC F16");
        assert_eq!(type_of(&g, "blk.0.attn_compressor_kv.weight"), 1);
        assert_eq!(type_of(&g, "blk.0.indexer.proj.weight"), 1);
        assert_eq!(type_of(&g, "blk.0.attn_q_a.weight"), 8, "attention Q8_0");
        assert_eq!(type_of(&g, "blk.0.ffn_up_shexp.weight"), 8);
        assert_eq!(type_of(&g, "output.weight"), 8);
        assert_eq!(type_of(&g, "blk.0.attn_norm.weight"), 0);
        assert_eq!(type_of(&g, "blk.0.ffn_gate_tid2eid.weight"), 26);
        // Gate/up rows of 256 take the recipe's type; down rows of 32
        // fall back as llama.cpp does (Q4_K → Q5_0; Q8_0 fits).
        let gate = if recipe == "ds4-q4" { 12 } else { 8 };
        assert_eq!(type_of(&g, "blk.0.ffn_gate_exps.weight"), gate);
        let down = if recipe == "ds4-q4" { 6 } else { 8 };
        assert_eq!(type_of(&g, "blk.0.ffn_down_exps.weight"), down);
        close(
            recipe,
            &logits(&LoadedModel::load(&out).unwrap()),
            &want,
            0.1,
        );
    }
}

#[test]
fn requantizing_a_ds4_gguf_keeps_names_metadata_and_logits() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("deepseek_v4/ds4_gguf/model.gguf");
    let out = dir.path().join("r.gguf");
    ok(&src, &out, &["--recipe", "f32"]);
    let (a, b) = (Gguf::open(&src).unwrap(), Gguf::open(&out).unwrap());
    assert_eq!(a.order, b.order);
    for k in &a.keys {
        assert!(b.metadata.contains_key(k), "{k} dropped");
    }
    assert!(matches!(
        b.metadata.get("ds4server.quantize.requantized"),
        Some(Value::Bool(true))
    ));
    close(
        "requantized",
        &logits(&LoadedModel::load(&out).unwrap()),
        &logits(&LoadedModel::load(&src).unwrap()),
        1e-4,
    );
}

#[test]
fn qwen_and_glm_become_hf_name_ggufs_that_load() {
    let dir = tempfile::tempdir().unwrap();
    for fam in ["qwen4_exp", "glm5_next"] {
        let src = fixture(&format!("{fam}/tiny_a"));
        let out = dir.path().join(format!("{fam}.gguf"));
        ok(&src, &out, &["--recipe", "f32"]);
        let g = Gguf::open(&out).unwrap();
        assert!(meta_str(&g, "ds4server.hf_config").contains(fam));
        close(
            fam,
            &logits(&LoadedModel::load(&out).unwrap()),
            &logits(&LoadedModel::load(&src).unwrap()),
            1e-5,
        );
    }
}

/// IQ2_XXS on rows that are not whole 256-value blocks falls back to
/// IQ4_NL as llama.cpp's `tensor_type_fallback` does (ds4's expert down
/// rows of 32 here), with and without an importance matrix, and the file
/// loads and runs close to the source.
#[test]
fn iq2_xxs_rows_of_32_fall_back_to_iq4_nl() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("deepseek_v4/ds4_gguf/f32");
    let want = logits(&LoadedModel::load(&src).unwrap());
    let out = dir.path().join("iq4.gguf");
    let (done, err) = quantize(
        &src,
        &out,
        &[
            "--recipe",
            "q8_0",
            "--type",
            "expert-down=IQ2_XXS",
            "--allow-no-imatrix",
        ],
    );
    assert!(done, "{err}");
    assert!(
        err.contains("blk.0.ffn_down_exps.weight: rows of 32 values are not whole IQ2_XXS blocks; written as IQ4_NL"),
        "{err}"
    );
    let g = Gguf::open(&out).unwrap();
    assert_eq!(type_of(&g, "blk.0.ffn_down_exps.weight"), 20, "IQ4_NL");
    assert_eq!(type_of(&g, "blk.0.ffn_gate_exps.weight"), 8);
    close(
        "IQ4_NL down",
        &logits(&LoadedModel::load(&out).unwrap()),
        &want,
        0.1,
    );
}

/// The llama f32 fixture with its tensors edited, in a temporary directory.
fn edited_llama(edit: impl Fn(&str, Vec<usize>) -> Option<Vec<usize>>) -> tempfile::TempDir {
    let src = fixture("llama/tiny/f32_untied");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept = Vec::new();
    for (name, view) in st.tensors() {
        if let Some(shape) = edit(&name, view.shape().to_vec()) {
            kept.push((name, shape, view.data().to_vec()));
        }
    }
    f32_dir(&src, &kept)
}

#[test]
fn missing_or_misshaped_tensors_are_refused_before_writing() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("m.gguf");
    let missing = edited_llama(|n, s| (n != "model.layers.1.mlp.up_proj.weight").then_some(s));
    let (done, err) = quantize(missing.path(), &out, &["--recipe", "f32"]);
    assert!(
        !done && err.contains("model.layers.1.mlp.up_proj.weight") && err.contains("missing"),
        "{err}"
    );
    assert!(!out.exists() && !partial(&out).exists());

    let bad = edited_llama(|n, s| {
        Some(if n == "model.layers.0.self_attn.q_proj.weight" {
            vec![s[0] / 2, s[1] * 2]
        } else {
            s
        })
    });
    let (done, err) = quantize(bad.path(), &out, &["--recipe", "f32"]);
    assert!(
        !done
            && err.contains("model.layers.0.self_attn.q_proj.weight")
            && err.contains("model.safetensors")
            && err.contains("expected [32, 32]"),
        "{err}"
    );
    assert!(!out.exists() && !partial(&out).exists());

    // An unedited copy quantizes: the edits above are what failed.
    let same = edited_llama(|_, s| Some(s));
    ok(same.path(), &out, &["--recipe", "f32"]);
}

#[test]
fn unknown_recipe_group_and_type_are_readable_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let src = fixture("llama/tiny/f32_untied");
    for (args, want) in [
        (vec!["--recipe", "q3_xl"], "unknown recipe `q3_xl`"),
        (
            vec!["--recipe", "f16", "--type", "mlp=Q8_0"],
            "unknown tensor group `mlp`",
        ),
        (
            vec!["--recipe", "f16", "--type", "attention=Q9_K"],
            "unknown type `Q9_K`",
        ),
        (
            vec!["--recipe", "f16", "--type", "attention"],
            "expected GROUP=TYPE",
        ),
    ] {
        let (done, err) = quantize(&src, &out, &args);
        assert!(!done && err.contains(want), "{args:?}: {err}");
        assert!(!out.exists() && !partial(&out).exists());
    }
}

#[test]
fn iq2_xxs_needs_an_importance_matrix_unless_allowed() {
    // ds4's own q2 file (rows of 256: gate/up can be IQ2_XXS).
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("deepseek_v4/ds4_quantizer/q2.gguf");
    let out = dir.path().join("q2.gguf");
    let (done, err) = quantize(&src, &out, &["--recipe", "ds4-q2"]);
    assert!(
        !done && err.contains("importance matrix") && err.contains("--allow-no-imatrix"),
        "{err}"
    );
    assert!(!out.exists() && !partial(&out).exists());

    // A legacy imatrix whose entry has the wrong length is refused, naming
    // the tensor.
    let im = dir.path().join("bad.dat");
    let name = "blk.0.ffn_gate_exps.weight";
    let mut b = 1i32.to_le_bytes().to_vec();
    b.extend((name.len() as i32).to_le_bytes());
    b.extend(name.as_bytes());
    b.extend(1i32.to_le_bytes());
    b.extend(3i32.to_le_bytes());
    b.extend([0u8; 12]);
    std::fs::write(&im, b).unwrap();
    let (done, err) = quantize(
        &src,
        &out,
        &["--recipe", "ds4-q2", "--imatrix", im.to_str().unwrap()],
    );
    assert!(
        !done && err.contains(name) && err.contains("3 values"),
        "{err}"
    );
    assert!(!out.exists());

    let (done, err) = quantize(&src, &out, &["--recipe", "ds4-q2", "--allow-no-imatrix"]);
    if writes(WeightType::IQ2_XXS) && writes(WeightType::Q2_K) && writes(WeightType::Q8_0) {
        assert!(done, "{err}");
        let g = Gguf::open(&out).unwrap();
        assert_eq!(type_of(&g, name), 16);
        assert_eq!(type_of(&g, "blk.0.ffn_down_exps.weight"), 10);
        assert!(meta_str(&g, "ds4server.quantize.imatrix").contains("--allow-no-imatrix"));
        close(
            "q2 from q2",
            &logits(&LoadedModel::load(&out).unwrap()),
            &logits(&LoadedModel::load(&src).unwrap()),
            0.5,
        );
    } else {
        assert!(!done && err.contains("does not write"), "{err}");
        assert!(!out.exists() && !partial(&out).exists());
    }
}

/// Every file in `dir`, by name, with its bytes.
fn files_in(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn threads_do_not_change_a_byte() {
    for (src, recipe) in [
        (fixture("llama/tiny/f32_untied"), vec!["--recipe", "q4_k"]),
        (fixture("qwen4_exp/tiny_a"), vec!["--recipe", "q8_0"]),
        // Rows of 256: IQ2_XXS and Q2_K experts, Q8_0 attention.
        (
            fixture("deepseek_v4/ds4_quantizer/q2.gguf"),
            vec!["--recipe", "ds4-q2", "--allow-no-imatrix"],
        ),
    ] {
        let mut outs = Vec::new();
        for threads in ["1", "3"] {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("m.gguf");
            let mut args = recipe.clone();
            args.extend(["--threads", threads]);
            let (done, err) = quantize(&src, &out, &args);
            assert!(done, "{} --threads {threads}: {err}", src.display());
            outs.push(files_in(dir.path()));
        }
        assert!(!outs[0].is_empty());
        let names = |o: &Vec<(String, Vec<u8>)>| o.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&outs[0]), names(&outs[1]), "{}", src.display());
        for (a, b) in outs[0].iter().zip(&outs[1]) {
            assert!(
                a.1 == b.1,
                "{}: {} differs between 1 and 3 threads",
                src.display(),
                a.0
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.gguf");
    let (done, err) = quantize(
        &fixture("llama/tiny/f32_untied"),
        &out,
        &["--recipe", "f16", "--threads", "0"],
    );
    assert!(!done && err.contains("--threads 0"), "{err}");
}

/// The llama f32 fixture with row `row` of `tensor` set to `value`.
fn llama_with_row(tensor: &str, row: usize, value: f32) -> tempfile::TempDir {
    let src = fixture("llama/tiny/f32_untied");
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept = Vec::new();
    for (name, view) in st.tensors() {
        let mut data = view.data().to_vec();
        if name == tensor {
            let cols = view.shape()[1];
            for c in 0..cols {
                let o = (row * cols + c) * 4;
                data[o..o + 4].copy_from_slice(&value.to_le_bytes());
            }
        }
        kept.push((name, view.shape().to_vec(), data));
    }
    assert!(kept.iter().any(|k| k.0 == tensor), "{tensor}");
    f32_dir(&src, &kept)
}

#[test]
fn blocks_with_non_finite_scales_are_refused_naming_tensor_and_row() {
    // 1e30 is a finite f32, but its Q8_0 scale (1e30 / 127) and its F16
    // value overflow f16: llama.cpp's ggml_validate_row_data refuses both.
    let src = llama_with_row("model.layers.0.mlp.up_proj.weight", 5, 1e30);
    let out_dir = tempfile::tempdir().unwrap();
    let out = out_dir.path().join("m.gguf");
    for (recipe, what) in [("q8_0", "inf scale d"), ("f16", "inf value")] {
        let (done, err) = quantize(src.path(), &out, &["--recipe", recipe, "--threads", "3"]);
        assert!(!done, "{recipe}: a file with infinite blocks was written");
        assert!(
            err.contains("blk.0.ffn_up.weight") && err.contains("row 5,") && err.contains(what),
            "{recipe}: {err}"
        );
        assert!(err.contains("m.gguf"), "{recipe}: the file is named: {err}");
        let left: Vec<_> = std::fs::read_dir(out_dir.path()).unwrap().collect();
        assert!(left.is_empty(), "{recipe}: {left:?}");
    }
    // In F32 the value is representable: written, and the row is there.
    ok(src.path(), &out, &["--recipe", "f32"]);
    // A NaN is refused by the quantizer itself, naming row and column.
    let nan = llama_with_row("model.layers.1.self_attn.o_proj.weight", 7, f32::NAN);
    let (done, err) = quantize(
        nan.path(),
        &out_dir.path().join("n.gguf"),
        &["--recipe", "q8_0"],
    );
    assert!(
        !done && err.contains("blk.1.attn_output.weight") && err.contains("row 7"),
        "{err}"
    );
    assert!(!out_dir.path().join("n.gguf").exists());
}

/// `quantize-report SRC FILES...`: (stdout, success, stderr).
fn report(src: &Path, files: &[&Path], extra: &[&str]) -> (String, bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .arg("quantize-report")
        .arg(src)
        .args(files)
        .args(extra)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The table row of `file`: (max |Δlogit|, mean KL, top-1 agreement).
fn row_of(table: &str, file: &str) -> (f64, f64, f64) {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("| {file} |")))
        .unwrap_or_else(|| panic!("{file} not in\n{table}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let num = |i: usize| cells[i].parse::<f64>().unwrap();
    (num(3), num(4), num(5))
}

#[test]
fn report_measures_the_distance_from_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("llama/tiny/f32_untied");
    let f32 = dir.path().join("f32.gguf");
    let q8 = dir.path().join("q8.gguf");
    let q4 = dir.path().join("q4.gguf");
    ok(&src, &f32, &["--recipe", "f32"]);
    ok(&src, &q8, &["--recipe", "q8_0"]);
    ok(&src, &q4, &["--recipe", "q4_k"]);
    let (table, done, err) = report(&src, &[&f32, &q8, &q4], &["--tokens", "48"]);
    assert!(done, "{err}");
    assert!(table.contains("48 positions"), "{table}");
    // The same weights: the logits of the source up to summation order.
    let (d, kl, top1) = row_of(&table, "f32.gguf");
    assert!(d < 1e-3 && kl < 1e-6 && top1 == 1.0, "{table}");
    // Q8_0 is close, Q4_K's fallbacks (Q5_0) further: KL grows with
    // fewer bits.
    let (d8, kl8, _) = row_of(&table, "q8.gguf");
    let (d4, kl4, _) = row_of(&table, "q4.gguf");
    assert!(d8 > 0.0 && kl8 > 0.0 && kl8 < kl4 && d8 < d4, "{table}");

    // With --text: tokenized by the source's tokenizer (BOS first, as
    // `bench --nll`), every model's NLL beside the source's.
    let tok_src = llama_with_tokenizer(serde_json::json!({"type": "ByteLevel",
        "add_prefix_space": false, "trim_offsets": true, "use_regex": true}));
    let tq8 = dir.path().join("tq8.gguf");
    ok(tok_src.path(), &tq8, &["--recipe", "q8_0"]);
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "hello the world 33 hello world the 333 the hello").unwrap();
    let (table, done, err) = report(
        tok_src.path(),
        &[&tq8],
        &["--text", text.to_str().unwrap(), "--window", "8"],
    );
    assert!(done, "{err}");
    assert!(
        table.contains("source NLL") && table.contains("| NLL | ΔNLL |"),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.starts_with("| tq8.gguf |"))
        .unwrap();
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let nll: f64 = cells[6].parse().unwrap();
    assert!(nll.is_finite() && nll > 0.0, "{table}");

    // A file of another model (another vocabulary) is refused by name.
    let other = dir.path().join("qwen.gguf");
    ok(&fixture("qwen4_exp/tiny_a"), &other, &["--recipe", "f32"]);
    let (_, done, err) = report(&src, &[&other], &[]);
    assert!(!done && err.contains("qwen.gguf"), "{err}");
}

/// The llama f32 fixture plus a byte-level BPE tokenizer (pre-tokenizer
/// `pre`) of 56 ids, in a temporary directory.
fn llama_with_tokenizer(pre: serde_json::Value) -> tempfile::TempDir {
    with_tokenizer(&fixture("llama/tiny/f32_untied"), pre)
}

/// The checkpoint `src` (its config and safetensors) plus a byte-level BPE
/// tokenizer (pre-tokenizer `pre`) of 56 ids, in a temporary directory.
fn with_tokenizer(src: &Path, pre: serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut vocab = serde_json::Map::new();
    let mut next = 0u32;
    let mut add = |t: &str| {
        vocab.insert(t.to_string(), next.into());
        next += 1;
    };
    for t in ["<unk>", "<s>", "</s>", "Ġ", "Ċ"] {
        add(t);
    }
    for c in ('a'..='z').chain('0'..='9') {
        add(&c.to_string());
    }
    let merges = [
        ("t", "h"),
        ("th", "e"),
        ("Ġ", "the"),
        ("l", "l"),
        ("e", "ll"),
        ("h", "ell"),
        ("hell", "o"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġw", "or"),
        ("l", "d"),
        ("Ġwor", "ld"),
        ("3", "3"),
        ("Ġ", "33"),
    ];
    for (a, b) in merges {
        add(&format!("{a}{b}"));
    }
    let added: Vec<_> = ["<unk>", "<s>", "</s>"]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"id": i, "content": t, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tok = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
    let cfg = serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": true,
        "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"});
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

#[test]
fn a_llama_directory_tokenizer_goes_into_the_gguf_and_tokenizes_the_same() {
    let out_dir = tempfile::tempdir().unwrap();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": true});
    let llama3 = serde_json::json!({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": ds4_text::tokenizer::pretokenizers::LLAMA3_SPLIT},
         "behavior": "Isolated", "invert": false},
        {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
    for (pre, want) in [(byte_level, "gpt2"), (llama3, "llama-bpe")] {
        let src = llama_with_tokenizer(pre);
        let out = out_dir.path().join(format!("{want}.gguf"));
        let (done, err) = quantize(src.path(), &out, &["--recipe", "q8_0"]);
        assert!(done, "{err}");
        assert!(err.contains(&format!("pre = {want}")), "{err}");
        let g = Gguf::open(&out).unwrap();
        assert_eq!(meta_str(&g, "tokenizer.ggml.model"), "gpt2");
        assert_eq!(meta_str(&g, "tokenizer.ggml.pre"), want);
        match g.metadata.get("tokenizer.ggml.tokens") {
            // config.json's vocab_size; ids past the tokenizer's are [PAD<id>].
            Some(Value::Array(t)) => {
                assert_eq!(t.len(), 96);
                assert!(matches!(&t[60], Value::String(s) if s == "[PAD60]"));
            }
            other => panic!("{other:?}"),
        }
        match g.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(t)) => {
                assert!(matches!(t[1], Value::I32(3)), "<s> is control");
                assert!(matches!(t[10], Value::I32(1)));
                assert!(matches!(t[60], Value::I32(5)), "padding is unused");
            }
            other => panic!("{other:?}"),
        }
        let dir_tok = ds4_text::Tokenizer::from_hf_dir(src.path()).unwrap();
        let gguf_tok = ds4_text::Tokenizer::from_gguf(&out).unwrap();
        for text in [
            "hello the world",
            " the  world\n33 333 hello!the",
            "<s>the</s>",
        ] {
            let a = dir_tok.encode(text, false).unwrap();
            assert_eq!(gguf_tok.encode(text, false).unwrap(), a, "{want}: {text:?}");
            assert_eq!(
                gguf_tok.encode(text, true).unwrap(),
                dir_tok.encode(text, true).unwrap(),
                "{want}: {text:?} (special tokens parsed)"
            );
        }
        let world = dir_tok.token_to_id("Ġworld").unwrap();
        assert!(
            dir_tok
                .encode("hello world", false)
                .unwrap()
                .contains(&world)
        );
        assert_eq!(gguf_tok.bos_token().unwrap().id, 1);
        assert_eq!(gguf_tok.eos_token().unwrap().id, 2);
        assert!(gguf_tok.add_bos());
        assert_eq!(gguf_tok.chat_template(), dir_tok.chat_template());
        // The server's loader reads it from the file.
        let o = Command::new(env!("CARGO_BIN_EXE_ds4server"))
            .arg("inspect")
            .arg(&out)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains(&format!("gguf gpt2 BPE, pre={want}, 96 tokens")),
            "{text}"
        );
    }

    // A tokenizer with no GGUF form here (WordLevel) is left out, saying so.
    let src = llama_with_tokenizer(serde_json::json!({"type": "WhitespaceSplit"}));
    let out = out_dir.path().join("none.gguf");
    let (done, err) = quantize(src.path(), &out, &["--recipe", "f16"]);
    assert!(done && err.contains("not written to the GGUF"), "{err}");
    assert!(
        !Gguf::open(&out)
            .unwrap()
            .metadata
            .contains_key("tokenizer.ggml.tokens")
    );

    // Nor is one that does not load (a ByteLevel missing a field): the
    // weights are still written.
    let src = llama_with_tokenizer(serde_json::json!({"type": "ByteLevel"}));
    let (done, err) = quantize(src.path(), &out, &["--recipe", "f16"]);
    assert!(done && err.contains("does not load"), "{err}");
    let g = Gguf::open(&out).unwrap();
    assert!(!g.metadata.contains_key("tokenizer.ggml.tokens"));
}

/// `Sequence[Split(r, Isolated) for r in splits, ByteLevel(use_regex=false)]`.
fn splits(regexes: &[&str]) -> serde_json::Value {
    let mut p: Vec<serde_json::Value> = regexes
        .iter()
        .map(|r| {
            serde_json::json!({"type": "Split", "pattern": {"Regex": r},
                "behavior": "Isolated", "invert": false})
        })
        .collect();
    p.push(
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": false}),
    );
    serde_json::json!({"type": "Sequence", "pretokenizers": p})
}

fn tokenize_cli(model: &Path, text: &str) -> Vec<u64> {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .args(["debug", "tokenize", "--special", "--text", text, "-m"])
        .arg(model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

fn run_cli(model: &Path, prompt: &str) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .args([
            "run",
            "--raw",
            "--json",
            "--temperature",
            "0",
            "--max-tokens",
            "3",
        ])
        .args(["--mtp-depth", "0", "-p", prompt, "-m"])
        .arg(model)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Qwen, GLM and DeepSeek-V4 directories with a byte-level BPE tokenizer:
/// `quantize` writes it as `tokenizer.ggml.*`, the GGUF's tokenizer encodes
/// as the directory's, and the CLI reads it from the file alone (no
/// tokenizer.json beside it) for Qwen and GLM. (A DeepSeek-V4 GGUF keeps
/// ds4's tokenizer when served; its keys are proven here all the same.)
#[test]
fn other_families_directory_tokenizers_go_into_the_gguf() {
    use ds4_text::tokenizer::pretokenizers::{DEEPSEEK3_SPLITS, QWEN2_SPLIT};
    let out_dir = tempfile::tempdir().unwrap();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": true, "use_regex": true});
    for (fam, pre, want, vocab) in [
        ("qwen4_exp", splits(&[QWEN2_SPLIT]), "qwen2", 128),
        ("glm5_next", byte_level, "gpt2", 64),
        ("deepseek_v4", splits(DEEPSEEK3_SPLITS), "deepseek-v3", 256),
    ] {
        let src = with_tokenizer(&fixture(&format!("{fam}/tiny_a")), pre);
        let out = out_dir.path().join(format!("{fam}.gguf"));
        let (done, err) = quantize(src.path(), &out, &["--recipe", "f32"]);
        assert!(done, "{err}");
        assert!(err.contains(&format!("pre = {want}")), "{fam}: {err}");
        let g = Gguf::open(&out).unwrap();
        assert_eq!(meta_str(&g, "tokenizer.ggml.pre"), want, "{fam}");
        assert!(
            matches!(g.metadata.get("tokenizer.ggml.tokens"), Some(Value::Array(t)) if t.len() == vocab),
            "{fam}"
        );
        let dir_tok = ds4_text::Tokenizer::from_hf_dir(src.path()).unwrap();
        let gguf_tok = ds4_text::Tokenizer::from_gguf(&out).unwrap();
        let text = "<s>hello the world\n 333 12345 the</s>";
        for parse in [false, true] {
            assert_eq!(
                gguf_tok.encode(text, parse).unwrap(),
                dir_tok.encode(text, parse).unwrap(),
                "{fam}: parse_special = {parse}"
            );
        }
        assert_eq!(gguf_tok.eos_token().map(|t| t.id), Some(2), "{fam}");
        if fam == "deepseek_v4" {
            continue;
        }
        // The CLI's loader, given the file alone.
        let want_ids: Vec<u64> = dir_tok
            .encode(text, true)
            .unwrap()
            .into_iter()
            .map(u64::from)
            .collect();
        assert_eq!(tokenize_cli(&out, text), want_ids, "{fam}");
        // `run` on the f32 file: the prompt's tokens and the greedy
        // continuation are the directory's.
        let (a, b) = (
            run_cli(src.path(), "hello the world"),
            run_cli(&out, "hello the world"),
        );
        assert_eq!(a["prompt_tokens"], b["prompt_tokens"], "{fam}");
        assert_eq!(a["tokens"], b["tokens"], "{fam}");
    }
}

/// A Hugging Face directory of `tensors` (name, shape, f32 bytes) with
/// `src`'s config, in a temp dir.
fn f32_dir(src: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) -> tempfile::TempDir {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    dir
}

/// Every block type a file holds, by GGUF type id (F32, F16, BF16 and the
/// I32/I64 tables left out).
fn block_types(g: &Gguf) -> std::collections::BTreeSet<u32> {
    g.tensors
        .values()
        .map(|t| t.ggml_type)
        .filter(|t| ![0, 1, 26, 27, 30].contains(t))
        .collect()
}

/// For every family's tiny fixture and every block recipe, the written file
/// runs exactly its own blocks: its logits on the reference kernel set
/// equal a forward over the same file with every block dequantized to f32
/// (`quantize Q.gguf D.gguf --recipe f32`) up to f32 summation order (the
/// block kernels add the same products per block, the f32 kernels in lanes:
/// 1e-5 of the largest logit, where the recipes' own distance from the
/// source is 1e-2 to 1).
#[test]
fn every_family_and_recipe_runs_its_own_blocks_exactly() {
    ds4_engine::backend::kernel_set::choose(ds4_engine::backend::KernelSet::Reference).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (fam, src) in [
        ("llama", "llama/tiny/f32_untied"),
        ("deepseek_v4", "deepseek_v4/tiny_a"),
        ("qwen4_exp", "qwen4_exp/tiny_a"),
        ("glm5_next", "glm5_next/tiny_a"),
    ] {
        for recipe in ["q8_0", "q4_k", "ds4-q4", "ds4-q2"] {
            let case = format!("{fam} {recipe}");
            let q = dir.path().join(format!("{fam}-{recipe}.gguf"));
            let d = dir.path().join(format!("{fam}-{recipe}-f32.gguf"));
            ok(
                &fixture(src),
                &q,
                &["--recipe", recipe, "--allow-no-imatrix"],
            );
            ok(&q, &d, &["--recipe", "f32"]);
            let (gq, gd) = (Gguf::open(&q).unwrap(), Gguf::open(&d).unwrap());
            assert!(!block_types(&gq).is_empty(), "{case}: no block type");
            assert!(block_types(&gd).is_empty(), "{case}: f32 file has blocks");
            assert_eq!(gq.order, gd.order, "{case}");
            let got = logits(&LoadedModel::load(&q).unwrap());
            let want = logits(&LoadedModel::load(&d).unwrap());
            close(&case, &got, &want, 1e-5);
        }
    }
}

/// A llama directory large enough that IQ2_XXS takes seconds on one
/// thread: 6 layers, hidden 256, FFN 2048, pseudo-random f32 weights
/// (43 MB).
fn slow_llama() -> tempfile::TempDir {
    let (hidden, ffn, vocab, layers) = (256usize, 2048usize, 256usize, 6);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut data = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1).to_le_bytes()
            })
            .collect()
    };
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![vocab, hidden]),
        ("lm_head.weight".to_string(), vec![vocab, hidden]),
        ("model.norm.weight".to_string(), vec![hidden]),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (n, s) in [
            ("self_attn.q_proj", vec![hidden, hidden]),
            ("self_attn.k_proj", vec![hidden / 2, hidden]),
            ("self_attn.v_proj", vec![hidden / 2, hidden]),
            ("self_attn.o_proj", vec![hidden, hidden]),
            ("mlp.gate_proj", vec![ffn, hidden]),
            ("mlp.up_proj", vec![ffn, hidden]),
            ("mlp.down_proj", vec![hidden, ffn]),
            ("input_layernorm", vec![hidden]),
            ("post_attention_layernorm", vec![hidden]),
        ] {
            t.push((format!("{p}.{n}.weight"), s));
        }
    }
    let tensors: Vec<_> = t
        .into_iter()
        .map(|(n, s)| {
            let d = data(s.iter().product());
            (n, s, d)
        })
        .collect();
    let dir = f32_dir(&fixture("llama/tiny/f32_untied"), &tensors);
    let config = dir.path().join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    for (k, v) in [
        ("hidden_size", hidden),
        ("intermediate_size", ffn),
        ("vocab_size", vocab),
        ("num_hidden_layers", layers),
        ("num_attention_heads", 8),
        ("num_key_value_heads", 4),
        ("head_dim", 32),
    ] {
        c[k] = v.into();
    }
    std::fs::write(&config, serde_json::to_vec(&c).unwrap()).unwrap();
    dir
}

/// Ctrl+C while tensors are being written: the command fails saying so,
/// and neither the target nor its temporary file is left.
#[test]
fn an_interrupted_run_leaves_no_file() {
    let src = slow_llama();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("i.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ds4server"))
        .arg("quantize")
        .arg(src.path())
        .arg(&out)
        .args(["--recipe", "q8_0", "--threads", "1", "--allow-no-imatrix"])
        .args(["--type", "ffn=IQ2_XXS", "--type", "ffn-down=IQ2_XXS"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !partial(&out).exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "finished before writing"
        );
        assert!(start.elapsed().as_secs() < 60, "no temporary file");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(!out.exists() && !partial(&out).exists(), "{err}");
}
