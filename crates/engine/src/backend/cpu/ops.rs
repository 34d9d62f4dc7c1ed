//! [`CpuOps`]: the op inventory on the host. Every op is the kernel the
//! families ran before the inventory existed, moved here with its arithmetic
//! unchanged (the `pinned_bits` test holds the bits).

use std::sync::Arc;

use candle_core::{Device, Storage, Tensor};

use super::block_matmul::{self, BlockFormat, BlockMatrix};
use super::kq8_matmul::KMatrix;
use super::q8_matmul::{OutputMap, Q8Matrix};
use super::{
    attention, compression, delta_rule, experts, f32_matmul, hyper, indexer, kda_gate, layer_norm,
    pool_expand, routing, sparse_attention, window_attention,
};
use crate::backend::composed;
use crate::backend::{
    Backend, BackendId, CausalPart, EntryKeep, Epilogue, GateAct, GeluForm, Heads, HostStep,
    HostWeight, IndexerShape, KernelSet, RopeLayout, RouterSpec, ScanDims, StepBody, Unary,
};
use crate::error::{EngineError, Result};
use crate::quant::{QuantTensor, WeightType};

/// The CPU backend. One kernel set per process ([`block_matmul::isa`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuOps;

/// A weight matrix on the CPU.
#[derive(Debug, Clone)]
pub enum CpuMatrix {
    /// Row-major f32 `[out, in]` (contiguous), through [`f32_matmul`].
    F32 { w: Tensor, out: usize, inp: usize },
    /// Q4_1 / Q8_0 through [`block_matmul`] (f32 activations).
    Block(BlockMatrix),
    /// Q4_1 / Q8_0 through [`q8_matmul`] (the fast kernel set: int8
    /// activations).
    Q8(Q8Matrix),
    /// Q2_K–Q6_K / IQ2_XXS rows of whole super-blocks through
    /// [`super::kq8_matmul`] (the fast kernel set; the file's blocks read
    /// in place).
    KQ8(KMatrix),
    /// Any other stored type, kept as stored (a view of the file's map):
    /// the reference product dequantizes a strip of rows and runs the f32
    /// kernel over it ([`f32_matmul::matmul_filled`]), so its bits are the
    /// f32 product of the dequantized matrix.
    Stored(Arc<QuantTensor>),
    /// Row blocks of different stored types ([`HostWeight::Rows`]): each
    /// output column is its own part's product.
    Rows { parts: Vec<CpuMatrix>, out: usize },
    /// A matrix whose products report their input rows to the process's
    /// product observer first ([`crate::observe`]); placed only when one
    /// is installed.
    Observed {
        tag: crate::observe::Tag,
        inner: Box<CpuMatrix>,
    },
}

/// An embedding table on the CPU.
#[derive(Debug, Clone)]
pub enum CpuTable {
    /// `[V, width]` f32.
    F32(Tensor),
    /// A stored table, dequantized row by row on lookup (the whole table
    /// in f32 would be larger than the model for SmolLM2).
    Stored(Arc<QuantTensor>),
}

/// A stack of expert matrices `[E, out, in]` on the CPU.
#[derive(Debug, Clone)]
pub enum CpuExperts {
    /// f32 (safetensors in f32 / f16 / bf16, synthetic weights).
    F32(Tensor),
    /// Kept as stored; each expert's rows are dequantized a strip at a time
    /// inside its product (the bits of the f32 stack).
    Stored(Arc<QuantTensor>),
    /// A stack whose routed rows are reported to the product observer
    /// ([`crate::observe`]); placed only when one is installed.
    Observed {
        tag: crate::observe::Tag,
        inner: Box<CpuExperts>,
    },
}

impl CpuExperts {
    /// The stack itself and its observer tag, if observed.
    fn unwrap_observed(&self) -> (&CpuExperts, Option<crate::observe::Tag>) {
        match self {
            CpuExperts::Observed { tag, inner } => (inner, Some(*tag)),
            other => (other, None),
        }
    }

    /// `(E, out, in)`.
    fn dims(&self) -> Result<(usize, usize, usize)> {
        match self {
            CpuExperts::Observed { inner, .. } => inner.dims(),
            CpuExperts::F32(t) => Ok(t.dims3()?),
            CpuExperts::Stored(q) => match q.dims[..] {
                [e, o, i] => Ok((e, o, i)),
                _ => Err(shape_err("experts", format!("{:?} is not 3-D", q.dims))),
            },
        }
    }
}

/// Routing decisions: `[rows, k]` expert ids and weights.
#[derive(Debug, Clone, Default)]
pub struct CpuRouting {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
    pub k: usize,
}

/// The bytes of a stored tensor's parts, in row order.
fn stored_bytes(q: &QuantTensor) -> std::borrow::Cow<'_, [u8]> {
    match &q.parts[..] {
        [one] => std::borrow::Cow::Borrowed(one.data.as_slice()),
        parts => std::borrow::Cow::Owned(
            parts
                .iter()
                .flat_map(|p| p.data.as_slice())
                .copied()
                .collect(),
        ),
    }
}

/// Borrow a contiguous f32 CPU tensor's data.
fn with_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(EngineError::Unsupported(
            "the CPU backend got a tensor that is not on the CPU".into(),
        ));
    };
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(EngineError::State("a CPU weight is not contiguous".into()));
    };
    Ok(f(&cpu.as_slice::<f32>()?[start..end]))
}

/// [`Backend::attention_causal`] over caches of f32 or f16 rows.
fn causal_over<E: attention::KvElem>(
    q: &[f32],
    k: &[&Vec<E>],
    v: &[&Vec<E>],
    offset: usize,
    q_heads: usize,
    kv: Heads,
) -> Result<Vec<f32>> {
    let (kvh, d) = (kv.heads, kv.dim);
    let group = q_heads / kvh;
    let t = q.len() / (q_heads * d);
    let total = offset + t;
    if t == 0 || k.len() != kvh || v.len() != kvh || k.iter().chain(v).any(|c| c.len() < total * d)
    {
        return Err(shape_err(
            "attention_causal",
            format!("{t} queries over {total} keys in {} kv heads", k.len()),
        ));
    }
    // Kernel rows per kv head: `g·t + i` is group member `g` at window
    // position `i`, i.e. token `i`, query head `h·group + g`; the queries
    // are copied into that head-major order once.
    let rows = group * t;
    let qr = head_major_queries(q, t, q_heads, kvh, d);
    fn view<E>(heads: Vec<&[E]>, d: usize) -> attention::View<'_, E> {
        attention::View { heads, stride: d }
    }
    let mut y = vec![0f32; t * q_heads * d];
    attention::causal_attention(
        &view(qr.chunks(rows * d).collect(), d),
        &view(k.iter().map(|c| c.as_slice()).collect(), d),
        &view(v.iter().map(|c| c.as_slice()).collect(), d),
        kvh,
        rows,
        t,
        offset,
        d,
        &mut y,
        &|h, r| ((r % t) * q_heads + h * group + r / t) * d,
    );
    Ok(y)
}

