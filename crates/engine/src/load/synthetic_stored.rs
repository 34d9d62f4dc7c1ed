//! Synthetic weights in a checkpoint's real stored types: random but valid
//! GGML blocks (and 16-bit floats), so a benchmark at full size moves the
//! bytes and runs the kernels a real file would (`bench --synthetic
//! deepseek_v4|glm5_next --weights ds4-q2|ds4-q4`).
//!
//! The type of each tensor follows antirez/ds4's recipes, one type function
//! per family ([`StoredFamily`]; `shared/research/serving-anchors.md` §0 and
//! §1.2). DeepSeek-V4-Flash ([`ds4_type`], from `ds4.c`'s
//! `weights_validate_layout`): routed experts IQ2_XXS gate/up + Q2_K down
//! (q2) or Q4_K (q4); the attention projections, the shared expert and the
//! output head Q8_0; the embedding, the hyper-connection projections,
//! compressors, indexer and router F16; norms, hyper-connection
//! scale/base, attention sinks and the router bias F32; the hash-routing
//! table as integer ids. GLM-5.3-Flash ([`glm5::glm5_type`]), which ds4
//! ships in the same policy: the same expert types; the MLA and KDA
//! projections, the dense layers' MLPs, the shared expert and the head
//! Q8_0; the embedding, hyper-connection projections, the DSA indexer's
//! projections and the router F16; norms, conv1d, `dt_bias`, `A_log`,
//! hyper-connection scale/base, the router bias and the pool `ape` F32.
//!
//! Every byte is a pure function of (seed, tensor name, index) through
//! [`super::hash64`] (SplitMix64), so the weights do not depend on how many
//! threads made them: block `b` of a tensor draws words `W·b .. W·b + W` of
//! the tensor's stream (`W` per type). The quants (and IQ2_XXS's grid
//! indices, sign patterns and sub-block scales) are those random bytes as
//! they are, all valid; the scale fields are set so activations stay
//! bounded over DeepSeek's 43 layers (GLM-5's 45):
//!
//! * `d` (every block type) is chosen so a weight's mean square is
//!   `1/in` (a row's output keeps its input's scale), measured once per
//!   type on blocks made with `d = 1` and dequantized by
//!   [`crate::quant::dequant`] itself;
//! * Q2_K / Q4_K sub-block mins equal their scales and `dmin` is `1.5·d` /
//!   `7.5·d`, so `v = d·s·(q − 1.5)` / `d·s·(q − 7.5)` is centred; their
//!   sub-block scales are random in 8..=15 / 32..=63.
//!
//! F16 matrices are `sqrt(3/in)·uniform`, small F16/F32 parameters
//! (GLM-5's pool `ape` among them) `0.05·uniform`, norm weights
//! `1 + 0.05·uniform` (DeepSeek's and GLM-5's RMSNorms multiply by their
//! weight). Tensors are made on the host in parallel chunks
//! (`std::thread::scope` over the available cores) and handed to the
//! backend as [`HostWeight::Quant`].

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use candle_core::{Device, Tensor};

use super::{hash64, tensor_seed, uniform};
use crate::backend::HostWeight;
use crate::error::{EngineError, Result};
use crate::families::deepseek_v4::DeepseekV4Config;
use crate::families::deepseek_v4::config::{AttnKind, MlpKind};
use crate::load::binder::WeightSource;
use crate::quant::{QuantTensor, WeightBytes, WeightType};

#[path = "synthetic_stored_glm5.rs"]
pub mod glm5;

/// One of antirez/ds4's DeepSeek-V4-Flash quantizations (GLM-5.3-Flash's
/// follow the same policy, [`glm5`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ds4Recipe {
    /// `…IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf`.
    Q2,
    /// `…Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2-imatrix.gguf`.
    Q4,
}

impl Ds4Recipe {
    /// `ds4-q2` or `ds4-q4`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ds4-q2" => Some(Ds4Recipe::Q2),
            "ds4-q4" => Some(Ds4Recipe::Q4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Ds4Recipe::Q2 => "ds4-q2",
            Ds4Recipe::Q4 => "ds4-q4",
        }
    }

    /// The size ds4 states for its file of this recipe ("about 81 GB" /
    /// "about 153 GB", `download_model.sh`; `serving-anchors.md` §1.3).
    pub fn published_size(self) -> &'static str {
        match self {
            Ds4Recipe::Q2 => "81 GB",
            Ds4Recipe::Q4 => "153 GB",
        }
    }

    /// The routed experts' types: `[gate/up, down]`.
    pub fn experts(self) -> [WeightType; 2] {
        match self {
            Ds4Recipe::Q2 => [WeightType::IQ2_XXS, WeightType::Q2_K],
            Ds4Recipe::Q4 => [WeightType::Q4_K, WeightType::Q4_K],
        }
    }
}

