//! Quantization against llama.cpp's own C quantizers: the committed
//! fixtures `tests/fixtures/quant/quantize/` (made by
//! `tools/oracle/quant/quantize.py` from ggml-quants.c of the
//! llama-cpp-python 0.3.36 sdist) hold rows, an importance vector and the
//! blocks `quantize_<type>` wrote for them; `quant::quantize::rows` must
//! write the same bytes, with and without importance. The rows include the
//! searches' corner cases (all zero, one huge outlier, all equal, f32
//! subnormals, scales in f16's subnormal range, one sign only, rounding ties,
//! sparse, mixed group magnitudes, values whose squares and sums overflow
//! f32), so equal bytes mean equal branches; `stress.json` adds the hashes of
//! 1024 generated rows per type and path.
//!
//! Then the blocks must dequantize back near the input: a wrong layout that
//! happened to match nothing else would fail there.

use std::path::PathBuf;

use ds4_engine::quant::WeightType;
use ds4_engine::quant::dequant;
use ds4_engine::quant::quantize::{self, QuantizeError};
use safetensors::SafeTensors;

/// A fixture: `rows` rows of `row_len` values, the importance (in the
/// `_imatrix` files) and the C's blocks.
struct Fixture {
    row_len: usize,
    values: Vec<f32>,
    importance: Option<Vec<f32>>,
    blocks: Vec<u8>,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn fixture(name: &str) -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/quant/quantize")
        .join(format!("{name}.safetensors"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let values = st.tensor("values").unwrap();
    let blocks = st.tensor("blocks").unwrap();
    assert_eq!(values.dtype(), safetensors::Dtype::F32, "{name}");
    assert_eq!(blocks.dtype(), safetensors::Dtype::U8, "{name}");
    assert_eq!(values.shape()[0], blocks.shape()[0], "{name}: row counts");
    let importance = st.tensor("importance").ok().map(|t| {
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        f32s(t.data())
    });
    Fixture {
        row_len: values.shape()[1],
        values: f32s(values.data()),
        importance,
        blocks: blocks.data().to_vec(),
    }
}

/// Asserts equal bytes, naming the first differing blocks (row, block in
/// the row, byte in the block).
fn assert_same_blocks(what: &str, ty: WeightType, row_len: usize, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: byte count");
    let bb = ty.block_bytes();
    let per_row = row_len / ty.block_len();
    let bad: Vec<String> = got
        .chunks(bb)
        .zip(want.chunks(bb))
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .map(|(i, (g, w))| {
            let at = g.iter().zip(w.iter()).position(|(a, b)| a != b).unwrap();
            format!(
                "row {} block {} byte {at}: got {:02x?}, want {:02x?}",
                i / per_row,
                i % per_row,
                &g[at..(at + 8).min(bb)],
                &w[at..(at + 8).min(bb)]
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} of {} blocks differ from llama.cpp:\n{}",
        bad.len(),
        got.len() / bb,
        bad[..bad.len().min(12)].join("\n")
    );
}

/// The fixture's rows without importance must give the C's `_ref` bytes.
fn check_ref(name: &str, ty: WeightType) -> Fixture {
    let f = fixture(name);
    assert!(f.importance.is_none(), "{name}");
    let got = quantize::rows(ty, &f.values, f.row_len, None).unwrap();
    assert_same_blocks(name, ty, f.row_len, &got, &f.blocks);
    f
}

/// The `_imatrix` fixture's rows with its importance must give the C's
/// `quantize_<type>(…, quant_weights)` bytes.
fn check_imatrix(name: &str, ty: WeightType) -> Fixture {
    let name = format!("{name}_imatrix");
    let f = fixture(&name);
    let w = f
        .importance
        .as_deref()
        .expect("an _imatrix fixture has importance");
    let got = quantize::rows(ty, &f.values, f.row_len, Some(w)).unwrap();
    assert_same_blocks(&name, ty, f.row_len, &got, &f.blocks);
    f
}

/// Fixture rows drawn from smooth distributions (|N(0, 0.05)| both signs,
/// uniform ±1, N(0, 0.02), N(0.01, 0.02)), where a type's error is its
/// typical one; see `edge_rows` in quantize.py.
const SMOOTH_ROWS: [usize; 5] = [8, 9, 13, 14, 15];

/// Dequantizes `blocks` and bounds each smooth row's relative RMS error by
/// `tol`, over the columns of nonzero importance where the search used one
/// (it may spend no bits on the others); the all-zero row (row 0) must come
/// back exactly zero.
fn check_round_trip(what: &str, ty: WeightType, f: &Fixture, blocks: &[u8], tol: f32) {
    let w: Vec<f32> = match &f.importance {
        Some(imp) => imp
            .iter()
            .map(|&v| if v > 0.0 { 1.0 } else { 0.0 })
            .collect(),
        None => vec![1.0; f.row_len],
    };
    let mut back = vec![0.0f32; f.values.len()];
    dequant::blocks(ty, blocks, &mut back);
    assert!(
        back[..f.row_len].iter().all(|&v| v == 0.0),
        "{what}: zero row"
    );
    for r in SMOOTH_ROWS {
        let x = &f.values[r * f.row_len..(r + 1) * f.row_len];
        let y = &back[r * f.row_len..(r + 1) * f.row_len];
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for ((&a, &b), &w) in x.iter().zip(y).zip(&w) {
            err += w as f64 * ((a - b) as f64).powi(2);
            norm += w as f64 * (a as f64).powi(2);
        }
        let rel = (err / norm).sqrt() as f32;
        assert!(
            rel <= tol,
            "{what}: row {r} relative RMS error {rel:.4} > {tol}"
        );
    }
}

/// A type with both paths: each byte-identical, each round trip in bounds.
/// The bounds are about 1.4× the largest error llama.cpp's blocks show on
/// these rows (a type's bits decide its error: Q8 ≈ 0.5 %, Q6 ≈ 2 %, Q4 ≈
/// 8 %, Q2 ≈ 30 %, IQ2_XXS ≈ 39 %).
fn check_both(name: &str, ty: WeightType, tol: f32) {
    let f = check_ref(name, ty);
    check_round_trip(name, ty, &f, &f.blocks, tol);
    let f = check_imatrix(name, ty);
    check_round_trip(&format!("{name}_imatrix"), ty, &f, &f.blocks, tol);
}

/// A type without an importance path: byte-identical, an importance
/// changes nothing (as in the C), round trip in bounds.
fn check_ref_only(name: &str, ty: WeightType, tol: f32) {
    let f = check_ref(name, ty);
    let w = vec![0.5f32; f.row_len];
    let with = quantize::rows(ty, &f.values, f.row_len, Some(&w)).unwrap();
    assert_eq!(with, f.blocks, "{name}: importance must be ignored");
    check_round_trip(name, ty, &f, &f.blocks, tol);
}

#[test]
fn q8_0_matches_llama_cpp() {
    check_ref_only("q8_0", WeightType::Q8_0, 0.008);
}

#[test]
fn q4_0_matches_llama_cpp() {
    check_both("q4_0", WeightType::Q4_0, 0.13);
}

#[test]
fn q4_1_matches_llama_cpp() {
    check_both("q4_1", WeightType::Q4_1, 0.11);
}

#[test]
fn q5_0_matches_llama_cpp() {
    check_both("q5_0", WeightType::Q5_0, 0.07);
}

#[test]
fn q5_1_matches_llama_cpp() {
    check_both("q5_1", WeightType::Q5_1, 0.055);
}

#[test]
fn mxfp4_matches_llama_cpp() {
    check_ref_only("mxfp4", WeightType::MXFP4, 0.2);
}

#[test]
fn q2_k_matches_llama_cpp() {
    check_both("q2_k", WeightType::Q2_K, 0.45);
}

#[test]
fn q3_k_matches_llama_cpp() {
    check_both("q3_k", WeightType::Q3_K, 0.23);
}

#[test]
fn q4_k_matches_llama_cpp() {
    check_both("q4_k", WeightType::Q4_K, 0.11);
}

#[test]
fn q5_k_matches_llama_cpp() {
    check_both("q5_k", WeightType::Q5_K, 0.05);
}

#[test]
fn q6_k_matches_llama_cpp() {
    check_both("q6_k", WeightType::Q6_K, 0.03);
}

#[test]
fn q8_k_matches_llama_cpp() {
    check_ref_only("q8_k", WeightType::Q8_K, 0.011);
}

#[test]
fn iq2_xxs_matches_llama_cpp() {
    let f = check_imatrix("iq2_xxs", WeightType::IQ2_XXS);
    check_round_trip("iq2_xxs_imatrix", WeightType::IQ2_XXS, &f, &f.blocks, 0.55);
}

/// IQ4_NL's no-importance file is `quantize_iq4_nl(…, NULL)` (what
/// llama-quantize writes; its `_ref` searches fewer scales), checked the
/// same way as a `_ref`.
#[test]
fn iq4_nl_matches_llama_cpp() {
    check_both("iq4_nl", WeightType::IQ4_NL, 0.11);
}

/// IQ4_NL blocks load as a stored matrix and the CPU's product (the
/// reference path: exactly dequantized rows) has the bits of the f32
/// product over the dequantized matrix, whatever the number of rows.
#[test]
fn iq4_nl_cpu_product_is_its_dequantized_f32_product() {
    use std::sync::Arc;

    use ds4_engine::backend::{Backend, CpuOps, HostWeight};
    use ds4_engine::quant::random::random_stored;
    let (n, k) = (24, 256);
    let ops = CpuOps;
    let q = random_stored(WeightType::IQ4_NL, &[n, k], &[n], 48);
    let deq = q.to_f32_vec();
    assert!(deq.iter().all(|v| v.is_finite()) && deq.iter().any(|v| *v != 0.0));
    let f = candle_core::Tensor::from_vec(deq, (n, k), &candle_core::Device::Cpu).unwrap();
    let sm = ops.matrix(HostWeight::Quant(Arc::new(q)), n, k).unwrap();
    let fm = ops.matrix(HostWeight::F32(f), n, k).unwrap();
    let x: Vec<f32> = (0..5 * k)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for rows in [1, 2, 5] {
        let xs = x[..rows * k].to_vec();
        assert_eq!(
            bits(ops.matmul(&xs, rows, &sm).unwrap()),
            bits(ops.matmul(&xs, rows, &fm).unwrap()),
            "{rows} rows"
        );
    }
}

/// Rows are independent: quantizing the rows one at a time gives the same
/// bytes as all at once (the importance paths use per-row statistics).
#[test]
fn rows_are_independent() {
    for (name, ty) in [("q4_0", WeightType::Q4_0), ("q2_k", WeightType::Q2_K)] {
        let f = fixture(&format!("{name}_imatrix"));
        let w = f.importance.as_deref();
        let one_by_one: Vec<u8> = f
            .values
            .chunks_exact(f.row_len)
            .flat_map(|row| quantize::rows(ty, row, f.row_len, w).unwrap())
            .collect();
        assert_eq!(one_by_one, f.blocks, "{name}");
    }
}

#[test]
fn errors() {
    let x = vec![0.25f32; 512];
    assert_eq!(
        quantize::rows(WeightType::Q4_K, &x, 128, None),
        Err(QuantizeError::PartialBlock {
            ty: WeightType::Q4_K,
            row_len: 128,
            block: 256
        })
    );
    assert_eq!(
        quantize::rows(WeightType::Q8_0, &x[..500], 100, None),
        Err(QuantizeError::PartialBlock {
            ty: WeightType::Q8_0,
            row_len: 100,
            block: 32
        })
    );
    assert_eq!(
        quantize::rows(WeightType::Q2_K, &x, 512, Some(&x[..256])),
        Err(QuantizeError::ImportanceLength {
            got: 256,
            want: 512
        })
    );
    assert_eq!(
        quantize::rows(WeightType::IQ2_XXS, &x, 256, None),
        Err(QuantizeError::NeedsImportance(WeightType::IQ2_XXS))
    );
    let mut bad = x.clone();
    bad[300] = f32::NAN;
    assert!(matches!(
        quantize::rows(WeightType::Q6_K, &bad, 256, None),
        Err(QuantizeError::NonFinite {
            what: "value",
            index: 300,
            ..
        })
    ));
    let mut w = vec![1.0f32; 256];
    w[7] = f32::INFINITY;
    assert!(matches!(
        quantize::rows(WeightType::IQ2_XXS, &x, 256, Some(&w)),
        Err(QuantizeError::NonFinite {
            what: "importance",
            index: 7,
            ..
        })
    ));
}

// ------------------------------------------------------------ the stress set

/// `splitmix64` outputs 1..=n from state `seed` (as `quantize.py`).
fn splitmix64(seed: u64, n: usize) -> Vec<u64> {
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    (1..=n as u64)
        .map(|k| {
            let mut z = seed.wrapping_add(GOLDEN.wrapping_mul(k));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        })
        .collect()
}

/// `[-1, 1)`: 23 random mantissa bits in `[1, 2)`, then `2u − 3`.
fn uniform(z: u64) -> f32 {
    f32::from_bits(0x3F80_0000 | (z >> 41) as u32) * 2.0 - 3.0
}

/// `stress_rows` of `quantize.py`: row `r`'s kind is `r % 6` (uniform, sum
/// of three uniforms, offset, 60 % zeros, product, one value ×64), scaled by
/// `2^e`, `e ∈ [−40, 12]`; every value from the same f32 operations in the
/// same order.
fn stress_rows(seed: u64, rows: usize, row_len: usize) -> Vec<f32> {
    let draws = 4 * row_len + 2;
    let z = splitmix64(seed, rows * draws);
    let mut out = Vec::with_capacity(rows * row_len);
    for (r, z) in z.chunks_exact(draws).enumerate() {
        let e = (z[4 * row_len] % 53) as i32 - 40;
        let s = f32::from_bits(((127 + e) as u32) << 23);
        let start = out.len();
        for c in 0..row_len {
            let u: [f32; 4] = std::array::from_fn(|k| uniform(z[k * row_len + c]));
            let g = (u[0] + u[1]) + u[2];
            out.push(match r % 6 {
                0 => u[0] * s,
                2 => (g + 0.5) * s,
                3 if u[3] > 0.2 => 0.0,
                4 => (g * u[3]) * s,
                _ => g * s,
            });
        }
        if r % 6 == 5 {
            let at = start + (z[4 * row_len + 1] % row_len as u64) as usize;
            out[at] *= 64.0;
        }
    }
    out
}

/// `stress_importance`: `(u + 1)^4`, zero where `u < −0.8`.
fn stress_importance(seed: u64, row_len: usize) -> Vec<f32> {
    splitmix64(seed, row_len)
        .into_iter()
        .map(|z| {
            let u = uniform(z);
            let t = u + 1.0;
            if u < -0.8 { 0.0 } else { (t * t) * (t * t) }
        })
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// 1024 generated rows of 512 per type and path, too many to commit: the
/// rows are regenerated here bit for bit (their hash is checked first) and
/// the blocks' sha256 must equal that of llama.cpp's
/// (`tests/fixtures/quant/quantize/stress.json`).
#[test]
fn stress_rows_match_llama_cpp() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/quant/quantize/stress.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let stress: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = stress["rows"].as_u64().unwrap() as usize;
    let row_len = stress["row_len"].as_u64().unwrap() as usize;
    let types = [
        ("q4_0", WeightType::Q4_0),
        ("q4_1", WeightType::Q4_1),
        ("q5_0", WeightType::Q5_0),
        ("q5_1", WeightType::Q5_1),
        ("q8_0", WeightType::Q8_0),
        ("mxfp4", WeightType::MXFP4),
        ("q2_k", WeightType::Q2_K),
        ("q3_k", WeightType::Q3_K),
        ("q4_k", WeightType::Q4_K),
        ("q5_k", WeightType::Q5_K),
        ("q6_k", WeightType::Q6_K),
        ("q8_k", WeightType::Q8_K),
        ("iq2_xxs", WeightType::IQ2_XXS),
        ("iq4_nl", WeightType::IQ4_NL),
    ];
    let mut failed = Vec::new();
    for (name, ty) in types {
        let entry = &stress["types"][name];
        let sha = &entry["sha256"];
        let values = stress_rows(entry["seed"].as_u64().unwrap(), rows, row_len);
        assert_eq!(
            sha256_hex(&f32_bytes(&values)),
            sha["values"].as_str().unwrap(),
            "{name}: the generated rows differ from quantize.py's"
        );
        // "plain": `quantize_<type>(…, NULL)` where that is not the `_ref`.
        if let Some(want) = sha["ref"].as_str().or(sha["plain"].as_str()) {
            let got = quantize::rows(ty, &values, row_len, None).unwrap();
            if sha256_hex(&got) != want {
                failed.push(format!("{name} without importance"));
            }
        }
        if let Some(want) = sha["imatrix"].as_str() {
            let w = stress_importance(entry["importance_seed"].as_u64().unwrap(), row_len);
            assert_eq!(
                sha256_hex(&f32_bytes(&w)),
                sha["importance"].as_str().unwrap(),
                "{name}: the generated importance differs from quantize.py's"
            );
            let got = quantize::rows(ty, &values, row_len, Some(&w)).unwrap();
            if sha256_hex(&got) != want {
                failed.push(format!("{name} with importance"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "blocks differ from llama.cpp's on the stress rows: {failed:?}"
    );
}
