//! Strict binding: broken checkpoints built from the tiny fixture in a
//! temporary directory must fail with errors that name the file and the
//! tensor or field, and `inspect` / `detect` describe both formats.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::tiny;
use ds4_engine::EngineError;
use ds4_engine::families::llama::load_llama;
use ds4_engine::inspect::inspect;
use ds4_engine::load::{ModelFormat, detect};
use safetensors::{Dtype, SafeTensors, View};

/// Copy a tiny checkpoint into a fresh temporary directory.
fn copy_of(variant: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(variant);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(tiny(variant)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

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

/// Rewrite `file` after `edit` changes its tensor table.
fn rewrite(file: &Path, edit: impl FnOnce(&mut BTreeMap<String, Raw>)) {
    let bytes = std::fs::read(file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut map: BTreeMap<String, Raw> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                Raw {
                    dtype: v.dtype(),
                    shape: v.shape().to_vec(),
                    data: v.data().to_vec(),
                },
            )
        })
        .collect();
    edit(&mut map);
    let out = safetensors::serialize(map.iter().map(|(k, v)| (k.clone(), v)), None).unwrap();
    std::fs::write(file, out).unwrap();
}

fn load_err(dir: &Path) -> (EngineError, String) {
    let e = load_llama(dir).expect_err("broken checkpoint must not load");
    let msg = e.to_string();
    (e, msg)
}

#[test]
fn missing_tensor_is_named() {
    let (_tmp, dir) = copy_of("f32_untied");
    rewrite(&dir.join("model.safetensors"), |m| {
        m.remove("model.layers.1.mlp.up_proj.weight");
    });
    let (e, msg) = load_err(&dir);
    assert!(matches!(e, EngineError::Tensor { .. }), "{msg}");
    assert!(
        msg.contains("model.layers.1.mlp.up_proj.weight") && msg.contains("missing"),
        "{msg}"
    );
    assert!(msg.contains(&dir.display().to_string()), "{msg}");
}

#[test]
fn wrong_shape_names_file_tensor_and_shapes() {
    let (_tmp, dir) = copy_of("f32_untied");
    rewrite(&dir.join("model.safetensors"), |m| {
        let t = m.get_mut("model.layers.0.self_attn.k_proj.weight").unwrap();
        t.shape = vec![t.shape[1], t.shape[0]];
    });
    let (_, msg) = load_err(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");
    assert!(
        msg.contains("model.layers.0.self_attn.k_proj.weight"),
        "{msg}"
    );
    assert!(msg.contains("expected [16, 32], found [32, 16]"), "{msg}");
}

#[test]
fn extra_tensor_is_an_error_but_ignored_set_is_not() {
    let (_tmp, dir) = copy_of("f32_untied");
    rewrite(&dir.join("model.safetensors"), |m| {
        let norm = &m["model.norm.weight"];
        let copy = Raw {
            dtype: norm.dtype,
            shape: norm.shape.clone(),
            data: norm.data.clone(),
        };
        m.insert(
            "model.layers.0.self_attn.rotary_emb.inv_freq".into(),
            Raw {
                dtype: Dtype::F32,
                shape: vec![4],
                data: vec![0; 16],
            },
        );
        m.insert("model.extra_norm.weight".into(), copy);
    });
    let (_, msg) = load_err(&dir);
    assert!(
        msg.contains("model.extra_norm.weight") && msg.contains("not used"),
        "{msg}"
    );
    assert!(
        !msg.contains("inv_freq"),
        "the documented ignore set is allowed: {msg}"
    );
}

#[test]
fn sharded_index_mismatch_names_the_index() {
    let (_tmp, dir) = copy_of("f32_sharded");
    let index = dir.join("model.safetensors.index.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    let map = json["weight_map"].as_object_mut().unwrap();
    let (name, file) = map
        .iter()
        .next()
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap();
    let other = map.values().find(|v| **v != file).unwrap().clone();
    map.insert(name.clone(), other);
    std::fs::write(&index, serde_json::to_string(&json).unwrap()).unwrap();
    let (_, msg) = load_err(&dir);
    assert!(
        msg.contains("model.safetensors.index.json") && msg.contains(&name),
        "{msg}"
    );
}

#[test]
fn bad_config_fields_are_named() {
    for (field, value, expect) in [
        (
            "num_key_value_heads",
            serde_json::json!(3),
            "num_key_value_heads",
        ),
        ("hidden_size", serde_json::json!("wide"), "hidden_size"),
        ("model_type", serde_json::json!("gpt2"), "model_type"),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
            "rope_parameters.rope_type",
        ),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
            "rope_parameters.low_freq_factor",
        ),
    ] {
        let (_tmp, dir) = copy_of("f32_untied");
        let path = dir.join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json[field] = value;
        std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
        let (e, msg) = load_err(&dir);
        assert!(matches!(e, EngineError::Config { .. }), "{msg}");
        assert!(
            msg.contains("config.json") && msg.contains(&format!("`{expect}`")),
            "{field}: {msg}"
        );
    }
}

#[test]
fn detect_and_inspect_hf_dirs() {
    assert_eq!(detect(&tiny("bf16")).unwrap(), ModelFormat::HfDir);
    let info = inspect(&tiny("bf16")).unwrap();
    assert_eq!(info.family, Some("llama"));
    assert_eq!(info.dtype_histogram.get("BF16"), Some(&21));
    // embed + head 2·96·32, per layer 4·32·32/… computed from the shapes.
    let expect: u64 = info
        .tensors
        .iter()
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(info.parameter_count, expect);
    assert!(info.parameter_count > 2 * 96 * 32);
    assert_eq!(info.config["num_attention_heads"], 4);
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        detect(tmp.path())
            .unwrap_err()
            .to_string()
            .contains("config.json")
    );
    let junk = tmp.path().join("junk.bin");
    std::fs::write(&junk, b"not a model").unwrap();
    assert!(matches!(detect(&junk), Err(EngineError::File { .. })));
}

