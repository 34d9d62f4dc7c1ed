//! Resident memory of a GGUF load on the CPU: weights are read in place from
//! the memory map (K-quants) or repacked with the map's pages released
//! (Q8_0), so after a load and a forward that touches every weight the
//! process holds about the file, not the file plus a copy, and nothing in
//! f32. The file is a llama-architecture GGUF of random valid blocks written
//! here (Q4_K projections, Q6_K `ffn_down`, Q8_0 output: a K-quant mix);
//! its size is ~0.5 GB by default, `DS4_RSS_TEST_LAYERS` makes it larger
//! (e.g. 96 layers ≈ 4 GB) for a manual multi-GB run.

use std::io::Write;

use ds4_engine::families::LoadedModel;
use ds4_engine::{LogitsRows, Model, ModelState};

const HIDDEN: usize = 2048;
const FFN: usize = 5632;
const HEADS: usize = 16;
const KV_HEADS: usize = 4;
const VOCAB: usize = 32000;

/// (type id, values per block, bytes per block, offsets of f16 scale fields)
const Q4_K: (u32, usize, usize, &[usize]) = (12, 256, 144, &[0, 2]);
const Q6_K: (u32, usize, usize, &[usize]) = (14, 256, 210, &[208]);
const Q8_0: (u32, usize, usize, &[usize]) = (8, 32, 34, &[0]);
const F32: (u32, usize, usize, &[usize]) = (0, 1, 4, &[]);

fn vm_rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Random block bytes with every f16 scale field set to a small finite
/// value (random quants, bounded values).
fn blocks(ty: (u32, usize, usize, &[usize]), n_values: usize, seed: u64) -> Vec<u8> {
    let (_, per, bytes, scales) = ty;
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = vec![0u8; n_values / per * bytes];
    if ty.0 == 0 {
        for v in out.chunks_exact_mut(4) {
            v.copy_from_slice(&1.0f32.to_le_bytes());
        }
        return out;
    }
    for b in out.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.copy_from_slice(&x.to_le_bytes());
    }
    let scale = half::f16::from_f32(1.0 / 1024.0).to_le_bytes();
    for block in out.chunks_exact_mut(bytes) {
        for &o in scales {
            block[o..o + 2].copy_from_slice(&scale);
        }
    }
    out
}

struct Writer {
    meta: Vec<u8>,
    n_meta: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<Vec<u8>>,
    offset: u64,
}

impl Writer {
    fn s(buf: &mut Vec<u8>, v: &str) {
        buf.extend_from_slice(&(v.len() as u64).to_le_bytes());
        buf.extend_from_slice(v.as_bytes());
    }
    fn kv_str(&mut self, k: &str, v: &str) {
        Self::s(&mut self.meta, k);
        self.meta.extend_from_slice(&8u32.to_le_bytes());
        Self::s(&mut self.meta, v);
        self.n_meta += 1;
    }
    fn kv_u32(&mut self, k: &str, v: u32) {
        Self::s(&mut self.meta, k);
        self.meta.extend_from_slice(&4u32.to_le_bytes());
        self.meta.extend_from_slice(&v.to_le_bytes());
        self.n_meta += 1;
    }
    fn kv_f32(&mut self, k: &str, v: f32) {
        Self::s(&mut self.meta, k);
        self.meta.extend_from_slice(&6u32.to_le_bytes());
        self.meta.extend_from_slice(&v.to_le_bytes());
        self.n_meta += 1;
    }
    fn tensor(&mut self, name: &str, dims: &[usize], ty: (u32, usize, usize, &[usize]), seed: u64) {
        let n: usize = dims.iter().product();
        let data = blocks(ty, n, seed);
        Self::s(&mut self.infos, name);
        self.infos
            .extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims.iter().rev() {
            self.infos.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        self.infos.extend_from_slice(&ty.0.to_le_bytes());
        self.infos.extend_from_slice(&self.offset.to_le_bytes());
        self.offset += (data.len() as u64).div_ceil(32) * 32;
        self.n_tensors += 1;
        self.data.push(data);
    }
    fn write(self, path: &std::path::Path) -> u64 {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
        let mut head = b"GGUF".to_vec();
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&self.n_tensors.to_le_bytes());
        head.extend_from_slice(&self.n_meta.to_le_bytes());
        head.extend_from_slice(&self.meta);
        head.extend_from_slice(&self.infos);
        head.resize(head.len().div_ceil(32) * 32, 0);
        f.write_all(&head).unwrap();
        for d in &self.data {
            f.write_all(d).unwrap();
            let pad = d.len().div_ceil(32) * 32 - d.len();
            f.write_all(&vec![0; pad]).unwrap();
        }
        f.flush().unwrap();
        std::fs::metadata(path).unwrap().len()
    }
}