/// [`Backend::attention_causal_batch`] on the CPU: every part checked as
/// [`causal_over`] checks it, the queries of each copied head-major, then
/// one [`attention::causal_attention_batch`] over all of them (the same
/// bits as one [`causal_over`] per part).
fn causal_over_batch<E: attention::KvElem>(
    parts: &[CausalPart<'_, Vec<f32>, Vec<E>>],
    q_heads: usize,
    kv: Heads,
) -> Result<Vec<f32>> {
    let (kvh, d) = (kv.heads, kv.dim);
    let group = q_heads / kvh.max(1);
    let width = q_heads * d;
    let mut windows = Vec::with_capacity(parts.len());
    let mut first = 0;
    for p in parts {
        let t = p.q.len() / width.max(1);
        let total = p.offset + t;
        if t == 0
            || p.q.len() != t * width
            || p.k.len() != kvh
            || p.v.len() != kvh
            || p.k.iter().chain(p.v).any(|c| c.len() < total * d)
        {
            return Err(shape_err(
                "attention_causal_batch",
                format!("{t} queries over {total} keys in {} kv heads", p.k.len()),
            ));
        }
        windows.push((t, first));
        first += t;
    }
    let queries: Vec<Vec<f32>> = parts
        .iter()
        .zip(&windows)
        .map(|(p, &(t, _))| head_major_queries(p.q, t, q_heads, kvh, d))
        .collect();
    let out_rows: Vec<_> = windows
        .iter()
        .map(|&(t, first)| {
            move |h: usize, r: usize| ((first + r % t) * q_heads + h * group + r / t) * d
        })
        .collect();
    let sessions: Vec<attention::Session<'_, E>> = parts
        .iter()
        .zip(&windows)
        .zip(queries.iter().zip(&out_rows))
        .map(|((p, &(t, _)), (qr, out_row))| attention::Session {
            q: attention::View {
                heads: qr.chunks(group * t * d).collect(),
                stride: d,
            },
            k: attention::View {
                heads: p.k.iter().map(|c| c.as_slice()).collect(),
                stride: d,
            },
            v: attention::View {
                heads: p.v.iter().map(|c| c.as_slice()).collect(),
                stride: d,
            },
            t,
            offset: p.offset,
            out_row,
        })
        .collect();
    let mut y = vec![0f32; first * width];
    attention::causal_attention_batch(kvh, group, d, &sessions, &mut y);
    Ok(y)
}

/// `q: [t, q_heads·d]` as the attention kernels take it: per kv head `h`,
/// rows `g·t + i` (group member `g` at window position `i`).
fn head_major_queries(q: &[f32], t: usize, q_heads: usize, kvh: usize, d: usize) -> Vec<f32> {
    let group = q_heads / kvh;
    let rows = group * t;
    let mut qr = vec![0f32; kvh * rows * d];
    for h in 0..kvh {
        for r in 0..rows {
            let (g, i) = (r / t, r % t);
            let src = (i * q_heads + h * group + g) * d;
            qr[(h * rows + r) * d..][..d].copy_from_slice(&q[src..src + d]);
        }
    }
    qr
}

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

fn tensor(x: &[f32], rows: usize, width: usize) -> Result<Tensor> {
    Ok(Tensor::from_slice(x, (rows, width), &Device::Cpu)?)
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `0.5·x·(1 + erf(x·(1/√2)))` in f32 (torch's CPU order; `erff` is musl's,
/// correctly rounded to within an ulp as torch's vectorised one).
pub(crate) fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in f32, torch's order.
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_6; // √2 · (2/√π) · 0.5
    const KAPPA: f32 = 0.044715;
    let inner = BETA * (x + KAPPA * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// Below this many values an element-wise or per-row op runs on the calling
/// thread (a pool dispatch costs microseconds); above it (prefill chunks)
/// the rows are split over candle's barrier pool. Every element is
/// computed by the same code either way, so the split never changes a bit.
const PARALLEL_VALUES: usize = 1 << 15;

/// `f(first_row, rows_out)` over disjoint blocks of the `width`-value rows
/// of `out`, in parallel when `out` is large.
fn par_rows(out: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = out.len() / width.max(1);
    if out.len() < PARALLEL_VALUES || rows < 2 {
        f(0, out);
        return;
    }
    let ptr = super::SendPtr(out.as_mut_ptr());
    let ptr = &ptr;
    candle_core::utils::barrier_pool().execute_chunked(rows, |range| {
        // SAFETY: the pool hands out disjoint row ranges of `out`, which
        // outlives the call (execute_chunked joins before returning).
        let block = unsafe {
            std::slice::from_raw_parts_mut(ptr.0.add(range.start * width), range.len() * width)
        };
        f(range.start, block);
    });
}

/// `y = x · Wᵀ` through `run(x, y)` for a `[n, k]` matrix, after checking
/// that `x` holds `rows` rows of `k`.
fn product(
    x: &[f32],
    rows: usize,
    n: usize,
    k: usize,
    run: impl FnOnce(&[f32], &mut [f32]),
) -> Result<Vec<f32>> {
    if x.len() != rows * k {
        return Err(shape_err(
            "matmul",
            format!("{} values are not [{rows}, {k}]", x.len()),
        ));
    }
    let mut y = vec![0f32; rows * n];
    run(x, &mut y);
    Ok(y)
}

/// `out[i] = f(i)` for every element, in parallel when large.
/// SiLU of one value: [`Backend::silu`]'s, and the fast products' output
/// map ([`super::q8_matmul::OutputMap::Silu`]), one definition for both.
#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn par_map(n: usize, f: impl Fn(usize) -> f32 + Sync) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // Blocks of 256 values: rows of a notional `[n/256, 256]`.
    let (whole, tail) = (n / 256 * 256, n % 256);
    par_rows(&mut out[..whole], 256, |first, block| {
        for (j, o) in block.iter_mut().enumerate() {
            *o = f(first * 256 + j);
        }
    });
    for j in 0..tail {
        out[whole + j] = f(whole + j);
    }
    out
}

impl CpuOps {
    /// [`Backend::matrix`] without the observer's wrapping (the parts of
    /// a `Rows` matrix are never observed on their own).
    fn place_matrix(&self, w: HostWeight, out: usize, inp: usize) -> Result<CpuMatrix> {
        match w.on_host()? {
            HostWeight::F32(t) => {
                if t.dims() != [out, inp] {
                    return Err(shape_err(
                        "matrix",
                        format!("{:?} is not [{out}, {inp}]", t.dims()),
                    ));
                }
                Ok(CpuMatrix::F32 {
                    w: t.contiguous()?,
                    out,
                    inp,
                })
            }
            HostWeight::Quant(q) => {
                if q.dims != [out, inp] {
                    return Err(shape_err(
                        "matrix",
                        format!("{:?} is not [{out}, {inp}]", q.dims),
                    ));
                }
                let format = match q.ty {
                    WeightType::Q4_1 => Some(BlockFormat::Q4_1),
                    WeightType::Q8_0 => Some(BlockFormat::Q8_0),
                    _ => None,
                };
                match format {
                    // Repacked once into the block kernels' layout; the
                    // file's pages are then released (resident memory is
                    // the repacked copy, not both).
                    Some(format) => {
                        let bytes = stored_bytes(&q);
                        let m = match crate::backend::kernel_set::current() {
                            KernelSet::Reference => {
                                BlockMatrix::new(&bytes, format, out, inp).map(CpuMatrix::Block)
                            }
                            KernelSet::Fast => {
                                Q8Matrix::new(&bytes, format, out, inp).map(CpuMatrix::Q8)
                            }
                        }
                        .map_err(|e| shape_err("matrix", e.to_string()))?;
                        q.parts.iter().for_each(|p| p.data.release());
                        Ok(m)
                    }
                    None => match crate::backend::kernel_set::current() {
                        KernelSet::Fast if KMatrix::new(q.clone()).is_some() => {
                            Ok(CpuMatrix::KQ8(KMatrix::new(q).expect("checked")))
                        }
                        _ => Ok(CpuMatrix::Stored(q)),
                    },
                }
            }
            HostWeight::Rows(parts) => {
                let parts = parts
                    .into_iter()
                    .map(|p| {
                        let rows = p.dims()[0];
                        self.place_matrix(p, rows, inp)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(CpuMatrix::Rows { parts, out })
            }
            HostWeight::Synthetic(_) => Err(shape_err("matrix", "not materialised".into())),
        }
    }

    /// [`Backend::experts`] without the observer's wrapping.
    fn place_experts(&self, w: HostWeight, e: usize, out: usize, inp: usize) -> Result<CpuExperts> {
        if w.dims() != [e, out, inp] {
            return Err(shape_err(
                "experts",
                format!("{:?} is not [{e}, {out}, {inp}]", w.dims()),
            ));
        }
        match w.on_host()? {
            // Stored stacks stay stored: a flagship's experts are most of
            // its bytes.
            HostWeight::Quant(q) if q.ty != WeightType::F32 => Ok(CpuExperts::Stored(q)),
            w => Ok(CpuExperts::F32(w.to_f32()?.contiguous()?)),
        }
    }

    /// The id a CPU process running kernel set `set` reports (with this
    /// machine's ISA): what its states' and checkpoints' identity carries.
    pub fn id_for(set: KernelSet) -> BackendId {
        let isa = block_matmul::isa();
        match set {
            KernelSet::Reference => BackendId {
                backend: "cpu",
                kernels: format!("{isa:?}").to_lowercase(),
                // The tag checkpoints carried before the op inventory
                // existed (and before there was a second kernel set).
                tag: format!("cpu-kernels:{isa:?}"),
            },
            // The int8 products have the same bits under every ISA, but
            // the f32 ops around them (attention, norms) do not.
            KernelSet::Fast => BackendId {
                backend: "cpu",
                kernels: format!("{isa:?}-fast").to_lowercase(),
                tag: format!("cpu-kernels:{isa:?}+q8-activations"),
            },
        }
    }

    /// Fast-set matrices of one width: every product in one pool dispatch
    /// with the activations rounded once ([`Q8Matrix::matmul_several`],
    /// the bits of each `matmul`), then each part's epilogue; `None` when
    /// the parts are not all such matrices.
    fn q8_many(
        &self,
        x: &[f32],
        rows: usize,
        parts: &[(&CpuMatrix, Epilogue<'_>)],
    ) -> Result<Option<Vec<Vec<f32>>>> {
        let q8: Option<Vec<&Q8Matrix>> = parts
            .iter()
            .map(|(w, _)| match w {
                CpuMatrix::Q8(q) => Some(q),
                _ => None,
            })
            .collect();
        let Some(q8) = q8.filter(|q| q.len() > 1 && q.iter().all(|w| w.cols() == q[0].cols()))
        else {
            return Ok(None);
        };
        let k = q8[0].cols();
        if x.len() != rows * k {
            return Err(shape_err(
                "matmul_many",
                format!("{} values are not [{rows}, {k}]", x.len()),
            ));
        }
        let mut ys: Vec<Vec<f32>> = q8.iter().map(|w| vec![0f32; rows * w.rows()]).collect();
        let mut views: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
        // A lone SiLU (the SwiGLU gate) runs inside the products' dispatch;
        // any other epilogue after it, as the parts compose it.
        let map = |then: &Epilogue<'_>| match then {
            Epilogue::Chain([Unary::Silu]) => OutputMap::Silu,
            _ => OutputMap::None,
        };
        Q8Matrix::matmul_several_with(&q8, x, rows, &mut views, &|i| map(&parts[i].1));
        ys.into_iter()
            .zip(parts)
            .map(|(y, (_, then))| match map(then) {
                OutputMap::Silu => Ok(y),
                OutputMap::None => composed::epilogue(self, y, rows, *then),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

impl Backend for CpuOps {
    type Buf = Vec<f32>;
    type Matrix = CpuMatrix;
    type Experts = CpuExperts;
    type Table = CpuTable;
    type Selection = Vec<Vec<u32>>;
    type Routing = CpuRouting;
    type Step = HostStep;
    type Half = Vec<half::f16>;

    fn id(&self) -> BackendId {
        Self::id_for(crate::backend::kernel_set::current())
    }

    // ---- memory ----

    fn upload(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn download(&self, x: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(x.clone())
    }

    fn download_parts(&self, x: &Vec<f32>, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
        crate::backend::composed::split_parts(x, lens)
    }

    fn zeros(&self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }

    fn len(&self, x: &Vec<f32>) -> usize {
        x.len()
    }

    fn rows(&self, x: &Vec<f32>, width: usize, first: usize, count: usize) -> Result<Vec<f32>> {
        Ok(x[row_span("rows", x, width, first, count)?].to_vec())
    }
    fn row_runs(&self, x: &Vec<f32>, width: usize, runs: &[(usize, usize)]) -> Result<Vec<f32>> {
        if runs.is_empty() {
            return Err(EngineError::State("row_runs: no runs".into()));
        }
        // One buffer, each run's rows copied in (the default made a buffer
        // a run: the compressor's slots are 2m runs of one row a window).
        let total: usize = runs.iter().map(|&(_, count)| count * width).sum();
        let mut out = Vec::with_capacity(total);
        for &(first, count) in runs {
            out.extend_from_slice(&x[row_span("row_runs", x, width, first, count)?]);
        }
        Ok(out)
    }

    fn append(&self, dst: &mut Vec<f32>, src: &Vec<f32>) -> Result<()> {
        dst.extend_from_slice(src);
        Ok(())
    }

    fn truncate(&self, dst: &mut Vec<f32>, n: usize) -> Result<()> {
        dst.truncate(n);
        Ok(())
    }

    fn concat_cols(&self, parts: &[(&Vec<f32>, usize)], rows: usize) -> Result<Vec<f32>> {
        let width: usize = parts.iter().map(|p| p.1).sum();
        let mut out = Vec::with_capacity(rows * width);
        for r in 0..rows {
            for (p, w) in parts {
                out.extend_from_slice(&p[r * w..(r + 1) * w]);
            }
        }
        Ok(out)
    }

    fn split_cols(
        &self,
        x: &Vec<f32>,
        rows: usize,
        parts: &[usize],
        repeats: usize,
    ) -> Result<Vec<Vec<f32>>> {
        let period: usize = parts.iter().sum();
        if x.len() != rows * period * repeats {
            return Err(shape_err(
                "split_cols",
                format!(
                    "{} values are not {rows} rows of {repeats}×{period}",
                    x.len()
                ),
            ));
        }
        let mut out: Vec<Vec<f32>> = parts
            .iter()
            .map(|p| Vec::with_capacity(rows * repeats * p))
            .collect();
        let mut at = 0;
        for _ in 0..rows * repeats {
            for (o, &p) in out.iter_mut().zip(parts) {
                o.extend_from_slice(&x[at..at + p]);
                at += p;
            }
        }
        Ok(out)
    }

    // ---- weights ----

    fn matrix(&self, w: HostWeight, out: usize, inp: usize) -> Result<CpuMatrix> {
        let m = self.place_matrix(w, out, inp)?;
        Ok(match crate::observe::place(out, inp, None) {
            Some(tag) => CpuMatrix::Observed {
                tag,
                inner: Box::new(m),
            },
            None => m,
        })
    }

    fn experts(&self, w: HostWeight, e: usize, out: usize, inp: usize) -> Result<CpuExperts> {
        let m = self.place_experts(w, e, out, inp)?;
        Ok(match crate::observe::place(out, inp, Some(e)) {
            Some(tag) => CpuExperts::Observed {
                tag,
                inner: Box::new(m),
            },
            None => m,
        })
    }

    fn table(&self, w: HostWeight, rows: usize, width: usize) -> Result<CpuTable> {
        let w = w.on_host()?;
        let dims = w.dims();
        if dims != [rows, width] {
            return Err(shape_err(
                "table",
                format!("{dims:?} is not [{rows}, {width}]"),
            ));
        }
        match w {
            HostWeight::F32(t) => Ok(CpuTable::F32(t.contiguous()?)),
            HostWeight::Quant(q) => Ok(CpuTable::Stored(q)),
            HostWeight::Rows(_) => Err(shape_err(
                "table",
                "an embedding table stored in several types".into(),
            )),
            HostWeight::Synthetic(_) => Err(shape_err("table", "not materialised".into())),
        }
    }

    fn gather_rows(&self, table: &CpuTable, ids: &[u32]) -> Result<Vec<f32>> {
        match table {
            CpuTable::F32(t) => {
                let ids = Tensor::from_slice(ids, ids.len(), &Device::Cpu)?;
                host(&t.index_select(&ids, 0)?)
            }
            CpuTable::Stored(q) => {
                let (rows, width) = (q.rows(), q.cols());
                let mut out = vec![0f32; ids.len() * width];
                for (o, &tok) in out.chunks_exact_mut(width).zip(ids) {
                    let r = tok as usize;
                    if r >= rows {
                        return Err(EngineError::TokenOutOfRange {
                            token: tok,
                            vocab: rows,
                        });
                    }
                    q.dequantize_rows(r, r + 1, o);
                }
                Ok(out)
            }
        }
    }

    // ---- linear algebra ----

    fn matmul(&self, x: &Vec<f32>, rows: usize, w: &CpuMatrix) -> Result<Vec<f32>> {
        match w {
            CpuMatrix::Observed { tag, inner } => {
                if let Some(o) = crate::observe::observer() {
                    o.rows(*tag, None, x, rows);
                }
                self.matmul(x, rows, inner)
            }
            CpuMatrix::F32 { w, out, inp } => {
                if x.len() != rows * inp {
                    return Err(shape_err(
                        "matmul",
                        format!("{} values are not [{rows}, {inp}]", x.len()),
                    ));
                }
                let mut y = vec![0f32; rows * out];
                with_slice(w, |w| f32_matmul::matmul(x, rows, w, *out, *inp, &mut y))?;
                Ok(y)
            }
            CpuMatrix::Block(m) => {
                product(x, rows, m.rows(), m.cols(), |x, y| m.matmul(x, rows, y))
            }
            CpuMatrix::Q8(m) => product(x, rows, m.rows(), m.cols(), |x, y| m.matmul(x, rows, y)),
            CpuMatrix::KQ8(m) => product(x, rows, m.rows(), m.cols(), |x, y| m.matmul(x, rows, y)),
            CpuMatrix::Rows { parts, out } => {
                let ys = parts
                    .iter()
                    .map(|p| self.matmul(x, rows, p))
                    .collect::<Result<Vec<_>>>()?;
                let mut y = Vec::with_capacity(rows * out);
                for r in 0..rows {
                    for yp in &ys {
                        let n = yp.len() / rows.max(1);
                        y.extend_from_slice(&yp[r * n..(r + 1) * n]);
                    }
                }
                Ok(y)
            }
            CpuMatrix::Stored(q) => {
                let (n, k) = (q.rows(), q.cols());
                if x.len() != rows * k {
                    return Err(shape_err(
                        "matmul",
                        format!("{} values are not [{rows}, {k}]", x.len()),
                    ));
                }
                let mut y = vec![0f32; rows * n];
                f32_matmul::matmul_filled(x, rows, n, k, &mut y, &|j0, j1, w| {
                    q.dequantize_rows(j0, j1, w)
                });
                Ok(y)
            }
        }
    }

    /// Block matrices of one width: every product in one pool dispatch
    /// ([`BlockMatrix::matmul_several`], the bits of each `matmul`), then
    /// each part's epilogue; anything else part by part.
    fn matmul_many(
        &self,
        x: &Vec<f32>,
        rows: usize,
        parts: &[(&CpuMatrix, Epilogue<'_>)],
    ) -> Result<Vec<Vec<f32>>> {
        if let Some(ys) = self.q8_many(x, rows, parts)? {
            return Ok(ys);
        }
        let blocks: Option<Vec<&BlockMatrix>> = parts
            .iter()
            .map(|(w, _)| match w {
                CpuMatrix::Block(b) => Some(b),
                _ => None,
            })
            .collect();
        let Some(blocks) =
            blocks.filter(|b| b.len() > 1 && b.iter().all(|w| w.cols() == b[0].cols()))
        else {
            return composed::matmul_many(self, x, rows, parts);
        };
        let k = blocks[0].cols();
        if x.len() != rows * k {
            return Err(shape_err(
                "matmul_many",
                format!("{} values are not [{rows}, {k}]", x.len()),
            ));
        }
        let mut ys: Vec<Vec<f32>> = blocks.iter().map(|w| vec![0f32; rows * w.rows()]).collect();
        let mut views: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
        BlockMatrix::matmul_several(&blocks, x, rows, &mut views);
        ys.into_iter()
            .zip(parts)
            .map(|(y, &(_, then))| composed::epilogue(self, y, rows, then))
            .collect()
    }

    fn experts_swiglu(
        &self,
        x: &Vec<f32>,
        rows: usize,
        routing: &CpuRouting,
        gate_up: &CpuExperts,
        down: &CpuExperts,
        limit: Option<f32>,
    ) -> Result<Vec<f32>> {
        let ys = self.experts_slots(x, rows, routing, gate_up, down, limit, 0)?;
        let h = x.len() / rows.max(1);
        self.sum_slots(&ys, rows, routing, h)
    }

    fn experts_slots(
        &self,
        x: &Vec<f32>,
        rows: usize,
        routing: &CpuRouting,
        gate_up: &CpuExperts,
        down: &CpuExperts,
        limit: Option<f32>,
        first: usize,
    ) -> Result<Vec<f32>> {
        let (e, two_i, h) = gate_up.dims()?;
        let (gate_up, gu_tag) = gate_up.unwrap_observed();
        let (down, dn_tag) = down.unwrap_observed();
        // Each expert's routed rows and its down projection's input, for
        // the product observer (`None` unless a stack is observed).
        let seen = |ex: usize, xs: &[f32], act: &[f32]| {
            if let Some(o) = crate::observe::observer() {
                if let Some(t) = gu_tag {
                    o.rows(t, Some(ex), xs, xs.len() / h.max(1));
                }
                if let Some(t) = dn_tag {
                    o.rows(t, Some(ex), act, act.len() / (two_i / 2).max(1));
                }
            }
        };
        let seen: Option<experts::SeenRows<'_>> =
            (gu_tag.is_some() || dn_tag.is_some()).then_some(&seen);
        if x.len() != rows * h
            || routing.experts.len() != rows * routing.k
            || down.dims()? != (e, h, two_i / 2)
        {
            return Err(shape_err(
                "experts_swiglu",
                format!(
                    "{} values, {} slots for {rows} rows",
                    x.len(),
                    routing.experts.len()
                ),
            ));
        }
        let run = |gate_up: experts::Stack<'_>, down: experts::Stack<'_>| {
            let owned = experts::Owned {
                gate_up,
                down,
                first,
                count: e,
            };
            let experts = &routing.experts;
            experts::slot_outputs(x, experts, routing.k, owned, h, two_i / 2, limit, seen)
        };
        match (gate_up, down) {
            (CpuExperts::F32(gu), CpuExperts::F32(dn)) => with_slice(gu, |gu| {
                with_slice(dn, |dn| {
                    run(experts::Stack::F32(gu), experts::Stack::F32(dn))
                })
            })?,
            (CpuExperts::F32(gu), CpuExperts::Stored(dn)) => with_slice(gu, |gu| {
                run(experts::Stack::F32(gu), experts::Stack::Stored(dn))
            }),
            (CpuExperts::Stored(gu), CpuExperts::F32(dn)) => with_slice(dn, |dn| {
                run(experts::Stack::Stored(gu), experts::Stack::F32(dn))
            }),
            (CpuExperts::Stored(gu), CpuExperts::Stored(dn)) => {
                Ok(run(experts::Stack::Stored(gu), experts::Stack::Stored(dn)))
            }
            // A stack is wrapped once, at placement.
            _ => Err(shape_err("experts_swiglu", "a stack observed twice".into())),
        }
    }

    fn sum_slots(
        &self,
        ys: &Vec<f32>,
        rows: usize,
        routing: &CpuRouting,
        width: usize,
    ) -> Result<Vec<f32>> {
        if routing.experts.len() != rows * routing.k
            || routing.weights.len() != routing.experts.len()
            || ys.len() != routing.experts.len() * width
        {
            return Err(shape_err(
                "sum_slots",
                format!(
                    "{} values, {} slots of width {width} for {rows} rows",
                    ys.len(),
                    routing.experts.len()
                ),
            ));
        }
        Ok(experts::sum_slots(ys, &routing.weights, routing.k, width))
    }

    fn routing_upload(&self, experts: &[usize], weights: &[f32], k: usize) -> Result<CpuRouting> {
        crate::backend::check_routing_upload(experts, weights, k)?;
        Ok(CpuRouting {
            experts: experts.to_vec(),
            weights: weights.to_vec(),
            k,
        })
    }

    // ---- routing ----

    fn route_softmax_topk(
        &self,
        logits: &Vec<f32>,
        rows: usize,
        experts: usize,
        k: usize,
        renormalise: bool,
    ) -> Result<CpuRouting> {
        if logits.len() != rows * experts || k > experts {
            return Err(shape_err(
                "route_softmax_topk",
                format!("{} logits, {rows} rows of {experts}, top {k}", logits.len()),
            ));
        }
        let mut r = CpuRouting {
            k,
            ..Default::default()
        };
        let mut idx: Vec<usize> = Vec::with_capacity(experts);
        for row in logits.chunks_exact(experts) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = ex.iter().sum();
            idx.clear();
            idx.extend(0..experts);
            // Descending probability; equal probabilities keep the lower id
            // first (torch.topk's CPU order for exact ties is unspecified).
            idx.sort_by(|&a, &b| ex[b].total_cmp(&ex[a]).then(a.cmp(&b)));
            let top: Vec<f32> = idx[..k].iter().map(|&i| ex[i] / sum).collect();
            let norm: f32 = if renormalise { top.iter().sum() } else { 1.0 };
            for (j, &i) in idx[..k].iter().enumerate() {
                r.experts.push(i);
                r.weights.push(top[j] / norm);
            }
        }
        Ok(r)
    }

    fn route_scored(
        &self,
        logits: &Vec<f32>,
        rows: usize,
        bias: Option<&Vec<f32>>,
        fixed: Option<&[u32]>,
        spec: &RouterSpec,
    ) -> Result<CpuRouting> {
        let (e, k) = (spec.experts, spec.k);
        let bad = logits.len() != rows * e
            || k > e
            || bias.is_some_and(|b| b.len() != e)
            || fixed.is_some_and(|f| f.len() != rows * k || f.iter().any(|&i| i as usize >= e))
            || spec
                .groups
                .is_some_and(|(g, keep)| g == 0 || e % g != 0 || keep > g);
        if bad {
            return Err(shape_err(
                "route_scored",
                format!("{} logits, {rows} rows, {spec:?}", logits.len()),
            ));
        }
        let (experts, weights) =
            routing::route_scored(logits, bias.map(|b| b.as_slice()), fixed, spec);
        Ok(CpuRouting {
            experts,
            weights,
            k,
        })
    }

    fn routing_to_host(&self, r: &CpuRouting) -> Result<(Vec<usize>, Vec<f32>)> {
        Ok((r.experts.clone(), r.weights.clone()))
    }

    // ---- norms ----

    fn rms_norm(&self, x: &Vec<f32>, width: usize, w: &Vec<f32>, eps: f32) -> Result<Vec<f32>> {
        let rows = x.len() / width.max(1);
        let w = Tensor::from_slice(w, width, &Device::Cpu)?;
        host(&candle_nn::ops::rms_norm(
            &tensor(x, rows, width)?,
            &w,
            eps,
        )?)
    }

    fn rms_norm_grouped(
        &self,
        x: &Vec<f32>,
        width: usize,
        group: usize,
        scale: &Vec<f32>,
        eps: f64,
    ) -> Result<Vec<f32>> {
        use candle_core::D;
        let rows = x.len() / width.max(1);
        let xs = tensor(x, rows, width)?.reshape((rows, width / group, group))?;
        let inv = (xs.sqr()?.mean_keepdim(D::Minus1)? + eps)?
            .sqrt()?
            .recip()?;
        let scale = Tensor::from_slice(scale, width, &Device::Cpu)?;
        host(
            &xs.broadcast_mul(&inv)?
                .reshape((rows, width))?
                .broadcast_mul(&scale)?,
        )
    }

    fn rms_norm_heads(
        &self,
        x: &mut Vec<f32>,
        dim: usize,
        scale: &Vec<f32>,
        eps: f32,
    ) -> Result<()> {
        for x in x.chunks_exact_mut(dim) {
            let ms = x.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for (v, s) in x.iter_mut().zip(scale) {
                *v = *v * inv * s;
            }
        }
        Ok(())
    }

    fn l2_norm_heads(&self, x: &mut Vec<f32>, dim: usize, scale: f32) -> Result<()> {
        for x in x.chunks_exact_mut(dim) {
            let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
            for v in x {
                *v *= inv * scale;
            }
        }
        Ok(())
    }

    fn gated_rms_norm(
        &self,
        o: &Vec<f32>,
        z: &Vec<f32>,
        w: &Vec<f32>,
        eps: f32,
        act: GateAct,
    ) -> Result<Vec<f32>> {
        let dim = w.len();
        let mut out = vec![0f32; o.len()];
        for ((orow, zrow), dst) in o
            .chunks_exact(dim)
            .zip(z.chunks_exact(dim))
            .zip(out.chunks_exact_mut(dim))
        {
            let ms = orow.iter().map(|v| v * v).sum::<f32>() / dim as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for i in 0..dim {
                let g = match act {
                    GateAct::Sigmoid => sigmoid(zrow[i]),
                    GateAct::Silu => zrow[i] * sigmoid(zrow[i]),
                };
                dst[i] = w[i] * (orow[i] * inv) * g;
            }
        }
        Ok(out)
    }

    fn layer_norm(
        &self,
        x: &Vec<f32>,
        width: usize,
        w: &Vec<f32>,
        b: &Vec<f32>,
        eps: f32,
    ) -> Result<Vec<f32>> {
        if width == 0 || w.len() != width || b.len() != width || !x.len().is_multiple_of(width) {
            return Err(shape_err(
                "layer_norm",
                format!(
                    "{} values, weight {} and bias {} for rows of {width}",
                    x.len(),
                    w.len(),
                    b.len()
                ),
            ));
        }
        Ok(layer_norm::layer_norm(x, width, w, b, eps))
    }

    // ---- position ----

    fn rope(
        &self,
        x: &mut Vec<f32>,
        head_dim: usize,
        cos: &Vec<f32>,
        sin: &Vec<f32>,
        half: usize,
        layout: RopeLayout,
    ) -> Result<()> {
        let rows = cos.len() / half.max(1);
        if rows == 0 || !x.len().is_multiple_of(rows * head_dim) {
            return Err(shape_err(
                "rope",
                format!("{} values for {rows} rows of {head_dim}-dim heads", x.len()),
            ));
        }
        let per_row = x.len() / rows;
        par_rows(x, per_row, |first, block| {
            for (i, row) in block.chunks_exact_mut(per_row).enumerate() {
                let r = first + i;
                let (c, s) = (
                    &cos[r * half..(r + 1) * half],
                    &sin[r * half..(r + 1) * half],
                );
                for head in row.chunks_exact_mut(head_dim) {
                    match layout {
                        RopeLayout::HalfSplit => {
                            for i in 0..half {
                                let (a, b) = (head[i], head[i + half]);
                                head[i] = a * c[i] - b * s[i];
                                head[i + half] = b * c[i] + a * s[i];
                            }
                        }
                        RopeLayout::Interleaved => {
                            for i in 0..half {
                                let (a, b) = (head[2 * i], head[2 * i + 1]);
                                head[2 * i] = a * c[i] - b * s[i];
                                head[2 * i + 1] = a * s[i] + b * c[i];
                            }
                        }
                        RopeLayout::InterleavedTail => {
                            let tail = &mut head[head_dim - 2 * half..];
                            for i in 0..half {
                                let (a, b) = (tail[2 * i], tail[2 * i + 1]);
                                tail[2 * i] = a * c[i] - b * s[i];
                                tail[2 * i + 1] = a * s[i] + b * c[i];
                            }
                        }
                    }
                }
            }
        });
        Ok(())
    }

    // ---- recurrent ----

    fn causal_conv_silu(
        &self,
        u: &Vec<f32>,
        window: &mut Vec<f32>,
        w: &Vec<f32>,
        channels: usize,
        kernel: usize,
        dilation: usize,
    ) -> Result<Vec<f32>> {
        if window.len() != (kernel - 1) * dilation * channels || w.len() != channels * kernel {
            return Err(shape_err(
                "causal_conv_silu",
                format!(
                    "window {} / weights {} for {channels} channels, kernel {kernel}, dilation {dilation}",
                    window.len(),
                    w.len()
                ),
            ));
        }
        Ok(delta_rule::causal_conv(
            u, window, w, channels, kernel, dilation,
        ))
    }

    fn delta_rule_scan(
        &self,
        d: ScanDims,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        g: &Vec<f32>,
        beta: &Vec<f32>,
        s: &mut Vec<f32>,
    ) -> Result<Vec<f32>> {
        if s.len() != d.hv * d.dk * d.dv {
            return Err(shape_err(
                "delta_rule_scan",
                format!("state of {} values for {d:?}", s.len()),
            ));
        }
        Ok(delta_rule::scan(d, q, k, v, g, beta, s))
    }

    fn kda_gate(
        &self,
        f: &Vec<f32>,
        a: &Vec<f32>,
        dt_bias: &Vec<f32>,
        dim: usize,
        lower_bound: Option<f32>,
    ) -> Result<Vec<f32>> {
        let c = dt_bias.len();
        if dim == 0 || c != a.len() * dim || c == 0 || !f.len().is_multiple_of(c) {
            return Err(shape_err(
                "kda_gate",
                format!(
                    "{} values, {} heads, {c} biases for heads of {dim}",
                    f.len(),
                    a.len()
                ),
            ));
        }
        Ok(kda_gate::kda_gate(f, a, dt_bias, dim, lower_bound))
    }

    // ---- attention ----

    fn attention_causal(
        &self,
        q: &Vec<f32>,
        k: &[&Vec<f32>],
        v: &[&Vec<f32>],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<Vec<f32>> {
        causal_over(q, k, v, offset, q_heads, kv)
    }

    fn attention_causal_batch(
        &self,
        parts: &[CausalPart<'_, Vec<f32>, Vec<f32>>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<Vec<f32>> {
        causal_over_batch(parts, q_heads, kv)
    }

    fn block_keys(
        &self,
        raw: &Vec<f32>,
        dim: usize,
        ratio: usize,
        first: usize,
        last: usize,
    ) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity((last - first) * dim);
        let mut kb = vec![0f32; dim];
        for j in first..last {
            kb.fill(0.0);
            for i in j * ratio..(j + 1) * ratio {
                for (a, b) in kb.iter_mut().zip(&raw[i * dim..(i + 1) * dim]) {
                    *a += b;
                }
            }
            for a in kb.iter_mut() {
                *a /= ratio as f32;
            }
            out.extend_from_slice(&kb);
        }
        Ok(out)
    }

    fn indexer_select(
        &self,
        q: &Vec<f32>,
        blocks: &Vec<f32>,
        base: usize,
        shape: IndexerShape,
    ) -> Result<Vec<Vec<u32>>> {
        let row = shape.heads * shape.dim;
        let mut scores = Vec::new();
        Ok(q.chunks_exact(row)
            .enumerate()
            .map(|(i, qr)| {
                indexer::select_blocks(
                    qr,
                    blocks,
                    base + i + 1,
                    shape.heads,
                    shape.dim,
                    shape.ratio,
                    shape.block_topk,
                    &mut scores,
                )
            })
            .collect())
    }

    fn selection_to_host(&self, s: &Vec<Vec<u32>>) -> Result<Vec<Vec<u32>>> {
        Ok(s.clone())
    }

    fn selection_from_host(&self, rows: &[Vec<u32>], bound: usize) -> Result<Vec<Vec<u32>>> {
        if let Some(bad) = rows.iter().flatten().find(|&&i| i as usize >= bound) {
            return Err(shape_err(
                "selection_from_host",
                format!("index {bad} of {bound} keys"),
            ));
        }
        Ok(rows.to_vec())
    }

    fn expand_pools(
        &self,
        pools: &Vec<Vec<u32>>,
        base: usize,
        pool: usize,
        tail: bool,
    ) -> Result<Vec<Vec<u32>>> {
        pool_expand::expand_pools(pools, base, pool, tail).map_err(|m| shape_err("expand_pools", m))
    }

    fn attention_gathered(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        keep: &Vec<Vec<u32>>,
        q_heads: usize,
        kv: Heads,
        sinks: Option<&Vec<f32>>,
    ) -> Result<Vec<f32>> {
        if q.len() != keep.len() * q_heads * kv.dim {
            return Err(shape_err(
                "attention_gathered",
                format!("{} query values for {} queries", q.len(), keep.len()),
            ));
        }
        if sinks.is_some_and(|s| s.len() != q_heads) {
            return Err(shape_err(
                "attention_gathered",
                format!("sinks for {q_heads} heads"),
            ));
        }
        Ok(sparse_attention::attention_gathered(
            q,
            k,
            v,
            keep,
            q_heads,
            kv.heads,
            kv.dim,
            sinks.map(|s| s.as_slice()),
        ))
    }

    fn attention_window(
        &self,
        q: &Vec<f32>,
        heads: usize,
        dim: usize,
        query_first: usize,
        window: &Vec<f32>,
        window_first: usize,
        span: usize,
        entries: &Vec<f32>,
        keep: EntryKeep<'_, Vec<Vec<u32>>>,
        sinks: &Vec<f32>,
    ) -> Result<Vec<f32>> {
        let width = heads * dim;
        let rows = q.len() / width.max(1);
        let p = window.len() / dim.max(1);
        if q.len() != rows * width
            || sinks.len() != heads
            || !entries.len().is_multiple_of(dim.max(1))
        {
            return Err(shape_err(
                "attention_window",
                format!(
                    "{} query values, {} sinks for {heads} heads of {dim}",
                    q.len(),
                    sinks.len()
                ),
            ));
        }
        if query_first + rows > window_first + p || query_first < window_first {
            return Err(shape_err(
                "attention_window",
                format!(
                    "queries {query_first}..{} outside the window rows {window_first}..{}",
                    query_first + rows,
                    window_first + p
                ),
            ));
        }
        let n_entries = entries.len() / dim.max(1);
        if let EntryKeep::Selected(sel) = keep
            && (sel.len() != rows || sel.iter().flatten().any(|&e| e as usize >= n_entries))
        {
            return Err(shape_err(
                "attention_window",
                format!("a selection of {} rows over {n_entries} entries", sel.len()),
            ));
        }
        let mut out = vec![0f32; rows * width];
        par_rows(&mut out, width, |first, block| {
            let mut scores = Vec::new();
            for (i, o) in block.chunks_exact_mut(width).enumerate() {
                let r = first + i;
                let t = query_first + r;
                let lo = (t + 1).saturating_sub(span).max(window_first) - window_first;
                let entries_seen = match keep {
                    EntryKeep::None => window_attention::EntryList::Prefix(0),
                    EntryKeep::Causal { ratio } => {
                        window_attention::EntryList::Prefix(((t + 1) / ratio.max(1)).min(n_entries))
                    }
                    EntryKeep::Selected(sel) => window_attention::EntryList::Listed(&sel[r]),
                };
                let keys = window_attention::QueryKeys {
                    lo,
                    hi: t + 1 - window_first,
                    entries: entries_seen,
                };
                window_attention::attend_one(
                    &q[r * width..][..width],
                    window,
                    entries,
                    &keys,
                    dim,
                    sinks,
                    &mut scores,
                    o,
                );
            }
        });
        Ok(out)
    }

    // ---- compression ----

    fn softmax_pool(
        &self,
        kv: &Vec<f32>,
        gate: &Vec<f32>,
        slots: usize,
        dim: usize,
    ) -> Result<Vec<f32>> {
        if kv.len() != gate.len() || slots == 0 || !kv.len().is_multiple_of(slots * dim.max(1)) {
            return Err(shape_err(
                "softmax_pool",
                format!(
                    "{} kv and {} gate values in groups of {slots}×{dim}",
                    kv.len(),
                    gate.len()
                ),
            ));
        }
        Ok(compression::softmax_pool(kv, gate, slots, dim))
    }

    fn index_scores(
        &self,
        q: &Vec<f32>,
        weights: &Vec<f32>,
        keys: &Vec<f32>,
        rows: usize,
        heads: usize,
        dim: usize,
        scale: f32,
        w_scale: f32,
    ) -> Result<Vec<f32>> {
        if q.len() != rows * heads * dim
            || weights.len() != rows * heads
            || !keys.len().is_multiple_of(dim.max(1))
        {
            return Err(shape_err(
                "index_scores",
                format!(
                    "{} query values, {} weights for {rows} rows of {heads}×{dim}",
                    q.len(),
                    weights.len()
                ),
            ));
        }
        let e = keys.len() / dim.max(1);
        let mut out = vec![0f32; rows * e];
        if e == 0 {
            return Ok(out);
        }
        par_rows(&mut out, e, |first, block| {
            for (i, o) in block.chunks_exact_mut(e).enumerate() {
                let r = first + i;
                compression::index_scores_row(
                    &q[r * heads * dim..][..heads * dim],
                    &weights[r * heads..][..heads],
                    keys,
                    dim,
                    scale,
                    w_scale,
                    o,
                );
            }
        });
        Ok(out)
    }

    fn select_topk(
        &self,
        scores: &Vec<f32>,
        rows: usize,
        width: usize,
        limits: &[usize],
        k: usize,
    ) -> Result<Vec<Vec<u32>>> {
        if scores.len() != rows * width || limits.len() != rows || limits.iter().any(|&l| l > width)
        {
            return Err(shape_err(
                "select_topk",
                format!(
                    "{} scores, {} limits for {rows} rows of {width}",
                    scores.len(),
                    limits.len()
                ),
            ));
        }
        let mut scratch = Vec::new();
        Ok((0..rows)
            .map(|r| {
                compression::select_topk_row(
                    &scores[r * width..][..width],
                    limits[r],
                    k,
                    &mut scratch,
                )
            })
            .collect())
    }

    // ---- element-wise ----

    fn add(&self, a: &Vec<f32>, b: &Vec<f32>) -> Result<Vec<f32>> {
        if a.len() != b.len() {
            return Err(shape_err("add", format!("{} + {}", a.len(), b.len())));
        }
        Ok(par_map(a.len(), |i| a[i] + b[i]))
    }

    fn mul(&self, a: &Vec<f32>, b: &Vec<f32>) -> Result<Vec<f32>> {
        if a.len() != b.len() {
            return Err(shape_err("mul", format!("{} * {}", a.len(), b.len())));
        }
        Ok(par_map(a.len(), |i| a[i] * b[i]))
    }

    fn affine(&self, x: &Vec<f32>, mul: f32, add: f32) -> Result<Vec<f32>> {
        Ok(x.iter().map(|v| v * mul + add).collect())
    }

    fn add_bias(&self, x: &Vec<f32>, b: &Vec<f32>, width: usize) -> Result<Vec<f32>> {
        if width == 0 || b.len() != width || !x.len().is_multiple_of(width) {
            return Err(shape_err(
                "add_bias",
                format!(
                    "{} values, a bias of {} for rows of {width}",
                    x.len(),
                    b.len()
                ),
            ));
        }
        Ok(par_map(x.len(), |i| x[i] + b[i % width]))
    }

    fn gelu(&self, x: &Vec<f32>, form: GeluForm) -> Result<Vec<f32>> {
        Ok(match form {
            GeluForm::Erf => par_map(x.len(), |i| gelu_erf(x[i])),
            GeluForm::Tanh => par_map(x.len(), |i| gelu_tanh(x[i])),
        })
    }

    fn silu(&self, x: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(par_map(x.len(), |i| silu(x[i])))
    }

    fn sigmoid(&self, x: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(x.iter().map(|&v| ((-v).exp() + 1.0).recip()).collect())
    }

    fn swiglu(&self, gu: &Vec<f32>, inter: usize, limit: Option<f32>) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(gu.len() / 2);
        for row in gu.chunks_exact(2 * inter) {
            let (g, u) = row.split_at(inter);
            out.extend(g.iter().zip(u).map(|(&g, &u)| experts::swiglu(g, u, limit)));
        }
        Ok(out)
    }

    fn softplus_decay(
        &self,
        a: &Vec<f32>,
        neg_a: &Vec<f32>,
        dt_bias: &Vec<f32>,
    ) -> Result<Vec<f32>> {
        let h = neg_a.len();
        Ok(a.iter()
            .enumerate()
            .map(|(i, &ai)| {
                let j = i % h;
                let x = ai + dt_bias[j];
                // torch's softplus (threshold 20: linear above it).
                let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
                neg_a[j] * sp
            })
            .collect())
    }

    fn scale_rows(&self, x: &Vec<f32>, s: &Vec<f32>, width: usize) -> Result<Vec<f32>> {
        Ok(x.chunks_exact(width)
            .zip(s)
            .flat_map(|(row, &s)| row.iter().map(move |v| v * s))
            .collect())
    }

    fn ple_gate(
        &self,
        key: &Vec<f32>,
        qry: &Vec<f32>,
        val: &Vec<f32>,
        c: usize,
        h: usize,
    ) -> Result<Vec<f32>> {
        let ch = c * h;
        let t_len = val.len() / h;
        let mut gv = vec![0f32; t_len * ch];
        let inv_sqrt_h = 1.0 / (h as f32).sqrt();
        for t in 0..t_len {
            for s in 0..c {
                let o = t * ch + s * h;
                let dot: f32 = key[o..o + h]
                    .iter()
                    .zip(&qry[o..o + h])
                    .map(|(a, b)| a * b)
                    .sum();
                let g = dot * inv_sqrt_h;
                let sign = if g > 0.0 {
                    1.0
                } else if g < 0.0 {
                    -1.0
                } else {
                    0.0
                };
                let g = g.abs().max(1e-6).sqrt() * sign;
                let sg = sigmoid(g);
                for (dst, v) in gv[o..o + h].iter_mut().zip(&val[t * h..(t + 1) * h]) {
                    *dst = sg * v;
                }
            }
        }
        Ok(gv)
    }

    fn hc_sinkhorn(
        &self,
        z: &Vec<f32>,
        base: &Vec<f32>,
        scale: &Vec<f32>,
        n: usize,
        iters: usize,
        eps: f32,
    ) -> Result<Vec<f32>> {
        let width = (2 + n) * n;
        if base.len() != width || scale.len() != 3 || !z.len().is_multiple_of(width) {
            return Err(shape_err(
                "hc_sinkhorn",
                format!("z {}, base {}, N {n}", z.len(), base.len()),
            ));
        }
        Ok(z.chunks_exact(width)
            .flat_map(|row| hyper::sinkhorn_row(row, base, scale, n, iters, eps))
            .collect())
    }

    fn hc_pre(&self, xs: &Vec<f32>, mix: &Vec<f32>, n: usize) -> Result<Vec<f32>> {
        let width = (2 + n) * n;
        let rows = mix.len() / width;
        if rows == 0 || !xs.len().is_multiple_of(rows * n) {
            return Err(shape_err(
                "hc_pre",
                format!("{} stream values, {rows} rows", xs.len()),
            ));
        }
        let d = xs.len() / (rows * n);
        Ok(hyper::pre(xs, mix, n, d))
    }

    fn hc_post(&self, xs: &Vec<f32>, y: &Vec<f32>, mix: &Vec<f32>, n: usize) -> Result<Vec<f32>> {
        let width = (2 + n) * n;
        let rows = mix.len() / width;
        if rows == 0 || y.len() * n != xs.len() || !y.len().is_multiple_of(rows) {
            return Err(shape_err(
                "hc_post",
                format!("{} stream values, y {}", xs.len(), y.len()),
            ));
        }
        Ok(hyper::post(xs, y, mix, n, y.len() / rows))
    }

    fn tile_streams(&self, x: &Vec<f32>, c: usize, h: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(x.len() * c);
        for row in x.chunks_exact(h) {
            for _ in 0..c {
                out.extend_from_slice(row);
            }
        }
        Ok(out)
    }

    fn mean_streams(&self, x: &Vec<f32>, c: usize, h: usize) -> Result<Vec<f32>> {
        let inv = (1f64 / c as f64) as f32;
        let mut out = Vec::with_capacity(x.len() / c);
        for row in x.chunks_exact(c * h) {
            for j in 0..h {
                let mut s = 0f32;
                for st in 0..c {
                    s += row[st * h + j];
                }
                out.push(s * inv + 0.0);
            }
        }
        Ok(out)
    }

    fn inject_streams(
        &self,
        xs: &Vec<f32>,
        y: &Vec<f32>,
        inj: &Vec<f32>,
        c: usize,
    ) -> Result<Vec<f32>> {
        let rows = inj.len() / c;
        let h = y.len() / rows.max(1);
        let mut out = Vec::with_capacity(xs.len());
        for t in 0..rows {
            for s in 0..c {
                let w = inj[t * c + s];
                for j in 0..h {
                    out.push(xs[(t * c + s) * h + j] + w * y[t * h + j]);
                }
            }
        }
        Ok(out)
    }

    // ---- steps (graph mode): the eager ops at the step's values ----

    fn step_graphs(&self) -> bool {
        false
    }

    fn storage_key(&self, x: &Vec<f32>) -> [u64; 2] {
        [x.as_ptr() as u64, x.capacity() as u64]
    }

    fn run_step(
        &self,
        _key: &[u64],
        pos: usize,
        ids: &[u32],
        body: &mut StepBody<'_, HostStep, Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>> {
        body(&HostStep {
            pos,
            ids: ids.to_vec(),
        })
    }

    fn resize(&self, dst: &mut Vec<f32>, n: usize, _grow_to: usize) -> Result<()> {
        dst.resize(n, 0.0);
        Ok(())
    }

    fn gather_rows_step(&self, table: &CpuTable, step: &HostStep) -> Result<Vec<f32>> {
        self.gather_rows(table, &step.ids)
    }

    fn rows_step(
        &self,
        x: &Vec<f32>,
        width: usize,
        step: &HostStep,
        count: usize,
    ) -> Result<Vec<f32>> {
        self.rows(x, width, step.pos, count)
    }

    fn write_rows_step(
        &self,
        dst: &mut Vec<f32>,
        src: &Vec<f32>,
        width: usize,
        step: &HostStep,
    ) -> Result<()> {
        let at = step.pos * width;
        match dst.get_mut(at..at + src.len()) {
            Some(d) => {
                d.copy_from_slice(src);
                Ok(())
            }
            None => Err(shape_err(
                "write_rows_step",
                format!(
                    "{} values at {at} of a buffer of {} (resize it first)",
                    src.len(),
                    dst.len()
                ),
            )),
        }
    }

    fn attention_causal_step(
        &self,
        q: &Vec<f32>,
        k: &[&Vec<f32>],
        v: &[&Vec<f32>],
        step: &HostStep,
        q_heads: usize,
        kv: Heads,
    ) -> Result<Vec<f32>> {
        self.attention_causal(q, k, v, step.pos, q_heads, kv)
    }

    fn half_empty(&self) -> Result<Vec<half::f16>> {
        Ok(Vec::new())
    }

    fn half_len(&self, x: &Vec<half::f16>) -> usize {
        x.len()
    }

    fn half_append(&self, dst: &mut Vec<half::f16>, src: &Vec<f32>) -> Result<()> {
        // `half` rounds to nearest even (F16C's `vcvtps2ph` where present).
        dst.extend(src.iter().map(|&x| half::f16::from_f32(x)));
        Ok(())
    }

    fn half_truncate(&self, dst: &mut Vec<half::f16>, n: usize) -> Result<()> {
        dst.truncate(n);
        Ok(())
    }

    fn half_download(&self, x: &Vec<half::f16>) -> Result<Vec<f32>> {
        Ok(x.iter().map(|h| h.to_f32()).collect())
    }

    fn attention_causal_half(
        &self,
        q: &Vec<f32>,
        k: &[&Vec<half::f16>],
        v: &[&Vec<half::f16>],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<Vec<f32>> {
        causal_over(q, k, v, offset, q_heads, kv)
    }

    fn attention_causal_half_batch(
        &self,
        parts: &[CausalPart<'_, Vec<f32>, Vec<half::f16>>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<Vec<f32>> {
        causal_over_batch(parts, q_heads, kv)
    }
}

/// The values of rows `first .. first + count` of `x: [_, width]`, or the
/// shape error `op` reports.
fn row_span(
    op: &str,
    x: &[f32],
    width: usize,
    first: usize,
    count: usize,
) -> Result<std::ops::Range<usize>> {
    let (a, b) = (first * width, (first + count) * width);
    if b > x.len() {
        return Err(shape_err(
            op,
            format!(
                "rows {first}..{} of a {}-row buffer",
                first + count,
                x.len() / width.max(1)
            ),
        ));
    }
    Ok(a..b)
}

#[cfg(test)]
mod tests {
    //! Each element-wise and norm op against the candle expression the
    //! families evaluated before the op inventory (bit for bit), and the
    //! layout ops against their definitions.
    use super::*;
    use candle_core::D;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32) * 0.731 + seed).sin() * (1.0 + (i % 5) as f32))
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// `row_runs` is its runs' `rows` one after another (empty and single
    /// rows among them); a run past the buffer and no runs are errors.
    #[test]
    fn row_runs_join_their_runs_rows() {
        let ops = CpuOps;
        let x = data(7 * 3, 0.5);
        let runs = [(5, 2), (0, 1), (3, 0), (1, 3), (6, 1)];
        let mut want = Vec::new();
        for &(first, count) in &runs {
            want.extend(ops.rows(&x, 3, first, count).unwrap());
        }
        assert_eq!(ops.row_runs(&x, 3, &runs).unwrap(), want);
        assert!(ops.row_runs(&x, 3, &[(6, 2)]).is_err());
        assert!(ops.row_runs(&x, 3, &[]).is_err());
    }

    /// `matmul_many` over block matrices (one pool dispatch for all the
    /// products) has the bits of the parts one by one, epilogues included;
    /// with an f32 part among them it runs the parts one by one.
    #[test]
    fn matmul_many_equals_its_parts() {
        use crate::backend::Unary;
        let ops = CpuOps;
        let k = 96;
        use candle_core::quantized::{GgmlDType, QTensor};
        let block = |n: usize, dtype: GgmlDType, seed: f32| {
            let q = QTensor::quantize(&t(&data(n * k, seed), &[n, k]), dtype).unwrap();
            let q = crate::quant::from_candle(&q).unwrap();
            ops.matrix(HostWeight::Quant(Arc::new(q)), n, k).unwrap()
        };
        let (a, b) = (
            block(40, GgmlDType::Q4_1, 0.1),
            block(9, GgmlDType::Q4_1, 0.2),
        );
        let (c, d) = (
            block(12, GgmlDType::Q8_0, 0.3),
            block(6, GgmlDType::Q4_1, 0.4),
        );
        let f = ops
            .matrix(HostWeight::F32(t(&data(5 * k, 0.5), &[5, k])), 5, k)
            .unwrap();
        assert!(matches!(a, CpuMatrix::Block(_)) && matches!(c, CpuMatrix::Block(_)));
        let silu: &[Unary] = &[Unary::Silu];
        let gate: &[Unary] = &[Unary::Affine(0.25, 0.0), Unary::Sigmoid];
        let all = [
            (&a, Epilogue::Chain(&[])),
            (&b, Epilogue::Chain(silu)),
            (&c, Epilogue::Swiglu(None)),
            (&d, Epilogue::Swiglu(Some(0.5))),
            (&a, Epilogue::Chain(gate)),
        ];
        let with_f32 = [(&a, Epilogue::Chain(&[])), (&f, Epilogue::Chain(silu))];
        for parts in [&all[..], &all[..2], &with_f32[..]] {
            for rows in [1, 3] {
                let x = data(rows * k, rows as f32);
                let many = ops.matmul_many(&x, rows, parts).unwrap();
                let want = composed::matmul_many(&ops, &x, rows, parts).unwrap();
                assert_eq!(many.len(), parts.len());
                for (i, (g, w)) in many.iter().zip(&want).enumerate() {
                    assert_eq!(bits(g), bits(w), "part {i}, {rows} rows");
                }
            }
        }
        assert!(ops.matmul_many(&data(k + 1, 0.0), 1, &all).is_err());
    }

    fn t(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(v, shape, &Device::Cpu).unwrap()
    }

    fn h(t: &Tensor) -> Vec<f32> {
        host(t).unwrap()
    }

    #[test]
    fn unary_chains_are_their_steps_in_turn() {
        use crate::backend::Unary;
        let ops = CpuOps;
        let x = data(37, 0.4);
        let chain = [
            Unary::Affine(0.25, 0.0),
            Unary::Sigmoid,
            Unary::Affine(2.0, 0.0),
        ];
        let steps = ops
            .affine(
                &ops.sigmoid(&ops.affine(&x, 0.25, 0.0).unwrap()).unwrap(),
                2.0,
                0.0,
            )
            .unwrap();
        assert_eq!(bits(&ops.unary_chain(&x, &chain).unwrap()), bits(&steps));
        let silu = ops.silu(&ops.affine(&x, 0.5, -1.0).unwrap()).unwrap();
        let chain = [Unary::Affine(0.5, -1.0), Unary::Silu];
        assert_eq!(bits(&ops.unary_chain(&x, &chain).unwrap()), bits(&silu));
        assert!(ops.unary_chain(&x, &[]).is_err());
        assert!(ops.unary_chain(&x, &[Unary::Silu; 5]).is_err());
    }

    #[test]
    fn element_wise_ops_equal_candle() {
        let ops = CpuOps;
        let (x, y) = (data(96, 0.3), data(96, 1.9));
        let tx = t(&x, &[4, 24]);
        let ty = t(&y, &[4, 24]);
        assert_eq!(bits(&ops.silu(&x).unwrap()), bits(&h(&tx.silu().unwrap())));
        assert_eq!(
            bits(&ops.sigmoid(&x).unwrap()),
            bits(&h(&candle_nn::ops::sigmoid(&tx).unwrap()))
        );
        assert_eq!(
            bits(&ops.add(&x, &y).unwrap()),
            bits(&h(&(&tx + &ty).unwrap()))
        );
        assert_eq!(
            bits(&ops.mul(&x, &y).unwrap()),
            bits(&h(&(&tx * &ty).unwrap()))
        );
        assert_eq!(
            bits(&ops.affine(&x, (1.0 / 3f64) as f32, 0.0).unwrap()),
            bits(&h(&(&tx / 3.0).unwrap()))
        );
        // swiglu = silu(g)·u over [g | u] rows.
        let g = tx.narrow(1, 0, 12).unwrap();
        let u = tx.narrow(1, 12, 12).unwrap();
        assert_eq!(
            bits(&ops.swiglu(&x, 12, None).unwrap()),
            bits(&h(&(g.silu().unwrap() * &u).unwrap()))
        );
        // The clamped form: silu(min(g, L))·clamp(u, ±L), L below some values.
        let lim = 2.5;
        assert_eq!(
            bits(&ops.swiglu(&x, 12, Some(lim)).unwrap()),
            bits(&h(&(g.minimum(lim).unwrap().silu().unwrap()
                * u.clamp(-lim, lim).unwrap())
            .unwrap()))
        );
        assert!(x.iter().any(|v| v.abs() > lim));
        // scale_rows = broadcast_mul by a [rows, 1] column.
        let s = data(4, 7.0);
        assert_eq!(
            bits(&ops.scale_rows(&x, &s, 24).unwrap()),
            bits(&h(&tx.broadcast_mul(&t(&s, &[4, 1])).unwrap()))
        );
    }

    #[test]
    fn stream_ops_equal_candle() {
        let ops = CpuOps;
        let (rows, c, hd) = (3, 4, 10);
        let x = data(rows * hd, 0.5);
        let tiled = ops.tile_streams(&x, c, hd).unwrap();
        let tx = t(&x, &[rows, hd]);
        let want = Tensor::cat(&vec![&tx; c], D::Minus1).unwrap();
        assert_eq!(bits(&tiled), bits(&h(&want)));
        let xs = data(rows * c * hd, 2.5);
        let txs = t(&xs, &[rows, c, hd]);
        assert_eq!(
            bits(&ops.mean_streams(&xs, c, hd).unwrap()),
            bits(&h(&txs.mean(1).unwrap()))
        );
        let inj = data(rows * c, 4.0);
        let add = t(&inj, &[rows, c])
            .unsqueeze(2)
            .unwrap()
            .broadcast_mul(&tx.unsqueeze(1).unwrap())
            .unwrap()
            .reshape((rows, c * hd))
            .unwrap();
        assert_eq!(
            bits(&ops.inject_streams(&xs, &x, &inj, c).unwrap()),
            bits(&h(&(t(&xs, &[rows, c * hd]) + add).unwrap()))
        );
    }

    #[test]
    fn norms_and_rope_equal_candle() {
        let ops = CpuOps;
        let (rows, w) = (3, 16);
        let x = data(rows * w, 0.1);
        let wt = data(w, 3.3);
        assert_eq!(
            bits(&ops.rms_norm(&x, w, &wt, 1e-5).unwrap()),
            bits(&h(&candle_nn::ops::rms_norm(
                &t(&x, &[rows, w]),
                &t(&wt, &[w]),
                1e-5
            )
            .unwrap()))
        );
        // rope (half split and interleaved) against candle's kernels.
        let (heads, d) = (2, 8);
        let xr = data(rows * heads * d, 0.9);
        let cos = data(rows * d / 2, 1.2);
        let sin = data(rows * d / 2, 5.1);
        let x4 = t(&xr, &[rows, heads, d])
            .transpose(0, 1)
            .unwrap()
            .contiguous()
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let (tc, ts) = (t(&cos, &[rows, d / 2]), t(&sin, &[rows, d / 2]));
        for (layout, want) in [
            (
                RopeLayout::HalfSplit,
                candle_nn::rotary_emb::rope(&x4, &tc, &ts),
            ),
            (
                RopeLayout::Interleaved,
                candle_nn::rotary_emb::rope_i(&x4, &tc, &ts),
            ),
        ] {
            let want = want
                .unwrap()
                .squeeze(0)
                .unwrap()
                .transpose(0, 1)
                .unwrap()
                .contiguous()
                .unwrap();
            let mut got = xr.clone();
            ops.rope(&mut got, d, &cos, &sin, d / 2, layout).unwrap();
            assert_eq!(bits(&got), bits(&h(&want)), "{layout:?}");
        }
    }

    #[test]
    fn layout_ops_round_trip() {
        let ops = CpuOps;
        let x = data(2 * 3 * 5, 0.0);
        // Per-head [a(2) | b(3)] with 3 heads → a: [2, 6], b: [2, 9].
        let parts = ops.split_cols(&x, 2, &[2, 3], 3).unwrap();
        assert_eq!(parts[0].len(), 12);
        assert_eq!(parts[1][..3], x[2..5]);
        let joined = ops
            .concat_cols(&[(&parts[0], 6), (&parts[1], 9)], 2)
            .unwrap();
        assert_eq!(joined.len(), x.len());
        let whole = ops.split_cols(&joined, 2, &[6, 9], 1).unwrap();
        assert_eq!(whole[0], parts[0]);
        assert!(ops.split_cols(&x, 2, &[4, 4], 1).is_err());
        let mut c = ops.zeros(0).unwrap();
        ops.append(&mut c, &x).unwrap();
        assert_eq!(ops.rows(&c, 5, 2, 2).unwrap(), x[10..20].to_vec());
        assert!(ops.rows(&c, 5, 5, 2).is_err());
    }

    /// The causal-attention op over token-major caches (GQA grouping,
    /// offset window) matches an f64 softmax attention.
    #[test]
    fn attention_causal_matches_f64_softmax_attention() {
        let ops = CpuOps;
        let (hq, kvh, d, offset, t_len) = (4, 2, 8, 5, 3);
        let total = offset + t_len;
        let q = data(t_len * hq * d, 0.2);
        let k = data(total * kvh * d, 1.4);
        let v = data(total * kvh * d, 2.6);
        // Per-head caches `[total, d]`.
        let split = |x: &[f32]| -> Vec<Vec<f32>> {
            (0..kvh)
                .map(|h| {
                    (0..total)
                        .flat_map(|j| x[(j * kvh + h) * d..][..d].to_vec())
                        .collect()
                })
                .collect()
        };
        let (kh, vh) = (split(&k), split(&v));
        let y = ops
            .attention_causal(
                &q,
                &kh.iter().collect::<Vec<_>>(),
                &vh.iter().collect::<Vec<_>>(),
                offset,
                hq,
                Heads { heads: kvh, dim: d },
            )
            .unwrap();
        let group = hq / kvh;
        for i in 0..t_len {
            for qh in 0..hq {
                let kv = qh / group;
                let qv = &q[(i * hq + qh) * d..][..d];
                let scores: Vec<f32> = (0..=offset + i)
                    .map(|j| {
                        let kj = &k[(j * kvh + kv) * d..][..d];
                        qv.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let p: Vec<f64> = scores.iter().map(|s| ((s - m) as f64).exp()).collect();
                let z: f64 = p.iter().sum();
                for e in 0..d {
                    let want: f64 = (0..=offset + i)
                        .map(|j| p[j] * v[(j * kvh + kv) * d + e] as f64)
                        .sum::<f64>()
                        / z;
                    let got = y[(i * hq + qh) * d + e] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "({i}, {qh}, {e}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