/// The stored type of tensor `name` (the family's upstream names:
/// `layers.L.attn.wq_a.weight`, `layers.L.ffn.experts.gate_up_proj`, …)
/// under `recipe`.
pub fn ds4_type(recipe: Ds4Recipe, name: &str) -> WeightType {
    let [gate_up, down] = recipe.experts();
    let last = name.rsplit('.').next().unwrap_or(name);
    let is_norm = name.ends_with("norm.weight");
    if name.ends_with("experts.gate_up_proj") {
        gate_up
    } else if name.ends_with("experts.down_proj") {
        down
    } else if name.contains("shared_experts.") || name == "head.weight" {
        WeightType::Q8_0
    } else if name.contains(".compressor.") || name.contains(".indexer.") {
        // Compressors (kv, gate, ape) and the indexer's projections.
        if is_norm {
            WeightType::F32
        } else {
            WeightType::F16
        }
    } else if name.contains(".attn.")
        && ["wq_a", "wq_b", "wkv", "wo_a", "wo_b"]
            .iter()
            .any(|p| name.ends_with(&format!(".attn.{p}.weight")))
    {
        WeightType::Q8_0
    } else if name == "embed.weight" || last.ends_with("_fn") || name.ends_with("ffn.gate.weight") {
        // Embedding, hyper-connection projections, router.
        WeightType::F16
    } else {
        // Norms, hyper-connection scale and base, sinks, router bias.
        WeightType::F32
    }
}

/// Whose tensor names a [`StoredSource`] types, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredFamily {
    /// [`ds4_type`]. A matrix whose rows are not whole blocks of its type
    /// is refused ([`stored_tensor`] errs): every DeepSeek shape here (the
    /// tiny one included) is made of whole blocks, and a refusal keeps a
    /// shape from silently benchmarking other types than ds4's.
    DeepseekV4,
    /// [`glm5::glm5_type`], with a block type whose block does not divide
    /// a row's width falling back to F16 ([`glm5::fit`]): custom and tiny
    /// GLM shapes have such widths, and F16 is what ds4 keeps its other
    /// unquantized matrices in.
    Glm5Next,
}

impl StoredFamily {
    /// The family registered as `name`.
    pub fn of(name: &str) -> Option<Self> {
        match name {
            "deepseek_v4" => Some(StoredFamily::DeepseekV4),
            "glm5_next" => Some(StoredFamily::Glm5Next),
            _ => None,
        }
    }

    /// The name it is registered as ([`Self::of`]'s inverse).
    pub fn name(self) -> &'static str {
        match self {
            StoredFamily::DeepseekV4 => "deepseek_v4",
            StoredFamily::Glm5Next => "glm5_next",
        }
    }

    /// The stored type of `name` with shape `dims` under `recipe`.
    pub fn type_of(self, recipe: Ds4Recipe, name: &str, dims: &[usize]) -> WeightType {
        match self {
            StoredFamily::DeepseekV4 => ds4_type(recipe, name),
            StoredFamily::Glm5Next => glm5::fit(glm5::glm5_type(recipe, name), dims),
        }
    }
}

/// How large a tensor's values are.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Magnitude {
    /// Mean square `1/in` (a matrix whose rows keep their input's scale).
    Matrix,
    /// `amp·uniform`.
    Small(f32),
    /// `1 + amp·uniform` (norm weights).
    AroundOne(f32),
}

/// Amplitude of small synthetic parameters.
const SMALL: f32 = 0.05;

fn magnitude(name: &str, dims: &[usize]) -> Magnitude {
    if name.ends_with("norm.weight") {
        Magnitude::AroundOne(SMALL)
    } else if dims.len() >= 2 && !name.ends_with(".ape") && !name.ends_with("_ape") {
        Magnitude::Matrix
    } else {
        Magnitude::Small(SMALL)
    }
}

/// Random words per block of a generated block type.
fn words_per_block(ty: WeightType) -> u64 {
    match ty {
        WeightType::Q8_0 => 4,    // 32 quants
        WeightType::Q2_K => 9,    // 64 quant bytes, 8 bytes of scales
        WeightType::Q4_K => 17,   // 128 quant bytes, 8 bytes of scales
        WeightType::IQ2_XXS => 8, // 64 bytes of indices, signs, scales
        _ => 0,
    }
}

/// Whether [`stored_tensor`] makes this type.
pub fn generates(ty: WeightType) -> bool {
    matches!(ty, WeightType::F32 | WeightType::F16) || words_per_block(ty) > 0
}

