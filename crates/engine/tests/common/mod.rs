//! Fixture access shared by the llama integration tests.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llama")
}

pub fn tiny(variant: &str) -> PathBuf {
    fixtures().join("tiny").join(variant)
}

/// A reference tensor file: name → (shape, values as f64).
pub struct Reference {
    tensors: HashMap<String, (Vec<usize>, Vec<f64>)>,
}

impl Reference {
    pub fn open(path: &std::path::Path) -> Self {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let st = SafeTensors::deserialize(&bytes).expect("reference fixture is valid safetensors");
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f64> = match view.dtype() {
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                Dtype::I64 => data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                    .collect(),
                other => panic!("unexpected fixture dtype {other:?}"),
            };
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        Self { tensors }
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (s, v) = &self.tensors[name];
        (s.clone(), v.iter().map(|&x| x as f32).collect())
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.tensors[name].1.iter().map(|&x| x as u32).collect()
    }
}

pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn log_sum_exp(row: &[f32]) -> f64 {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln()
}

/// Top-1 minus top-2 value of a row.
pub fn top2_margin(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in row {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Largest difference between two exported state tables (names, shapes and
/// integer tensors must match exactly).
pub fn table_max_diff(
    what: &str,
    a: Vec<ds4_engine::table::NamedTensor>,
    b: Vec<ds4_engine::table::NamedTensor>,
) -> f32 {
    use ds4_engine::table::TensorData;
    assert_eq!(a.len(), b.len(), "{what}: table sizes");
    let mut d = 0f32;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((&x.name, &x.shape), (&y.name, &y.shape), "{what}");
        match (&x.data, &y.data) {
            (TensorData::F32(p), TensorData::F32(q)) => d = d.max(max_abs_diff(p, q)),
            (p, q) => assert_eq!(p, q, "{what}: {}", x.name),
        }
    }
    d
}