#[test]
fn default_model_inspect_reports_quant_types() {
    let path = ds4_models::default_model_path().expect("default model available");
    assert_eq!(detect(&path).unwrap(), ModelFormat::Gguf);
    let info = inspect(&path).unwrap();
    assert_eq!(info.family, Some("llama"));
    assert_eq!(info.dtype_histogram.get("Q4_1"), Some(&210));
    assert_eq!(info.dtype_histogram.get("F32"), Some(&61));
    assert_eq!(info.dtype_histogram.get("Q8_0"), Some(&1));
    assert_eq!(info.config["llama.block_count"], 30);
    // 134.5 M parameters (tied head counted once).
    assert!(
        (134_000_000..135_000_000).contains(&info.parameter_count),
        "{}",
        info.parameter_count
    );
}

/// The family comes from the file's own metadata: a GGUF whose
/// `general.architecture` no registered family loads is refused with the
/// architecture and the supported list named, instead of being read as
/// llama; an HF directory is recognised by `model_type` the same way.
#[test]
fn gguf_architecture_picks_the_family_and_unknown_ones_are_named() {
    use candle_core::quantized::gguf_file::{Value, write};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.gguf");
    let t = Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, GgmlDType::F32).unwrap();
    let arch = Value::String("qwen2".into());
    let mut f = std::fs::File::create(&path).unwrap();
    write(
        &mut f,
        &[("general.architecture", &arch)],
        &[("token_embd.weight", &q)],
    )
    .unwrap();
    drop(f);
    let Err(e) = ds4_engine::families::detect(&path) else {
        panic!("a qwen2 GGUF must not load as any registered family");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("`qwen2`") && msg.contains("general.architecture"),
        "{msg}"
    );
    assert!(msg.contains("llama"), "the supported list is named: {msg}");
    assert!(ds4_engine::families::LoadedModel::load(&path).is_err());
    // The tiny HF llama is recognised by model_type.
    let (family, format) = ds4_engine::families::detect(&tiny("f32_untied")).unwrap();
    assert_eq!(
        (family.descriptor.name, format),
        ("llama", ModelFormat::HfDir)
    );
}

/// GLM-5 (`glm5_next`): a broken tiny checkpoint names the tensor or the
/// field; the family is detected from `model_type`.
#[test]
fn glm5_next_binding_errors_name_the_tensor() {
    use ds4_engine::families::glm5_next::Glm5NextModel;
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/glm5_next/tiny_a");
    let copy = || {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tiny_a");
        std::fs::create_dir(&dir).unwrap();
        for entry in std::fs::read_dir(&src).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        (tmp, dir)
    };
    let p = "model.language_model.layers";
    let missing = format!("{p}.1.self_attn.indexer.index_kpool_compress_ape");
    let reshaped = format!("{p}.0.self_attn.q_conv1d.weight");
    let nextn = format!("{p}.6.hnorm.weight");
    // A shared-indexer layer has no indexer: such a tensor is unused.
    let stray = format!("{p}.2.self_attn.indexer.wk.weight");
    type Edit = Box<dyn Fn(&mut BTreeMap<String, Raw>)>;
    let (m1, r1, n1, s1) = (
        missing.clone(),
        reshaped.clone(),
        nextn.clone(),
        stray.clone(),
    );
    let cases: Vec<(Edit, &str, &str)> = vec![
        (
            Box::new(move |m| drop(m.remove(&m1))),
            missing.as_str(),
            "missing",
        ),
        (
            Box::new(move |m| {
                let t = m.get_mut(&r1).unwrap();
                t.shape = vec![t.shape[0] / 2, 1, 2 * t.shape[2]];
            }),
            reshaped.as_str(),
            "expected",
        ),
        (
            Box::new(move |m| drop(m.remove(&n1))),
            nextn.as_str(),
            "missing",
        ),
        (
            Box::new(move |m| {
                let wk = &m[&format!("{p}.1.self_attn.indexer.wk.weight")];
                let copy = Raw {
                    dtype: wk.dtype,
                    shape: wk.shape.clone(),
                    data: wk.data.clone(),
                };
                m.insert(s1.clone(), copy);
            }),
            stray.as_str(),
            "not used",
        ),
    ];
    for (edit, tensor, what) in cases {
        let (_tmp, dir) = copy();
        rewrite(&dir.join("model.safetensors"), |m| edit(m));
        let Err(e) = Glm5NextModel::from_hf_dir(&dir) else {
            panic!("{tensor}: a broken checkpoint must not load");
        };
        let msg = e.to_string();
        assert!(
            msg.contains(tensor) && msg.contains(what),
            "{tensor}: {msg}"
        );
    }
    // A config the model cannot run names the field inside text_config.
    let (_tmp, dir) = copy();
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["text_config"]["indexer_types"][1] = serde_json::json!("shared");
    std::fs::write(&path, serde_json::to_string(&json).unwrap()).unwrap();
    let Err(e) = Glm5NextModel::from_hf_dir(&dir) else {
        panic!("a shared layer after a KDA layer must be refused");
    };
    assert!(matches!(e, EngineError::Config { .. }));
    assert!(
        e.to_string().contains("`text_config.indexer_types[1]`"),
        "{e}"
    );
    // Detection by model_type, both layouts.
    for variant in ["tiny_a", "tiny_b"] {
        let dir = src.parent().unwrap().join(variant);
        let (family, format) = ds4_engine::families::detect(&dir).unwrap();
        assert_eq!(
            (family.descriptor.name, format),
            ("glm5_next", ModelFormat::HfDir)
        );
    }
}