/// Q4_K's 12 scale bytes from 8 six-bit `(scale, min)` pairs (the inverse
/// of `get_scale_min_k4`).
pub fn pack_q4_k_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

/// The f16 scale fields of a block type (`d`, `dmin`) for step `d`.
fn header(ty: WeightType, d: f32) -> (u16, u16) {
    let d16 = half::f16::from_f32(d);
    let min = match ty {
        WeightType::Q2_K => 1.5,
        WeightType::Q4_K => 7.5,
        _ => 0.0,
    };
    (
        d16.to_bits(),
        half::f16::from_f32(min * d16.to_f32()).to_bits(),
    )
}

/// Block `b` of stream `seed` into `out` (`ty.block_bytes()` bytes).
fn fill_block(ty: WeightType, seed: u64, b: u64, (d, dmin): (u16, u16), out: &mut [u8]) {
    let w = words_per_block(ty);
    let word = |j: u64| hash64(seed, b * w + j).to_le_bytes();
    match ty {
        WeightType::Q8_0 => {
            out[..2].copy_from_slice(&d.to_le_bytes());
            for j in 0..4 {
                out[2 + 8 * j as usize..][..8].copy_from_slice(&word(j));
            }
        }
        WeightType::Q2_K => {
            // {scales[16], qs[64], d, dmin}: scale nibble = min nibble.
            let s = word(0);
            for i in 0..16 {
                let v = 8 + ((s[i / 2] >> (4 * (i % 2))) & 7);
                out[i] = v | (v << 4);
            }
            for j in 0..8 {
                out[16 + 8 * j..][..8].copy_from_slice(&word(1 + j as u64));
            }
            out[80..82].copy_from_slice(&d.to_le_bytes());
            out[82..84].copy_from_slice(&dmin.to_le_bytes());
        }
        WeightType::Q4_K => {
            // {d, dmin, scales[12], qs[128]}: each sub-block's min = scale.
            let s = word(0);
            let sc = s.map(|v| 32 + (v & 31));
            out[..2].copy_from_slice(&d.to_le_bytes());
            out[2..4].copy_from_slice(&dmin.to_le_bytes());
            out[4..16].copy_from_slice(&pack_q4_k_scales(sc, sc));
            for j in 0..16 {
                out[16 + 8 * j..][..8].copy_from_slice(&word(1 + j as u64));
            }
        }
        WeightType::IQ2_XXS => {
            // {d, qs[64]}: every grid index, sign pattern and 4-bit scale
            // is valid.
            out[..2].copy_from_slice(&d.to_le_bytes());
            for j in 0..8 {
                out[2 + 8 * j..][..8].copy_from_slice(&word(j as u64));
            }
        }
        _ => unreachable!("{ty} is not generated as blocks"),
    }
}

/// Below this many bytes a tensor is made on the calling thread.
const PARALLEL_BYTES: usize = 1 << 20;

/// `units` units of `unit` bytes, unit `i` written by `f(i, bytes)`, in
/// parallel chunks over the available cores.
fn make_bytes(units: usize, unit: usize, f: impl Fn(u64, &mut [u8]) + Sync) -> Vec<u8> {
    let mut out = vec![0u8; units * unit];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if out.len() < PARALLEL_BYTES || threads == 1 {
        for (i, u) in out.chunks_exact_mut(unit).enumerate() {
            f(i as u64, u);
        }
        return out;
    }
    // One contiguous run of units per thread.
    let per = units.div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        for (k, c) in out.chunks_mut(per * unit).enumerate() {
            s.spawn(move || {
                for (i, u) in c.chunks_exact_mut(unit).enumerate() {
                    f((k * per + i) as u64, u);
                }
            });
        }
    });
    out
}

/// The mean square of a block type's values at `d = 1` (`dmin` as
/// [`header`] sets it), by its own dequantizer over 64 blocks.
fn unit_mean_square(ty: WeightType) -> f64 {
    let n = 64;
    let hdr = header(ty, 1.0);
    let bytes = make_bytes(n, ty.block_bytes(), |b, out| {
        fill_block(ty, 0x5eed_ca1b, b, hdr, out)
    });
    let mut v = vec![0f32; n * ty.block_len()];
    crate::quant::dequant::blocks(ty, &bytes, &mut v);
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / v.len() as f64
}

/// Nanoseconds this process spent in [`stored_tensor`].
static MAKING_NS: AtomicU64 = AtomicU64::new(0);

/// Seconds this process has spent making stored synthetic tensors (of a
/// load's time, the rest is the backend placing them).
pub fn making_secs() -> f64 {
    MAKING_NS.load(Ordering::Relaxed) as f64 / 1e9
}

