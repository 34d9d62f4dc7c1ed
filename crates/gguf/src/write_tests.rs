//! The writer against the crate's own reader, and byte for byte against a
//! file gguf-py wrote (`tests/fixtures/gguf/gguf_py_writer.gguf`, made by
//! `tools/oracle/gguf/write_reference.py`).

use super::*;
use crate::{Gguf, GgufError};

fn kv(k: &str, v: Value) -> (String, Value) {
    (k.to_string(), v)
}

fn plan(name: &str, dims: &[usize], ty: u32) -> TensorPlan {
    TensorPlan {
        name: name.into(),
        dims: dims.to_vec(),
        ggml_type: ty,
    }
}

/// Every metadata value type, nested arrays and an empty one.
fn all_values() -> Vec<(String, Value)> {
    vec![
        kv("general.architecture", Value::String("llama".into())),
        kv("u8", Value::U8(200)),
        kv("i8", Value::I8(-100)),
        kv("u16", Value::U16(65000)),
        kv("i16", Value::I16(-32000)),
        kv("u32", Value::U32(4_000_000_000)),
        kv("i32", Value::I32(-2_000_000_000)),
        kv("u64", Value::U64(u64::MAX - 1)),
        kv("i64", Value::I64(i64::MIN + 1)),
        kv("f32", Value::F32(-1.5e-7)),
        kv("f64", Value::F64(std::f64::consts::PI)),
        kv("bool", Value::Bool(true)),
        kv(
            "string",
            Value::String("ünïcode ｜end▁of▁sentence｜".into()),
        ),
        kv(
            "strings",
            Value::Array(vec![
                Value::String("a".into()),
                Value::String(String::new()),
            ]),
        ),
        kv("ints", Value::Array((0..5).map(Value::I32).collect())),
        kv(
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::F32(1.0), Value::F32(2.0)]),
                Value::Array(vec![Value::F32(3.0)]),
            ]),
        ),
        kv("empty", Value::Array(vec![])),
    ]
}

fn write_to_file(
    dir: &tempfile::TempDir,
    meta: &[(String, Value)],
    tensors: &[TensorPlan],
    data: &[Vec<u8>],
    chunk: usize,
) -> std::path::PathBuf {
    let p = dir.path().join("w.gguf");
    let f = std::fs::File::create(&p).unwrap();
    let mut w = GgufWriter::new(std::io::BufWriter::new(f), meta, tensors).unwrap();
    for d in data {
        for c in d.chunks(chunk) {
            w.write(c).unwrap();
        }
    }
    assert!(w.current().is_none());
    w.finish().unwrap();
    p
}

fn bytes_of(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

#[test]
fn round_trips_metadata_and_tensors_through_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let meta = all_values();
    // F32 [3, 5] (60 bytes: padded), Q8_0 [2, 64] (136 bytes), F16 [7]
    // (14 bytes), IQ2_XXS [2, 256] (a type other readers lack), 3-D Q4_K.
    let tensors = vec![
        plan("a", &[3, 5], 0),
        plan("b.weight", &[2, 64], 8),
        plan("c", &[7], 1),
        plan("d", &[2, 256], 16),
        plan("e", &[2, 3, 256], 12),
    ];
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| bytes_of(tensor_bytes(t.ggml_type, &t.dims).unwrap(), i as u8))
        .collect();
    for chunk in [1, 7, 4096] {
        let p = write_to_file(&dir, &meta, &tensors, &data, chunk);
        let g = Gguf::open(&p).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment, 32);
        assert_eq!(
            g.keys,
            meta.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
        );
        for (k, v) in &meta {
            // (candle's `Value` has no `PartialEq`; `Debug` prints every bit.)
            assert_eq!(format!("{:?}", g.metadata[k]), format!("{v:?}"), "{k}");
        }
        assert_eq!(g.order, ["a", "b.weight", "c", "d", "e"]);
        for (t, d) in tensors.iter().zip(&data) {
            let info = &g.tensors[&t.name];
            assert_eq!(info.dims, t.dims);
            assert_eq!(info.ggml_type, t.ggml_type);
            assert_eq!(info.offset % 32, 0);
            assert_eq!(g.bytes(info), &d[..], "{}", t.name);
        }
        let size = std::fs::metadata(&p).unwrap().len();
        assert_eq!(planned_size(&meta, &tensors).unwrap(), size);
        assert_eq!(size % 32, 0, "the last tensor is padded too");
    }
}

#[test]
fn honours_general_alignment() {
    let dir = tempfile::tempdir().unwrap();
    let meta = vec![kv("general.alignment", Value::U32(256))];
    let tensors = vec![plan("a", &[3], 0), plan("b", &[5], 0)];
    let data = vec![bytes_of(12, 1), bytes_of(20, 2)];
    let p = write_to_file(&dir, &meta, &tensors, &data, 5);
    let g = Gguf::open(&p).unwrap();
    assert_eq!(g.alignment, 256);
    assert_eq!(g.data_offset % 256, 0);
    assert_eq!(g.tensors["b"].offset - g.tensors["a"].offset, 256);
    assert_eq!(g.bytes(&g.tensors["b"]), &data[1][..]);

    let bad = vec![kv("general.alignment", Value::U32(48))];
    let e = GgufWriter::new(Vec::new(), &bad, &tensors).unwrap_err();
    assert!(e.to_string().contains("general.alignment"), "{e}");
    let bad = vec![kv("general.alignment", Value::U64(64))];
    assert!(GgufWriter::new(Vec::new(), &bad, &tensors).is_err());
}