fn write_model(path: &std::path::Path, layers: usize) -> u64 {
    let mut w = Writer {
        meta: Vec::new(),
        n_meta: 0,
        infos: Vec::new(),
        n_tensors: 0,
        data: Vec::new(),
        offset: 0,
    };
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.block_count", layers as u32);
    w.kv_u32("llama.context_length", 4096);
    w.kv_u32("llama.embedding_length", HIDDEN as u32);
    w.kv_u32("llama.feed_forward_length", FFN as u32);
    w.kv_u32("llama.attention.head_count", HEADS as u32);
    w.kv_u32("llama.attention.head_count_kv", KV_HEADS as u32);
    w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    let kv = HIDDEN / HEADS * KV_HEADS;
    w.tensor("token_embd.weight", &[VOCAB, HIDDEN], Q4_K, 1);
    w.tensor("output_norm.weight", &[HIDDEN], F32, 0);
    w.tensor("output.weight", &[VOCAB, HIDDEN], Q8_0, 2);
    for l in 0..layers {
        let s = 100 + 10 * l as u64;
        let b = |n: &str| format!("blk.{l}.{n}.weight");
        w.tensor(&b("attn_norm"), &[HIDDEN], F32, 0);
        w.tensor(&b("ffn_norm"), &[HIDDEN], F32, 0);
        w.tensor(&b("attn_q"), &[HIDDEN, HIDDEN], Q4_K, s);
        w.tensor(&b("attn_k"), &[kv, HIDDEN], Q4_K, s + 1);
        w.tensor(&b("attn_v"), &[kv, HIDDEN], Q4_K, s + 2);
        w.tensor(&b("attn_output"), &[HIDDEN, HIDDEN], Q4_K, s + 3);
        w.tensor(&b("ffn_gate"), &[FFN, HIDDEN], Q4_K, s + 4);
        w.tensor(&b("ffn_up"), &[FFN, HIDDEN], Q4_K, s + 5);
        w.tensor(&b("ffn_down"), &[HIDDEN, FFN], Q6_K, s + 6);
    }
    w.write(path)
}

#[test]
fn gguf_load_is_resident_as_the_file_not_more() {
    let layers: usize = std::env::var("DS4_RSS_TEST_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kquant-mix.gguf");
    let file = write_model(&path, layers);
    let before = vm_rss_bytes();
    let model = LoadedModel::load(&path).unwrap();
    let after_load = vm_rss_bytes();
    let LoadedModel::Llama(m) = &model else {
        panic!("a llama GGUF")
    };
    let mut st = m.new_state();
    let out = m.forward(&[1, 2, 3], &mut st, LogitsRows::Last).unwrap();
    assert!(out.logits.iter().all(|v| v.is_finite()));
    let after = vm_rss_bytes();
    let grew = after.saturating_sub(before);
    let caches = st.byte_size() as u64;
    eprintln!(
        "file {:.1} MiB; RSS +{:.1} MiB after load, +{:.1} MiB after a forward (KV cache {:.1} MiB)",
        file as f64 / 1048576.0,
        after_load.saturating_sub(before) as f64 / 1048576.0,
        grew as f64 / 1048576.0,
        caches as f64 / 1048576.0,
    );
    // A forward touches every weight: nearly the whole file is resident...
    assert!(
        grew as f64 >= 0.8 * file as f64,
        "the forward read the weights: +{grew} of {file}"
    );
    // ...and not more than 10 % over the file plus the caches (scratch and
    // activations of one step are a few MiB).
    let limit = 1.10 * file as f64 + caches as f64 + 32.0 * 1048576.0;
    assert!(
        (grew as f64) <= limit,
        "resident memory grew by {grew} bytes for a {file}-byte file (limit {limit:.0})"
    );
}