/// A synthetic tensor of stored type `ty` from stream `seed` (see the
/// module docs for the values). F32 comes back as an f32 tensor, every
/// other type as [`HostWeight::Quant`].
pub fn stored_tensor(seed: u64, ty: WeightType, name: &str, dims: &[usize]) -> Result<HostWeight> {
    let start = Instant::now();
    let w = make_tensor(seed, ty, name, dims);
    MAKING_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    w
}

fn make_tensor(seed: u64, ty: WeightType, name: &str, dims: &[usize]) -> Result<HostWeight> {
    let n: usize = dims.iter().product();
    let inp = *dims.last().unwrap_or(&1) as f32;
    let mag = magnitude(name, dims);
    let value = |i: u64| -> f32 {
        match mag {
            Magnitude::Matrix => (3.0 / inp).sqrt() * uniform(seed, i),
            Magnitude::Small(a) => a * uniform(seed, i),
            Magnitude::AroundOne(a) => 1.0 + a * uniform(seed, i),
        }
    };
    let bytes = match ty {
        WeightType::F32 => {
            let v: Vec<f32> = (0..n as u64).map(value).collect();
            return Ok(HostWeight::F32(Tensor::from_vec(
                v,
                dims.to_vec(),
                &Device::Cpu,
            )?));
        }
        WeightType::F16 => make_bytes(n, 2, |i, out| {
            out.copy_from_slice(&half::f16::from_f32(value(i)).to_le_bytes())
        }),
        ty if words_per_block(ty) > 0 => {
            if mag != Magnitude::Matrix {
                return Err(EngineError::Unsupported(format!(
                    "synthetic {name}: {ty} only for matrices"
                )));
            }
            let blocks = ty.row_bytes(inp as usize).ok_or_else(|| {
                EngineError::Unsupported(format!(
                    "synthetic {name} {dims:?}: rows of {inp} values are not whole {ty} blocks of {}",
                    ty.block_len()
                ))
            })? / ty.block_bytes()
                * (n / inp as usize);
            let d = 1.0 / (f64::from(inp) * unit_mean_square(ty)).sqrt();
            let hdr = header(ty, d as f32);
            make_bytes(blocks, ty.block_bytes(), |b, out| {
                fill_block(ty, seed, b, hdr, out)
            })
        }
        ty => {
            return Err(EngineError::Unsupported(format!(
                "synthetic {name}: no generator for {ty}"
            )));
        }
    };
    let q = QuantTensor::new(ty, dims.to_vec(), WeightBytes::owned(bytes), None)
        .map_err(|e| EngineError::State(format!("synthetic {name}: {e}")))?;
    Ok(HostWeight::Quant(Arc::new(q)))
}

/// One tensor a stored source handed out (or, for a dry run, would).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEntry {
    /// The stored type's name (`IQ2_XXS`, `F16`, …; `I32` for ids).
    pub ty: &'static str,
    pub dims: Vec<usize>,
    /// Bytes as stored (what the file of this recipe holds).
    pub bytes: usize,
    /// Bytes as the family's loader keeps it (f32 where it reads a tensor
    /// as f32, 4-byte ids as `u32`).
    pub held: usize,
}

/// Every tensor by name.
pub type StoredLedger = BTreeMap<String, StoredEntry>;

/// `(tensors, stored bytes, held bytes)` per stored type.
pub fn type_totals(ledger: &StoredLedger) -> BTreeMap<&'static str, (usize, usize, usize)> {
    let mut t = BTreeMap::new();
    for e in ledger.values() {
        let r = t.entry(e.ty).or_insert((0, 0, 0));
        r.0 += 1;
        r.1 += e.bytes;
        r.2 += e.held;
    }
    t
}

/// Bytes of `dims` stored as `ty`.
fn stored_bytes(ty: WeightType, dims: &[usize]) -> usize {
    let cols = *dims.last().unwrap_or(&1);
    let rows: usize = dims.iter().rev().skip(1).product();
    ty.row_bytes(cols).map_or(0, |r| r * rows)
}

/// Random weights in ds4's stored types for the tensors a loader asks for,
/// typed by [`StoredFamily`] (DeepSeek's upstream names or GLM-5's
/// text-only ones; the fused expert layout `experts.gate_up_proj`
/// `[E, 2I, H]` / `experts.down_proj` `[E, H, I]`; no MTP head: the
/// families' `load_synthetic` do not ask for one).
#[derive(Debug)]
pub struct StoredSource {
    seed: u64,
    family: StoredFamily,
    recipe: Ds4Recipe,
    /// Routed experts (the range of the hash-routing ids).
    experts: usize,
    label: PathBuf,
    ledger: StoredLedger,
}