#[test]
fn refuses_bad_plans_before_writing() {
    let err = |meta: &[(String, Value)], t: &[TensorPlan]| {
        let mut out = Vec::new();
        let e = GgufWriter::new(&mut out, meta, t).unwrap_err().to_string();
        assert!(out.is_empty(), "nothing written for: {e}");
        e
    };
    let e = err(&[], &[plan("a", &[3, 33], 8)]);
    assert!(e.contains("\"a\"") && e.contains("whole blocks"), "{e}");
    let e = err(&[], &[plan("a", &[4], 0), plan("a", &[4], 0)]);
    assert!(e.contains("appears twice"), "{e}");
    let e = err(&[], &[plan("x", &[4], 77)]);
    assert!(e.contains("unknown GGML type id 77"), "{e}");
    let e = err(&[], &[plan("x", &[1, 1, 1, 1, 1], 0)]);
    assert!(e.contains("5 dimensions"), "{e}");
    let e = err(&[kv("k", Value::U8(1)), kv("k", Value::U8(2))], &[]);
    assert!(e.contains("\"k\"") && e.contains("twice"), "{e}");
    let mixed = Value::Array(vec![Value::U8(1), Value::String("x".into())]);
    let e = err(&[kv("m", mixed)], &[]);
    assert!(e.contains("one type"), "{e}");
}

#[test]
fn data_must_come_whole_and_in_order() {
    let tensors = vec![plan("a", &[2], 0), plan("b", &[1], 0)];
    let mut w = GgufWriter::new(Vec::new(), &[], &tensors).unwrap();
    // 12 bytes would cross from a (8) into b.
    let e = w.write(&[0; 12]).unwrap_err().to_string();
    assert!(e.contains("\"a\"") && e.contains("8 more"), "{e}");
    w.write(&[0; 8]).unwrap();
    assert_eq!(
        w.current().map(|(p, left)| (p.name.as_str(), left)),
        Some(("b", 4))
    );
    // Finishing with b missing is refused and names it.
    let e = w.finish().unwrap_err().to_string();
    assert!(e.contains("\"b\"") && e.contains("4 bytes"), "{e}");

    let mut w = GgufWriter::new(Vec::new(), &[], &tensors).unwrap();
    w.write(&[1; 8]).unwrap();
    w.write(&[2; 4]).unwrap();
    let e = w.write(&[3]).unwrap_err().to_string();
    assert!(e.contains("after the last tensor"), "{e}");
    let out = w.finish().unwrap();
    assert_eq!(out.len() as u64, planned_size(&[], &tensors).unwrap());
}

#[test]
fn a_truncated_write_is_refused_by_the_reader() {
    // What a crash half way leaves: the header promises more than the file
    // holds, and the reader names the tensor.
    let tensors = vec![plan("a", &[64], 0), plan("big", &[1024], 0)];
    let mut w = GgufWriter::new(Vec::new(), &[], &tensors).unwrap();
    w.write(&[0; 256]).unwrap();
    w.write(&[0; 100]).unwrap();
    let partial = w.out.clone();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.gguf");
    std::fs::write(&p, partial).unwrap();
    match Gguf::open(&p) {
        Err(GgufError::Malformed { message, .. }) => {
            assert!(
                message.contains("\"big\"") && message.contains("truncated"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn matches_gguf_py_byte_for_byte() {
    // tools/oracle/gguf/write_reference.py: the same keys and tensors
    // through gguf-py's GGUFWriter.
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gguf/gguf_py_writer.gguf");
    let want = std::fs::read(&fixture).unwrap();
    let s = |v: &str| Value::String(v.into());
    let meta = vec![
        kv("general.architecture", s("llama")),
        kv("t.u8", Value::U8(200)),
        kv("t.i8", Value::I8(-100)),
        kv("t.u16", Value::U16(65000)),
        kv("t.i16", Value::I16(-32000)),
        kv("t.u32", Value::U32(4_000_000_000)),
        kv("t.i32", Value::I32(-2_000_000_000)),
        kv("t.u64", Value::U64(u64::MAX - 1)),
        kv("t.i64", Value::I64(i64::MIN + 1)),
        kv("t.f32", Value::F32(-1.5e-7)),
        kv("t.f64", Value::F64(std::f64::consts::PI)),
        kv("t.bool", Value::Bool(true)),
        kv("t.string", s("ünïcode ｜end▁of▁sentence｜")),
        kv("t.strings", Value::Array(vec![s("a"), s(""), s("bc")])),
        kv("t.ints", Value::Array((0..5).map(Value::I32).collect())),
        kv(
            "t.floats",
            Value::Array(vec![Value::F32(1.0), Value::F32(-2.5)]),
        ),
        kv(
            "t.bools",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
    ];
    let tensors = vec![
        plan("a", &[3, 5], 0),
        plan("b.weight", &[2, 64], 8),
        plan("c", &[7], 1),
        plan("d", &[2, 256], 16),
        plan("e", &[2, 3, 32], 8),
    ];
    let pattern =
        |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| ((i * 31) % 256) as u8 ^ seed).collect() };
    let mut w = GgufWriter::new(Vec::new(), &meta, &tensors).unwrap();
    for (i, t) in tensors.iter().enumerate() {
        w.write(&pattern(
            tensor_bytes(t.ggml_type, &t.dims).unwrap(),
            i as u8,
        ))
        .unwrap();
    }
    let got = w.finish().unwrap();
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("first difference at byte {i}");
    }
}
