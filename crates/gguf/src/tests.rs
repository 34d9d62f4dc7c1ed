//! The parser against files written here byte by byte.

use super::*;

/// A minimal GGUF v3 writer: string metadata, then tensors given as
/// (name, row-major dims, type id, data).
fn write(meta: &[(&str, &str)], tensors: &[(&str, Vec<usize>, u32, Vec<u8>)]) -> Vec<u8> {
    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend_from_slice(&(v.len() as u64).to_le_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        s(&mut out, k);
        out.extend_from_slice(&8u32.to_le_bytes());
        s(&mut out, v);
    }
    let mut off = 0u64;
    for (name, dims, ty, data) in tensors {
        s(&mut out, name);
        out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims.iter().rev() {
            out.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&off.to_le_bytes());
        off += (data.len() as u64).div_ceil(32) * 32;
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    for (_, _, _, data) in tensors {
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(32) * 32, 0);
    }
    out
}

fn open(bytes: &[u8]) -> Result<Gguf, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, bytes).unwrap();
    Gguf::open(&p)
}

#[test]
fn reads_types_other_readers_lack() {
    // One IQ2_XXS row of 256 values (66 bytes) and one MXFP4 row of 64.
    let iq2: Vec<u8> = (0..66).collect();
    let mx: Vec<u8> = (0..34).map(|i| i as u8 ^ 0x5a).collect();
    let f = write(
        &[("general.architecture", "deepseek4")],
        &[
            ("a", vec![1, 256], 16, iq2.clone()),
            ("b", vec![1, 64], 39, mx.clone()),
        ],
    );
    let g = open(&f).unwrap();
    assert_eq!(g.order, ["a", "b"]);
    let a = &g.tensors["a"];
    assert_eq!((a.dims.as_slice(), a.ggml_type), (&[1, 256][..], 16));
    assert_eq!(g.bytes(a), &iq2[..]);
    assert_eq!(g.bytes(&g.tensors["b"]), &mx[..]);
    assert!(matches!(
        g.metadata.get("general.architecture"),
        Some(Value::String(s)) if s == "deepseek4"
    ));
}

#[test]
fn a_truncated_file_is_refused_naming_the_tensor() {
    let f = write(&[], &[("w", vec![4, 32], 8, vec![7; 4 * 34])]);
    let err = open(&f[..f.len() - 40]).unwrap_err().to_string();
    assert!(err.contains("\"w\"") && err.contains("truncated"), "{err}");
    // Cut inside the header.
    let err = open(&f[..20]).unwrap_err().to_string();
    assert!(err.contains("truncated"), "{err}");
}

#[test]
fn unknown_type_ids_and_bad_headers_are_named() {
    let f = write(&[], &[("w", vec![1, 32], 77, vec![0; 32])]);
    let err = open(&f).unwrap_err().to_string();
    assert!(err.contains("unknown GGML type id 77"), "{err}");
    let mut bad = write(&[], &[]);
    bad[0] = b'X';
    assert!(matches!(open(&bad), Err(GgufError::Magic { .. })));
    let mut v1 = write(&[], &[]);
    v1[4] = 1;
    assert!(matches!(
        open(&v1),
        Err(GgufError::Version { version: 1, .. })
    ));
    // A tensor count no file could hold is refused before any allocation.
    let mut huge = write(&[], &[]);
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        open(&huge)
            .unwrap_err()
            .to_string()
            .contains("tensor count")
    );
}

#[test]
fn partial_blocks_are_refused() {
    // 40 values are not whole Q8_0 blocks of 32.
    let f = write(&[], &[("w", vec![1, 40], 8, vec![0; 34])]);
    let err = open(&f).unwrap_err().to_string();
    assert!(err.contains("not whole blocks"), "{err}");
}