impl StoredSource {
    /// A DeepSeek-V4 source ([`Self::for_family`]).
    pub fn new(seed: u64, recipe: Ds4Recipe, experts: usize, label: &str) -> Self {
        Self::for_family(StoredFamily::DeepseekV4, seed, recipe, experts, label)
    }

    /// A source typing `family`'s tensor names.
    pub fn for_family(
        family: StoredFamily,
        seed: u64,
        recipe: Ds4Recipe,
        experts: usize,
        label: &str,
    ) -> Self {
        Self {
            seed,
            family,
            recipe,
            experts,
            label: PathBuf::from(format!("synthetic:{label}:{}", recipe.name())),
            ledger: StoredLedger::new(),
        }
    }

    pub fn ledger(&self) -> &StoredLedger {
        &self.ledger
    }

    pub fn into_ledger(self) -> StoredLedger {
        self.ledger
    }

    fn make(&mut self, name: &str, shape: &[usize], as_f32: bool) -> Result<HostWeight> {
        let ty = self.family.type_of(self.recipe, name, shape);
        let w = stored_tensor(tensor_seed(self.seed, name), ty, name, shape)?;
        let n: usize = shape.iter().product();
        let bytes = stored_bytes(ty, shape);
        self.ledger.insert(
            name.to_string(),
            StoredEntry {
                ty: ty.name(),
                dims: shape.to_vec(),
                bytes,
                held: if as_f32 { 4 * n } else { bytes },
            },
        );
        Ok(w)
    }
}

impl WeightSource for StoredSource {
    fn file_of(&self, _name: &str) -> PathBuf {
        self.label.clone()
    }

    fn has(&self, name: &str) -> bool {
        !name.starts_with("mtp.")
    }

    fn read(&mut self, name: &str, shape: &[usize]) -> Result<HostWeight> {
        self.make(name, shape, false)
    }

    fn read_f32(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.make(name, shape, true)?.to_f32()
    }

    fn ignore(&mut self, _name: &str) {}

    /// `[V, k]`: row `t` holds `k` distinct experts, drawn from the
    /// tensor's stream.
    fn ids(&mut self, name: &str, shape: &[usize]) -> Result<Vec<u32>> {
        let [v, k] = shape else {
            return Err(EngineError::Tensor {
                path: self.label.clone(),
                tensor: name.to_string(),
                message: format!("ids of shape {shape:?}, expected [vocab, k]"),
            });
        };
        let (v, k, e) = (*v, *k, self.experts);
        if k > e {
            return Err(EngineError::Tensor {
                path: self.label.clone(),
                tensor: name.to_string(),
                message: format!("{k} distinct experts of {e}"),
            });
        }
        let seed = tensor_seed(self.seed, name);
        let mut out = Vec::with_capacity(v * k);
        let mut i = 0u64;
        for _ in 0..v {
            let row = out.len();
            while out.len() < row + k {
                let x = (hash64(seed, i) % e as u64) as u32;
                i += 1;
                if !out[row..].contains(&x) {
                    out.push(x);
                }
            }
        }
        self.ledger.insert(
            name.to_string(),
            StoredEntry {
                ty: "I32",
                dims: shape.to_vec(),
                bytes: 4 * v * k,
                held: 4 * v * k,
            },
        );
        Ok(out)
    }
}

/// Every tensor DeepSeek-V4's loader reads from a [`StoredSource`] (no MTP
/// head), with its shape, whether it is read as f32, and whether it is
/// integer ids — for a dry run that counts bytes without making any. A
/// test binds the tiny shape and checks this list against what the loader
/// asked for.
pub fn deepseek_v4_manifest(cfg: &DeepseekV4Config) -> Vec<(String, Vec<usize>, Read)> {
    let (h, v, n) = (cfg.hidden_size, cfg.vocab_size, cfg.hc_mult);
    let (nh, d, ql) = (cfg.num_heads, cfg.head_dim, cfg.q_lora_rank);
    let (g, ol) = (cfg.o_groups, cfg.o_lora_rank);
    let (e, k, i) = (
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
        cfg.moe_intermediate_size,
    );
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<usize>, how: Read| out.push((name, dims, how));
    let compressor = |add: &mut dyn FnMut(String, Vec<usize>, Read),
                      p: &str,
                      dim: usize,
                      ratio: usize,
                      overlap: bool| {
        let width = if overlap { 2 * dim } else { dim };
        add(format!("{p}.ape"), vec![ratio, width], Read::Stored);
        add(format!("{p}.wkv.weight"), vec![width, h], Read::Stored);
        add(format!("{p}.wgate.weight"), vec![width, h], Read::Stored);
        add(format!("{p}.norm.weight"), vec![dim], Read::F32);
    };
    add("embed.weight".into(), vec![v, h], Read::Stored);
    for l in 0..cfg.num_layers {
        let p = format!("layers.{l}");
        let m = (2 + n) * n;
        for which in ["attn", "ffn"] {
            add(format!("{p}.hc_{which}_fn"), vec![m, n * h], Read::Stored);
            add(format!("{p}.hc_{which}_base"), vec![m], Read::F32);
            add(format!("{p}.hc_{which}_scale"), vec![3], Read::F32);
        }
        add(format!("{p}.attn_norm.weight"), vec![h], Read::F32);
        add(format!("{p}.ffn_norm.weight"), vec![h], Read::F32);
        let a = format!("{p}.attn");
        add(
            format!("{a}.wo_a.weight"),
            vec![g * ol, nh * d / g],
            Read::Stored,
        );
        let kind = cfg.attn[l];
        if kind != AttnKind::Sliding {
            compressor(
                &mut add,
                &format!("{a}.compressor"),
                d,
                cfg.ratio_of(kind),
                kind == AttnKind::Csa,
            );
        }
        if kind == AttnKind::Csa {
            let (hi, di) = (cfg.index_n_heads, cfg.index_head_dim);
            compressor(
                &mut add,
                &format!("{a}.indexer.compressor"),
                di,
                cfg.csa_rate,
                true,
            );
            add(
                format!("{a}.indexer.wq_b.weight"),
                vec![hi * di, ql],
                Read::Stored,
            );
            add(
                format!("{a}.indexer.weights_proj.weight"),
                vec![hi, h],
                Read::Stored,
            );
        }
        add(format!("{a}.wq_a.weight"), vec![ql, h], Read::Stored);
        add(format!("{a}.q_norm.weight"), vec![ql], Read::F32);
        add(format!("{a}.wq_b.weight"), vec![nh * d, ql], Read::Stored);
        add(format!("{a}.wkv.weight"), vec![d, h], Read::Stored);
        // The release's name (the loader probes it before transformers').
        add(format!("{a}.kv_norm.weight"), vec![d], Read::F32);
        add(format!("{a}.wo_b.weight"), vec![h, g * ol], Read::Stored);
        add(format!("{a}.attn_sink"), vec![nh], Read::F32);
        let f = format!("{p}.ffn");
        add(format!("{f}.gate.weight"), vec![e, h], Read::Stored);
        match cfg.mlp[l] {
            MlpKind::TopK => add(format!("{f}.gate.bias"), vec![e], Read::F32),
            MlpKind::Hash => add(format!("{f}.gate.tid2eid"), vec![v, k], Read::Ids),
        }
        add(
            format!("{f}.shared_experts.w1.weight"),
            vec![i, h],
            Read::Stored,
        );
        add(
            format!("{f}.shared_experts.w3.weight"),
            vec![i, h],
            Read::Stored,
        );
        add(
            format!("{f}.experts.gate_up_proj"),
            vec![e, 2 * i, h],
            Read::Stored,
        );
        add(
            format!("{f}.experts.down_proj"),
            vec![e, h, i],
            Read::Stored,
        );
        add(
            format!("{f}.shared_experts.w2.weight"),
            vec![h, i],
            Read::Stored,
        );
    }
    add("norm.weight".into(), vec![h], Read::F32);
    add("hc_head_fn".into(), vec![n, n * h], Read::Stored);
    add("hc_head_base".into(), vec![n], Read::F32);
    add("hc_head_scale".into(), vec![1], Read::F32);
    if !cfg.tie_word_embeddings {
        add("head.weight".into(), vec![v, h], Read::Stored);
    }
    out
}

/// How a loader reads a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// As stored (`WeightSource::read`).
    Stored,
    /// As f32 (`WeightSource::read_f32`).
    F32,
    /// Integer ids.
    Ids,
}

/// The ledger a [`StoredSource`] would fill for `cfg` under `recipe`,
/// without making any weight.
pub fn deepseek_v4_dry_ledger(cfg: &DeepseekV4Config, recipe: Ds4Recipe) -> StoredLedger {
    dry_ledger(deepseek_v4_manifest(cfg), StoredFamily::DeepseekV4, recipe)
}

/// The ledger of a family's tensor list (`(name, dims, how)`), typed as a
/// [`StoredSource`] of `family` would type it.
fn dry_ledger(
    manifest: Vec<(String, Vec<usize>, Read)>,
    family: StoredFamily,
    recipe: Ds4Recipe,
) -> StoredLedger {
    manifest
        .into_iter()
        .map(|(name, dims, how)| {
            let n: usize = dims.iter().product();
            let entry = match how {
                Read::Ids => StoredEntry {
                    ty: "I32",
                    dims,
                    bytes: 4 * n,
                    held: 4 * n,
                },
                Read::Stored | Read::F32 => {
                    let ty = family.type_of(recipe, &name, &dims);
                    let bytes = stored_bytes(ty, &dims);
                    StoredEntry {
                        ty: ty.name(),
                        dims,
                        bytes,
                        held: if how == Read::F32 { 4 * n } else { bytes },
                    }
                }
            };
            (name, entry)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(w: &HostWeight) -> Vec<f32> {
        w.clone()
            .to_f32()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn recipe_types_follow_ds4() {
        use WeightType as T;
        let q2 = |n: &str| ds4_type(Ds4Recipe::Q2, n);
        let q4 = |n: &str| ds4_type(Ds4Recipe::Q4, n);
        assert_eq!(q2("layers.3.ffn.experts.gate_up_proj"), T::IQ2_XXS);
        assert_eq!(q2("layers.3.ffn.experts.down_proj"), T::Q2_K);
        assert_eq!(q4("layers.3.ffn.experts.gate_up_proj"), T::Q4_K);
        assert_eq!(q4("layers.3.ffn.experts.down_proj"), T::Q4_K);
        for n in [
            "layers.0.attn.wq_a.weight",
            "layers.0.attn.wq_b.weight",
            "layers.0.attn.wkv.weight",
            "layers.0.attn.wo_a.weight",
            "layers.0.attn.wo_b.weight",
            "layers.2.ffn.shared_experts.w1.weight",
            "layers.2.ffn.shared_experts.w2.weight",
            "head.weight",
        ] {
            assert_eq!(q2(n), T::Q8_0, "{n}");
        }
        for n in [
            "embed.weight",
            "layers.1.hc_attn_fn",
            "layers.1.hc_ffn_fn",
            "hc_head_fn",
            "layers.2.attn.compressor.wkv.weight",
            "layers.2.attn.compressor.wgate.weight",
            "layers.2.attn.compressor.ape",
            "layers.2.attn.indexer.wq_b.weight",
            "layers.2.attn.indexer.weights_proj.weight",
            "layers.2.attn.indexer.compressor.wkv.weight",
            "layers.4.ffn.gate.weight",
        ] {
            assert_eq!(q2(n), T::F16, "{n}");
        }
        for n in [
            "norm.weight",
            "layers.0.attn_norm.weight",
            "layers.0.attn.q_norm.weight",
            "layers.0.attn.kv_norm.weight",
            "layers.2.attn.compressor.norm.weight",
            "layers.2.attn.indexer.compressor.norm.weight",
            "layers.1.hc_attn_base",
            "layers.1.hc_ffn_scale",
            "hc_head_scale",
            "layers.0.attn.attn_sink",
            "layers.4.ffn.gate.bias",
        ] {
            assert_eq!(q2(n), T::F32, "{n}");
        }
    }

    #[test]
    fn q4_k_scales_round_trip_through_the_dequantizer() {
        let sc = [1, 17, 33, 63, 5, 40, 62, 20];
        let m = [2, 18, 34, 60, 6, 41, 63, 21];
        let (d, dmin) = (half::f16::from_f32(0.5), half::f16::from_f32(0.25));
        let mut b = vec![0u8; 144];
        b[..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&dmin.to_le_bytes());
        b[4..16].copy_from_slice(&pack_q4_k_scales(sc, m));
        // Quants 1 everywhere: sub-block j is 0.5·sc_j − 0.25·m_j.
        b[16..].fill(0x11);
        let mut v = vec![0f32; 256];
        crate::quant::dequant::blocks(WeightType::Q4_K, &b, &mut v);
        for j in 0..8 {
            let want = 0.5 * sc[j] as f32 - 0.25 * m[j] as f32;
            assert!(
                v[32 * j..32 * j + 32].iter().all(|&x| x == want),
                "sub-block {j}"
            );
        }
    }

    /// Every generated type: deterministic, valid (its own dequantizer
    /// reads it), centred, mean square `1/in`, and the same bytes however
    /// many threads made them.
    #[test]
    fn stored_blocks_are_valid_centred_and_scaled() {
        for ty in [
            WeightType::Q8_0,
            WeightType::Q2_K,
            WeightType::Q4_K,
            WeightType::IQ2_XXS,
            WeightType::F16,
        ] {
            let dims = [64, 1024];
            let w = stored_tensor(tensor_seed(3, "x.weight"), ty, "x.weight", &dims).unwrap();
            let HostWeight::Quant(q) = &w else {
                panic!("{ty}: not stored");
            };
            assert_eq!(q.ty, ty);
            let again = stored_tensor(tensor_seed(3, "x.weight"), ty, "x.weight", &dims).unwrap();
            assert_eq!(values(&w), values(&again), "{ty}: deterministic");
            let v = values(&w);
            assert!(v.iter().all(|x| x.is_finite()));
            let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
            let ms = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64;
            let rms = ms.sqrt();
            assert!(
                mean.abs() < 0.03 * rms,
                "{ty}: mean {mean} against rms {rms}"
            );
            assert!(
                (ms * 1024.0 - 1.0).abs() < 0.1,
                "{ty}: in·ms = {}",
                ms * 1024.0
            );
        }
        // Past the parallel threshold, chunked == one block at a time.
        let ty = WeightType::IQ2_XXS;
        let dims = [1024, 4096];
        let w = stored_tensor(11, ty, "big.weight", &dims).unwrap();
        let HostWeight::Quant(q) = &w else { panic!() };
        let bytes = q.parts[0].data.as_slice();
        assert!(bytes.len() > PARALLEL_BYTES);
        let d = 1.0 / (4096.0 * unit_mean_square(ty)).sqrt();
        let hdr = header(ty, d as f32);
        let mut one = vec![0u8; ty.block_bytes()];
        for b in [0usize, 1, 4095, 1024 * 16 - 1] {
            fill_block(ty, 11, b as u64, hdr, &mut one);
            assert_eq!(&bytes[b * 66..(b + 1) * 66], &one[..], "block {b}");
        }
    }

    fn config(shape: &str) -> DeepseekV4Config {
        let j = super::super::shape_config("deepseek_v4", shape).unwrap();
        DeepseekV4Config::from_hf(std::path::Path::new(shape), &j).unwrap()
    }

    /// The dry run's tensor list is exactly what the family's loader reads
    /// (names, shapes, types, stored and held bytes), at the tiny shape.
    #[test]
    fn manifest_is_what_the_loader_reads() {
        let j = super::super::shape_config("deepseek_v4", "tiny").unwrap();
        for recipe in [Ds4Recipe::Q2, Ds4Recipe::Q4] {
            let (_, ledger) = crate::families::LoadedModel::synthetic_stored(
                "deepseek_v4",
                &j,
                1,
                recipe,
                crate::families::Device::Cpu,
            )
            .unwrap();
            let dry = deepseek_v4_dry_ledger(&config("tiny"), recipe);
            for (k, e) in &ledger {
                assert_eq!(dry.get(k), Some(e), "{k}");
            }
            assert_eq!(ledger.len(), dry.len());
            let t = type_totals(&ledger);
            let [gu, dn] = recipe.experts();
            assert!(t.contains_key(gu.name()) && t.contains_key(dn.name()));
            for ty in ["Q8_0", "F16", "F32", "I32"] {
                assert!(t.contains_key(ty), "{ty}");
            }
        }
    }

    /// The full shape: 284 B parameters; ds4's q2 file is "about 81 GB"
    /// and its q4 "about 153 GB" — GiB, by these totals.
    #[test]
    fn full_shape_bytes_match_ds4s_files() {
        let cfg = config("full");
        let q2 = deepseek_v4_dry_ledger(&cfg, Ds4Recipe::Q2);
        let params: usize = q2
            .values()
            .filter(|e| e.ty != "I32")
            .map(|e| e.dims.iter().product::<usize>())
            .sum();
        assert!((283e9..286e9).contains(&(params as f64)), "{params}");
        let gib = |l: &StoredLedger| {
            l.values().map(|e| e.bytes).sum::<usize>() as f64 / (1u64 << 30) as f64
        };
        let (a, b) = (gib(&q2), gib(&deepseek_v4_dry_ledger(&cfg, Ds4Recipe::Q4)));
        assert!((80.0..82.0).contains(&a), "q2 {a} GiB");
        assert!((152.0..155.0).contains(&b), "q4 {b} GiB");
    }

    #[test]
    fn hash_ids_are_distinct_experts() {
        let mut s = StoredSource::new(5, Ds4Recipe::Q2, 8, "t");
        let ids = s.ids("layers.0.ffn.gate.tid2eid", &[100, 6]).unwrap();
        assert_eq!(ids.len(), 600);
        for row in ids.chunks(6) {
            assert!(row.iter().all(|&x| x < 8));
            for (a, x) in row.iter().enumerate() {
                assert!(!row[a + 1..].contains(x), "{row:?}");
            }
        }
        assert!(s.ids("x", &[4, 9]).is_err(), "more ids than experts");
    }
}
