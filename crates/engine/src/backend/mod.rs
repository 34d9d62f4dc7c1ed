//! The op inventory: the short, explicit list of device-neutral operations
//! every family's forward is written against, and its backends.
//!
//! A family holds its weights as [`Backend::Matrix`] / [`Backend::Buf`] and
//! calls only the methods of [`Backend`] (statically dispatched: a model is
//! generic over its backend). It never names a device, an ISA or a host copy:
//! the one read-back of a forward is the logits rows its caller asked for
//! ([`Backend::download`]), and export/import of a state go through host
//! tensors. Caches are `Buf`s that grow with [`Backend::append`].
//!
//! The list is the porting checklist of the next backend. Every op states
//! the order in which each output element is reduced; that order depends on
//! the reduction length alone, never on the number of rows in the call, so a
//! token's bits do not depend on the prefill chunk, decode step or verify
//! window it ran in (`shared/specs/backend.md`, "Exactness"). [`cpu`] is the
//! reference implementation. A fused op (`matmul_gated_mean`,
//! `delta_inputs`, `inject_streams_norm`, …) is defined as its parts in
//! order; its default runs them ([`composed`]), and a device fuses only
//! where the bits stay those of the parts.
//!
//! | group | ops |
//! |---|---|
//! | memory | `upload`, `download`, `zeros`, `len`, `rows`, `append`, `truncate`, `concat_cols`, `split_cols` |
//! | weights | `matrix`, `experts`, `table` + `gather_rows` (embedding) |
//! | linear | `matmul` (f32 and block formats, 1..N rows), `matmul_unary` (a product, then a `unary_chain`), `matmul_many` (several products of one input, each with its chain or a SwiGLU), `matmul_grouped` (a block-diagonal product: each group of columns through its own matrix), `experts_swiglu` (gathered routed experts), `experts_swiglu_gated` (plus a gated shared expert) |
//! | routing | `route_softmax_topk`, `route_scored` (sqrt-softplus / sigmoid, bias, group limit, hash) |
//! | norms | `rms_norm`, `rms_norm_grouped` (zero-centred, per-group statistics), `rms_norm_heads`, `l2_norm_heads`, `gated_rms_norm`, `layer_norm` (with bias) |
//! | position | `rope` (per-row cos/sin tables: plain, partial, M-RoPE, llama3, YaRN) |
//! | recurrent | `causal_conv_silu`, `delta_inputs` (a GDN's conv, split, q/k norms and decays: the ops one by one, or one launch), `delta_rule_scan` (per-head or per-channel decay), `kda_gate` |
//! | attention | `attention_causal` (over a cache), `block_keys`, `indexer_select`, `expand_pools`, `attention_gathered` (with sinks), `selection_from_host` (a selection the caller lists: a vision tower's per-image attention), `attention_window` (sliding window + compressed entries + sinks) |
//! | compression | `softmax_pool` (gated pooling of token groups), `index_scores` + `select_topk` (lightning indexer) |
//! | steps | `step_graphs`, `storage_key`, `run_step`, `run_pure` (a pure unit of ops a device may replay), `resize`, `gather_rows_step`, `rows_step`, `write_rows_step`, `attention_causal_step` (decode / verify steps whose per-step inputs come from a [`Backend::Step`], so a device can replay them as a graph) |
//! | element-wise | `add`, `add_bias`, `mul`, `affine`, `silu`, `sigmoid`, `unary_chain`, `gelu` (erf or tanh form), `swiglu`, `softplus_decay`, `scale_rows`, `add_gated_rows`, `ple_gate`, `tile_streams`, `mean_streams`, `gated_mean_streams`, `matmul_gated_mean` (the mix's gates as a product), `inject_streams`, `inject_streams_norm` (the inject, then the next mix's grouped norm), `hc_sinkhorn`, `hc_pre`, `hc_post` (mHC) |

pub mod composed;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kernel_set;
pub mod split;

use std::fmt::Debug;
use std::sync::Arc;

use crate::quant::QuantTensor;
use candle_core::Tensor;

use crate::error::{EngineError, Result};

pub use cpu::CpuOps;
#[cfg(feature = "cuda")]
pub use cuda::CudaOps;
pub use kernel_set::KernelSet;

/// The per-step inputs as the CPU reads them: the cache length before the
/// step and the step's token ids.
#[derive(Debug, Clone)]
pub struct HostStep {
    pub pos: usize,
    pub ids: Vec<u32>,
}

/// The body of a step ([`Backend::run_step`]): the step's ops, given the
/// step's parameters, returning its outputs.
pub type StepBody<'a, S, B> = dyn FnMut(&S) -> Result<Vec<B>> + 'a;

/// The body of a pure unit ([`Backend::run_pure`]): ops over the given
/// inputs, returning outputs.
pub type PureBody<'a, B> = dyn FnMut(&[&B]) -> Result<Vec<B>> + 'a;

/// Rows up to which the families run their pure units through
/// [`Backend::run_pure`] (decode steps and verify windows); a prefill chunk
/// runs eagerly rather than keep a graph per chunk length.
pub const PURE_MAX_ROWS: usize = 8;

/// A new model identity for pure-unit keys ([`Backend::run_pure`]): a
/// replayed unit reads the weights of the model that captured it, so no two
/// models (of any family) may share a key; every model takes one at load.
pub fn pure_scope() -> u64 {
    static SCOPES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    SCOPES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Which backend and kernel set produced a state: part of every checkpoint's
/// identity, because bits differ between backends and kernel sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendId {
    /// `cpu`, `cuda`, …
    pub backend: &'static str,
    /// The kernel set (`avx2`, `avx512`, `portable`, `sm_90a`, …).
    pub kernels: String,
    /// What a checkpoint's identity records (stable across releases, so a
    /// new build keeps accepting the checkpoints an older one wrote).
    pub tag: String,
}

impl std::fmt::Display for BackendId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.backend, self.kernels)
    }
}

/// A weight as read from a file, before a backend places it.
#[derive(Debug, Clone)]
pub enum HostWeight {
    /// Row-major f32 on the host (safetensors, or a float GGUF tensor).
    F32(Tensor),
    /// A stored tensor kept in its file's type (GGUF blocks, 16-bit floats,
    /// FP8 / FP4 with their scales), usually a view of a memory map.
    Quant(Arc<QuantTensor>),
    /// Random weights described by a seed ([`crate::load::synthetic`]),
    /// materialised by the backend that places them (on the device where
    /// it can).
    Synthetic(Arc<crate::load::synthetic::SyntheticWeight>),
    /// 2-D weights of one width stacked by rows whose stored types differ
    /// (a fused q/k/v or gate/up where a quantization mix gave the parts
    /// different types): each part keeps its type, and a product computes
    /// each output column with its own part's kernel.
    Rows(Vec<HostWeight>),
}

impl HostWeight {
    pub fn dims(&self) -> Vec<usize> {
        match self {
            HostWeight::F32(t) => t.dims().to_vec(),
            HostWeight::Quant(q) => q.dims.clone(),
            HostWeight::Synthetic(s) => s.dims.clone(),
            HostWeight::Rows(parts) => {
                let cols = parts.first().map_or(0, |p| p.dims()[1]);
                vec![parts.iter().map(|p| p.dims()[0]).sum(), cols]
            }
        }
    }

    /// Synthetic weights materialised on the host; others as they are.
    pub fn on_host(self) -> Result<Self> {
        match self {
            HostWeight::Synthetic(s) => s.to_host(),
            other => Ok(other),
        }
    }

    /// The values as an f32 host tensor (stored types dequantized as their
    /// format defines them).
    pub fn to_f32(self) -> Result<Tensor> {
        match self.on_host()? {
            HostWeight::F32(t) => Ok(t),
            HostWeight::Quant(q) => Ok(Tensor::from_vec(
                q.to_f32_vec(),
                q.dims.clone(),
                &candle_core::Device::Cpu,
            )?),
            HostWeight::Synthetic(s) => s.to_f32(),
            HostWeight::Rows(parts) => {
                let parts = parts
                    .into_iter()
                    .map(HostWeight::to_f32)
                    .collect::<Result<Vec<_>>>()?;
                Ok(Tensor::cat(&parts, 0)?)
            }
        }
    }
}

/// One session's share of [`Backend::delta_rule_scan_parts`]: its scan
/// inputs (as [`Backend::delta_rule_scan`] takes them) and its state.
pub struct ScanPart<'a, Buf> {
    pub q: &'a Buf,
    pub k: &'a Buf,
    pub v: &'a Buf,
    pub g: &'a Buf,
    pub beta: &'a Buf,
    pub s: &'a mut Buf,
}

/// Dimensions of one delta-rule scan: `Hk` key heads of `dk`, `Hv` value
/// heads of `dv` (value head `j` reads key head `j / (Hv/Hk)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDims {
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// The activation applied to the gate of a gated RMSNorm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAct {
    Sigmoid,
    Silu,
}

/// One step of [`Backend::unary_chain`]: the element-wise op of the same
/// name, with its rounding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    /// `x·mul + add` ([`Backend::affine`]).
    Affine(f32, f32),
    /// [`Backend::silu`].
    Silu,
    /// [`Backend::sigmoid`].
    Sigmoid,
}

/// Steps a [`Backend::unary_chain`] takes at most.
pub const UNARY_CHAIN_MAX: usize = 4;

/// What one product of [`Backend::matmul_many`] becomes as it is stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Epilogue<'a> {
    /// `unary_chain(x·wᵀ, chain)` ([`Backend::matmul_unary`]; an empty
    /// chain is the product).
    Chain(&'a [Unary]),
    /// `swiglu(x·wᵀ, out/2, limit)` ([`Backend::swiglu`]): the matrix's rows
    /// are `[gate | up]`, the result has half as many columns.
    Swiglu(Option<f32>),
}

/// The two GELU forms checkpoints use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GeluForm {
    /// `0.5·x·(1 + erf(x/√2))` (torch `nn.GELU()`).
    Erf,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` (`gelu_pytorch_tanh`).
    Tanh,
}

/// How the two halves of a RoPE pair are laid out in a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Dim `i` pairs with `i + R/2` (GPT-NeoX / transformers).
    HalfSplit,
    /// Dim `2i` pairs with `2i + 1` (GGUF llama).
    Interleaved,
    /// Dim `o + 2i` pairs with `o + 2i + 1`, `o = head_dim − 2·half`: the
    /// rotated dims are the head's trailing ones (DeepSeek-V4's `[nope |
    /// rope]` heads).
    InterleavedTail,
}

/// Which compressed entries a query of [`Backend::attention_window`] sees,
/// besides its sliding window.
#[derive(Debug, Clone, Copy)]
pub enum EntryKeep<'a, S> {
    /// None (a sliding-only layer).
    None,
    /// Every entry already complete for the query: entry `e` of `ratio`
    /// tokens is visible to the query at token `t` iff `e < (t + 1) /
    /// ratio` (DeepSeek-V4's HCA).
    Causal { ratio: usize },
    /// The entries an indexer selected for each query (CSA).
    Selected(&'a S),
}

/// Geometry of a cache of attention keys/values: `[P, heads·d]` token-major
/// rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub heads: usize,
    pub dim: usize,
}

/// One session's share of [`Backend::attention_causal_batch`]: its scaled
/// queries `[t, Hq·d]`, its cache's keys and values per kv head (`K` is the
/// backend's f32 or f16 buffer) and the positions before its window.
pub struct CausalPart<'a, Q, K> {
    pub q: &'a Q,
    pub k: &'a [&'a K],
    pub v: &'a [&'a K],
    pub offset: usize,
}

/// One session's share of [`Backend::attention_causal_rows`]: its `t`
/// query rows (consecutive in the call's queries), its cache's keys and
/// values per kv head and the positions before its window.
pub struct CausalRows<'a, K> {
    pub t: usize,
    pub k: &'a [&'a K],
    pub v: &'a [&'a K],
    pub offset: usize,
}

/// One target of [`Backend::append_head_rows`]: rows `first .. first +
/// rows` of `src` (`[_, dsts.len() · width]`), column block h appended to
/// `dsts[h]`.
pub struct HeadRows<'a, B> {
    pub src: &'a B,
    pub first: usize,
    pub rows: usize,
    pub dsts: Vec<&'a mut B>,
}

/// The QSA block selection's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerShape {
    /// Indexer query heads.
    pub heads: usize,
    /// Indexer head dim.
    pub dim: usize,
    /// Tokens per block.
    pub ratio: usize,
    /// Complete blocks kept per query.
    pub block_topk: usize,
}

/// How a router turns logits into expert scores (softmax routing has its
/// own op, [`Backend::route_softmax_topk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// `sqrt(softplus(x))` (DeepSeek-V4).
    SqrtSoftplus,
    /// `sigmoid(x)` (GLM-5).
    Sigmoid,
}

/// A scored router's selection and weighting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterSpec {
    pub scoring: Scoring,
    pub experts: usize,
    pub k: usize,
    /// Group-limited selection: `(n_group, topk_group)`; a group's score is
    /// the sum of its two best choices, experts of other groups are masked
    /// to −∞ before the top-k.
    pub groups: Option<(usize, usize)>,
    /// Weights `s / (Σ s + 1e-20)` over the chosen experts (else `s`).
    pub renormalise: bool,
    /// `routed_scaling_factor`.
    pub scale: f32,
}

/// A backend without [`split`]'s ops: says which and what is missing.
fn no_expert_parallel(id: BackendId, what: &str) -> crate::error::EngineError {
    crate::error::EngineError::Unsupported(format!(
        "the {id} backend {what} (expert parallel runs on the CPU and CUDA backends)"
    ))
}

/// The shape [`Backend::routing_upload`] takes on every backend: one weight
/// per expert id, whole rows of `k ≥ 1` slots.
pub(crate) fn check_routing_upload(
    experts: &[usize],
    weights: &[f32],
    k: usize,
) -> crate::error::Result<()> {
    if experts.len() != weights.len() || k == 0 || !experts.len().is_multiple_of(k) {
        return Err(crate::error::EngineError::State(format!(
            "routing_upload: {} experts, {} weights, top {k}",
            experts.len(),
            weights.len()
        )));
    }
    Ok(())
}

/// The op inventory (see the module docs). `rows` is always the number of
/// tokens in the call; every op is row-independent.
pub trait Backend: Clone + Send + Sync + Debug + 'static {
    /// f32 values on the device: activations `[rows, width]` row-major,
    /// caches, small weights.
    type Buf: Clone + Send + Sync + Debug;
    /// A weight matrix `[out, in]` (f32 or block-quantized).
    type Matrix: Send + Sync + Debug;
    /// A stack of expert matrices `[E, out, in]` (f32 or block-quantized).
    type Experts: Send + Sync + Debug;
    /// An embedding table `[V, width]` (f32 or block-quantized), read by rows.
    type Table: Send + Sync + Debug;
    /// Per-token kept key indices of a sparse selection.
    type Selection: Clone + Send + Sync + Debug;
    /// Per-token routed experts and weights, `[rows, k]` each.
    type Routing: Clone + Send + Sync + Debug;
    /// What changes from one decode / verify step to the next (the cache
    /// length before the step and its token ids), as the step ops read it:
    /// on the host ([`HostStep`]), or from a small device buffer written
    /// once per step, so that a step captured as a CUDA graph can be
    /// replayed.
    type Step: Send + Sync + Debug;
    /// Rows of IEEE binary16 values on the device: an f16 KV cache
    /// ([`crate::state::kv_cache::KvType::F16`]). Backends without one
    /// use an uninhabited type and refuse [`Backend::half_empty`].
    type Half: Clone + Send + Sync + Debug;

    /// The backend and kernel set (part of a checkpoint's identity).
    fn id(&self) -> BackendId;

    // ---- memory ----

    fn upload(&self, host: &[f32]) -> Result<Self::Buf>;
    /// The one read-back: logits rows, and state export.
    fn download(&self, x: &Self::Buf) -> Result<Vec<f32>>;
    /// `x` read back as consecutive parts of `lens[i]` values (a batch's
    /// logits, one part a session), which must add up to its length. The
    /// default splits one [`Backend::download`]; a backend may fill the
    /// parts without the whole on the host first.
    fn download_parts(&self, x: &Self::Buf, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
        let all = self.download(x)?;
        composed::split_parts(&all, lens)
    }
    fn zeros(&self, n: usize) -> Result<Self::Buf>;
    fn len(&self, x: &Self::Buf) -> usize;
    /// Rows `first .. first + count` of `x: [_, width]`, copied.
    fn rows(&self, x: &Self::Buf, width: usize, first: usize, count: usize) -> Result<Self::Buf>;
    /// Runs of rows of `x: [_, width]` (`(first, count)` each), copied one
    /// after another into one buffer: a batch's wanted rows, or its
    /// sessions' rotary rows. The default copies run by run; a device may
    /// copy them all in one launch.
    fn row_runs(&self, x: &Self::Buf, width: usize, runs: &[(usize, usize)]) -> Result<Self::Buf> {
        let mut out: Option<Self::Buf> = None;
        for &(first, count) in runs {
            let rows = self.rows(x, width, first, count)?;
            out = Some(match out {
                None => rows,
                Some(mut all) => {
                    self.append(&mut all, &rows)?;
                    all
                }
            });
        }
        out.ok_or_else(|| EngineError::State("row_runs: no runs".into()))
    }
    /// `x: [Σ counts, width]` cut into consecutive parts of `counts[i]`
    /// rows, each its own buffer (a batch's rows, session by session). The
    /// default copies part by part; a device may copy them all in one
    /// launch.
    fn split_rows(&self, x: &Self::Buf, width: usize, counts: &[usize]) -> Result<Vec<Self::Buf>> {
        let mut at = 0;
        counts
            .iter()
            .map(|&t| {
                let r = self.rows(x, width, at, t);
                at += t;
                r
            })
            .collect()
    }
    /// The rows of `parts` (each `[_, width]`) one after another in one
    /// buffer (a batch's per-session rows back together). The default
    /// appends part by part to the first; a device may copy them all in
    /// one launch.
    fn concat_rows(&self, parts: Vec<Self::Buf>, width: usize) -> Result<Self::Buf> {
        let _ = width;
        let mut it = parts.into_iter();
        let mut all = it
            .next()
            .ok_or_else(|| EngineError::State("concat_rows: no parts".into()))?;
        for p in it {
            self.append(&mut all, &p)?;
        }
        Ok(all)
    }
    /// `dst ← [dst | src]` (a cache growing by rows).
    fn append(&self, dst: &mut Self::Buf, src: &Self::Buf) -> Result<()>;
    /// Keep the first `n` values.
    fn truncate(&self, dst: &mut Self::Buf, n: usize) -> Result<()>;
    /// Row-wise concatenation: `parts[i]: [rows, w_i]` → `[rows, Σ w_i]`.
    fn concat_cols(&self, parts: &[(&Self::Buf, usize)], rows: usize) -> Result<Self::Buf>;
    /// Split every row of `x: [rows, repeats·Σ parts]`, viewed as `repeats`
    /// consecutive groups of `parts`, into one `[rows, repeats·parts[i]]`
    /// buffer per part (e.g. per-head `[q_h | gate_h]` with `repeats = H`).
    fn split_cols(
        &self,
        x: &Self::Buf,
        rows: usize,
        parts: &[usize],
        repeats: usize,
    ) -> Result<Vec<Self::Buf>>;

    // ---- weights ----

    /// Place a weight matrix `[out, in]` on the device.
    fn matrix(&self, w: HostWeight, out: usize, inp: usize) -> Result<Self::Matrix>;
    /// A stack of `E` matrices `[E, out, in]`: f32, or block-quantized
    /// where the backend keeps a format quantized (the dequantized values
    /// are the same everywhere).
    fn experts(&self, w: HostWeight, e: usize, out: usize, inp: usize) -> Result<Self::Experts>;
    /// Place an embedding table `[V, width]` on the device.
    fn table(&self, w: HostWeight, rows: usize, width: usize) -> Result<Self::Table>;
    /// Embedding lookup: rows `ids` of `table`, dequantized to f32 exactly
    /// (ids are checked by the caller).
    fn gather_rows(&self, table: &Self::Table, ids: &[u32]) -> Result<Self::Buf>;

    // ---- linear algebra ----

    /// `y[r, j] = Σ_i x[r, i]·w[j, i]`, `x: [rows, in]` → `[rows, out]`.
    /// f32 weights: eight FMA lanes over `⌊in/8⌋` blocks in order, lanes
    /// summed `((0+4)+(2+6))+((1+5)+(3+7))`, then the tail by FMA in order.
    /// Block formats: the block kernel's documented order
    /// ([`cpu::block_matmul`]).
    fn matmul(&self, x: &Self::Buf, rows: usize, w: &Self::Matrix) -> Result<Self::Buf>;
    /// `unary_chain(matmul(x, w), chain)` (an empty chain: the product):
    /// a projection and its gate. The default runs the two ops; a device
    /// may apply the chain as it stores the product, with the same bits.
    fn matmul_unary(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Matrix,
        chain: &[Unary],
    ) -> Result<Self::Buf> {
        let y = self.matmul(x, rows, w)?;
        if chain.is_empty() {
            Ok(y)
        } else {
            self.unary_chain(&y, chain)
        }
    }
    /// Several products of the same input `x: [rows, in]` (every matrix
    /// `[out_i, in]`), each followed by its [`Epilogue`]: the values of
    /// [`Backend::matmul_unary`] / [`Backend::matmul`] then
    /// [`Backend::swiglu`] part by part (the default runs exactly those);
    /// a device may run them as one launch, with the same bits.
    fn matmul_many(
        &self,
        x: &Self::Buf,
        rows: usize,
        parts: &[(&Self::Matrix, Epilogue<'_>)],
    ) -> Result<Vec<Self::Buf>> {
        composed::matmul_many(self, x, rows, parts)
    }
    /// A block-diagonal product: `x: [rows, g·k]`, group `i` its columns
    /// `i·k ..`, times `parts[i]` (`[n, k]` each) into columns `i·n ..` of
    /// `[rows, g·n]` (DeepSeek-V4's grouped output projection). Each group
    /// is its own [`Backend::matmul`] row by row, so the bits are those of
    /// splitting, multiplying and joining, which the default does; a
    /// device may run the groups in one launch.
    fn matmul_grouped(
        &self,
        x: &Self::Buf,
        rows: usize,
        parts: &[&Self::Matrix],
    ) -> Result<Self::Buf> {
        composed::matmul_grouped(self, x, rows, parts)
    }
    /// Routed SwiGLU experts: `out[t] = Σ_k w[t,k]·down_e(act(g, u))`,
    /// `[g | u] = gate_up_e·x_t`, `e = routing[t,k]`, `act = silu(g)·u`, or
    /// with a `limit` L `silu(min(g, L))·clamp(u, −L, L)` (DeepSeek, GLM);
    /// each projection is a [`Backend::matmul`] row, the `k` slots summed in
    /// slot order from 0.
    fn experts_swiglu(
        &self,
        x: &Self::Buf,
        rows: usize,
        routing: &Self::Routing,
        gate_up: &Self::Experts,
        down: &Self::Experts,
        limit: Option<f32>,
    ) -> Result<Self::Buf>;
    /// `add_gated_rows(experts_swiglu(x, …), shared, gate, H)`: the routed
    /// experts plus a shared expert's output `[rows, H]` gated per row by
    /// `sigmoid(gate)` (`gate` `[rows]`; Qwen's MoE). The default runs the
    /// two ops; a device may add the gated term as it sums the slots, with
    /// the same bits.
    #[allow(clippy::too_many_arguments)]
    fn experts_swiglu_gated(
        &self,
        x: &Self::Buf,
        rows: usize,
        routing: &Self::Routing,
        gate_up: &Self::Experts,
        down: &Self::Experts,
        limit: Option<f32>,
        shared: &Self::Buf,
        gate: &Self::Buf,
    ) -> Result<Self::Buf> {
        let out = self.experts_swiglu(x, rows, routing, gate_up, down, limit)?;
        let width = self.len(&out) / rows.max(1);
        self.add_gated_rows(&out, shared, gate, width)
    }

    /// Expert parallel ([`split`]): the unweighted outputs of the slots
    /// whose expert lies in `first..first + E` (`E` the stacks' experts,
    /// global ids), `down_e(act(gate_up_e·x_t))` as in
    /// [`Backend::experts_swiglu`], `[rows·k, H]` with every other slot
    /// zero. `sum_slots` over the slots of all parts equals
    /// `experts_swiglu` bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn experts_slots(
        &self,
        x: &Self::Buf,
        rows: usize,
        routing: &Self::Routing,
        gate_up: &Self::Experts,
        down: &Self::Experts,
        limit: Option<f32>,
        first: usize,
    ) -> Result<Self::Buf> {
        let _ = (x, rows, routing, gate_up, down, limit, first);
        Err(no_expert_parallel(
            self.id(),
            "has no expert-parallel slots yet",
        ))
    }
    /// `out[t] = Σ_k w[t,k]·ys[t·k + k']` in slot order from 0 (`o = 0;
    /// o += w·y`, no fused multiply-add): the sum [`Backend::experts_swiglu`]
    /// ends with, over slot outputs `ys: [rows·k, width]`.
    fn sum_slots(
        &self,
        ys: &Self::Buf,
        rows: usize,
        routing: &Self::Routing,
        width: usize,
    ) -> Result<Self::Buf> {
        let _ = (ys, rows, routing, width);
        Err(no_expert_parallel(
            self.id(),
            "has no expert-parallel sums yet",
        ))
    }
    /// A routing from the host (the inverse of
    /// [`Backend::routing_to_host`]), for a device that did not route.
    fn routing_upload(
        &self,
        experts: &[usize],
        weights: &[f32],
        k: usize,
    ) -> Result<Self::Routing> {
        let _ = (experts, weights, k);
        Err(no_expert_parallel(
            self.id(),
            "cannot take a routing from the host yet",
        ))
    }

    // ---- routing ----

    /// Softmax over `E` logits per row (max-subtracted, sum in expert order),
    /// the `k` most probable experts (ties: lower index first), weights
    /// `p_e / Σ_top p` when `renormalise`, else `p_e`.
    fn route_softmax_topk(
        &self,
        logits: &Self::Buf,
        rows: usize,
        experts: usize,
        k: usize,
        renormalise: bool,
    ) -> Result<Self::Routing>;
    /// Scored routing: scores `s` per [`RouterSpec::scoring`]; selection by
    /// `s + bias` (the correction bias selects only) with optional group
    /// limit, the top `k` (ties to the lower index) — or the experts
    /// `fixed[r·k..]` given by the token id (hash routing); weights `s` of the
    /// chosen experts, renormalised in slot order and scaled.
    fn route_scored(
        &self,
        logits: &Self::Buf,
        rows: usize,
        bias: Option<&Self::Buf>,
        fixed: Option<&[u32]>,
        spec: &RouterSpec,
    ) -> Result<Self::Routing>;
    /// The routing on the host (`[rows·k]` experts and weights), for traces.
    fn routing_to_host(&self, r: &Self::Routing) -> Result<(Vec<usize>, Vec<f32>)>;

    // ---- norms ----

    /// Llama RMSNorm per row of `width`: `x / sqrt(Σx²/n + eps) · w`, the
    /// sum of squares in order.
    fn rms_norm(&self, x: &Self::Buf, width: usize, w: &Self::Buf, eps: f32) -> Result<Self::Buf>;
    /// Zero-centred grouped RMSNorm: statistics per `group`-slice of each
    /// `width` row, `(x · 1/sqrt(mean(x²)+eps)) · scale` with `scale = 1+w`;
    /// the sum of squares is eight lanes × four accumulators over blocks of
    /// 32, then the tail in order (the reference is candle's `sum`).
    fn rms_norm_grouped(
        &self,
        x: &Self::Buf,
        width: usize,
        group: usize,
        scale: &Self::Buf,
        eps: f64,
    ) -> Result<Self::Buf>;
    /// In place, per `dim`-slice (one head): `x · 1/sqrt(Σx²/dim + eps) ·
    /// scale`, the sum in order.
    fn rms_norm_heads(
        &self,
        x: &mut Self::Buf,
        dim: usize,
        scale: &Self::Buf,
        eps: f32,
    ) -> Result<()>;
    /// In place, per `dim`-slice: `x · (1/sqrt(Σx² + 1e-6) · scale)`.
    fn l2_norm_heads(&self, x: &mut Self::Buf, dim: usize, scale: f32) -> Result<()>;
    /// `w · (o · 1/sqrt(Σo²/dim + eps)) · act(z)` per `dim`-slice.
    fn gated_rms_norm(
        &self,
        o: &Self::Buf,
        z: &Self::Buf,
        w: &Self::Buf,
        eps: f32,
        act: GateAct,
    ) -> Result<Self::Buf>;

    /// LayerNorm with a bias per row of `width` (GLM-5's indexer keys):
    /// `mean = Σx/n`, `var = Σ(x − mean)²/n` (biased), both summed in
    /// order, then `(x − mean)·(1/sqrt(var + eps))·w + b`.
    fn layer_norm(
        &self,
        x: &Self::Buf,
        width: usize,
        w: &Self::Buf,
        b: &Self::Buf,
        eps: f32,
    ) -> Result<Self::Buf>;

    // ---- position ----

    /// Rotate the first `2·half` dims of every `head_dim` head of `x:
    /// [rows, heads·head_dim]`, row `r` by `cos/sin[r·half ..]` (tables
    /// `[rows, half]` made by [`crate::layers::rope`]): `(a, b) ← (a·cos −
    /// b·sin, b·cos + a·sin)`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        head_dim: usize,
        cos: &Self::Buf,
        sin: &Self::Buf,
        half: usize,
        layout: RopeLayout,
    ) -> Result<()>;

    // ---- recurrent ----

    /// Depthwise (dilated) causal conv + SiLU over `u: [rows, C]` with a
    /// `[(K−1)·dilation, C]` window (oldest first; slid to the last rows),
    /// `w: [C, K]`: `a = Σ_k w[c,k]·u[t − (K−1−k)·dilation, c]` summed over
    /// `k` in order from 0, then `a·σ(a)`.
    fn causal_conv_silu(
        &self,
        u: &Self::Buf,
        window: &mut Self::Buf,
        w: &Self::Buf,
        channels: usize,
        kernel: usize,
        dilation: usize,
    ) -> Result<Self::Buf>;
    /// A gated delta net's scan inputs from its raw projections `u: [rows,
    /// 2·Hk·dk + Hv·dv]` and `a: [rows, Hv]` (Qwen's GDN), as the ops one
    /// by one: `c = causal_conv_silu(u, window, w, channels, kernel, 1)`,
    /// `[q, k, v] = split_cols(c)`, `l2_norm_heads(q, dk, q_scale)`,
    /// `l2_norm_heads(k, dk, 1)`, `g = softplus_decay(a, neg_a, dt_bias)`;
    /// returns `[q, k, v, g]`. The default runs those ops; a device may run
    /// a decode step's in one launch, with the same bits.
    #[allow(clippy::too_many_arguments)]
    fn delta_inputs(
        &self,
        d: ScanDims,
        u: &Self::Buf,
        window: &mut Self::Buf,
        w: &Self::Buf,
        kernel: usize,
        q_scale: f32,
        a: &Self::Buf,
        neg_a: &Self::Buf,
        dt_bias: &Self::Buf,
    ) -> Result<[Self::Buf; 4]> {
        composed::delta_inputs(self, d, u, window, w, kernel, q_scale, a, neg_a, dt_bias)
    }
    /// The gated delta rule, token by token (never a chunked form): per value
    /// head `S ← diag(exp(g))·S; S ← S + k ⊗ β(v − kᵀS); o = qᵀS`, `q,k:
    /// [rows, Hk, dk]`, `v: [rows, Hv, dv]`, `β: [rows, Hv]`, `g: [rows,
    /// Hv]` (per-head decay, GDN) or `[rows, Hv, dk]` (per-channel decay,
    /// KDA), `S: [Hv, dk, dv]` updated; returns `o: [rows, Hv, dv]`. Sums
    /// over `dk` and the output's `Σ_a S·q` run in channel order.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule_scan(
        &self,
        d: ScanDims,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        g: &Self::Buf,
        beta: &Self::Buf,
        s: &mut Self::Buf,
    ) -> Result<Self::Buf>;
    /// [`Backend::delta_rule_scan`] for several sessions at once
    /// (continuous batching): each part's own inputs and state; returns
    /// every part's `o` rows one after another. The default scans part by
    /// part; a device may scan them all in one launch, with each part's
    /// bits.
    fn delta_rule_scan_parts(
        &self,
        d: ScanDims,
        parts: &mut [ScanPart<'_, Self::Buf>],
    ) -> Result<Self::Buf> {
        composed::delta_rule_scan_parts(self, d, parts)
    }

    /// Kimi delta attention's per-channel log-decay: `f: [rows, H·dim]`,
    /// `a: [H]` (`exp(A_log)`), `dt_bias: [H·dim]`; `x = f + dt_bias`, then
    /// `lb·σ(a_h·x)` with a lower bound `lb`, else `−a_h·softplus(x)`
    /// (`ln(1 + eˣ)`, linear above 20). Per element.
    fn kda_gate(
        &self,
        f: &Self::Buf,
        a: &Self::Buf,
        dt_bias: &Self::Buf,
        dim: usize,
        lower_bound: Option<f32>,
    ) -> Result<Self::Buf>;

    // ---- attention ----

    /// Causal attention over a cache: `q: [rows, Hq·d]` (already scaled),
    /// `k[h], v[h]: [offset + rows, d]` per kv head (this window's rows
    /// written first); query `i` sees keys `0 ..= offset + i`; query head
    /// `h` reads kv head `h / (Hq/Hkv)`. Per (query, head): dots in key
    /// order (eight FMA lanes, lanes summed `((0+4)+(1+5))+((2+6)+(3+7))`,
    /// tail FMAs), max, `exp(s − max)` summed in key order, `Σ p·v` in key
    /// order, times `1/Σ`.
    fn attention_causal(
        &self,
        q: &Self::Buf,
        k: &[&Self::Buf],
        v: &[&Self::Buf],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<Self::Buf>;
    /// Several sessions' [`Backend::attention_causal`] (continuous
    /// batching): each part's rows with the bits of the op alone, the
    /// parts' outputs one after another. By default one call per part; a
    /// backend may run them together.
    fn attention_causal_batch(
        &self,
        parts: &[CausalPart<'_, Self::Buf, Self::Buf>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<Self::Buf> {
        composed::part_by_part(self, parts, |p| {
            self.attention_causal(p.q, p.k, p.v, p.offset, q_heads, kv)
        })
    }
    /// [`Backend::attention_causal_batch`] with the parts' queries as
    /// consecutive rows of one `q` (`[Σ t, Hq·d]`), as continuous batching
    /// projects them. By default each part's rows are copied out first; a
    /// backend may read them in place (CUDA: one launch for every part).
    fn attention_causal_rows(
        &self,
        q: &Self::Buf,
        parts: &[CausalRows<'_, Self::Buf>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<Self::Buf> {
        let qd = q_heads * kv.dim;
        let mut qs = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in parts {
            qs.push(self.rows(q, qd, at, p.t)?);
            at += p.t;
        }
        let parts: Vec<CausalPart<'_, Self::Buf, Self::Buf>> = parts
            .iter()
            .zip(&qs)
            .map(|(p, q)| CausalPart {
                q,
                k: p.k,
                v: p.v,
                offset: p.offset,
            })
            .collect();
        self.attention_causal_batch(&parts, q_heads, kv)
    }
    /// Append each target's rows of its source, column block by column
    /// block (`width` values each), to its buffers (continuous batching's
    /// cache writes: every session's keys of a layer). By default a row
    /// copy, a column split and an append per block; a backend may do all
    /// in one pass (CUDA: one launch for every target).
    fn append_head_rows(
        &self,
        width: usize,
        targets: &mut [HeadRows<'_, Self::Buf>],
    ) -> Result<()> {
        for t in targets {
            let heads = t.dsts.len();
            let rows = self.rows(t.src, heads * width, t.first, t.rows)?;
            let blocks = self.split_cols(&rows, t.rows, &vec![width; heads], 1)?;
            for (block, dst) in blocks.iter().zip(t.dsts.iter_mut()) {
                self.append(dst, block)?;
            }
        }
        Ok(())
    }
    /// Mean of each complete block of `ratio` rows of `raw: [P, dim]`, for
    /// blocks `first .. last`: `(0 + r_0 + … + r_{ratio−1}) / ratio`.
    fn block_keys(
        &self,
        raw: &Self::Buf,
        dim: usize,
        ratio: usize,
        first: usize,
        last: usize,
    ) -> Result<Self::Buf>;
    /// QSA selection for `rows` queries `q: [rows, heads·dim]` at token
    /// indices `base ..`: block `j` scores `Σ_h relu(q_h·kb_j) / √dim`
    /// (sequential dots, heads summed in order); the `block_topk` best blocks
    /// (ties: lower index) and the incomplete tail, ascending.
    fn indexer_select(
        &self,
        q: &Self::Buf,
        blocks: &Self::Buf,
        base: usize,
        shape: IndexerShape,
    ) -> Result<Self::Selection>;
    /// The selection on the host, for traces.
    fn selection_to_host(&self, s: &Self::Selection) -> Result<Vec<Vec<u32>>>;
    /// A selection the caller lists (row `r` keeps `rows[r]`, each index
    /// below `bound`): attention patterns fixed by the input's shape, such
    /// as a vision tower's block-diagonal per-image attention, run through
    /// [`Backend::attention_gathered`].
    fn selection_from_host(&self, rows: &[Vec<u32>], bound: usize) -> Result<Self::Selection>;
    /// Pools of `pool` tokens to token indices (GLM-5's DSA): row `r` (the
    /// query at token `t = base + r`) lists every token of each of its
    /// selected pools `p` (`p·pool .. (p+1)·pool`, each pool complete and
    /// visible: `(p+1)·pool ≤ t + 1`), then, with `tail`, the incomplete
    /// tail `⌊(t+1)/pool⌋·pool ..= t`. Ascending when the pools are.
    fn expand_pools(
        &self,
        pools: &Self::Selection,
        base: usize,
        pool: usize,
        tail: bool,
    ) -> Result<Self::Selection>;
    /// Softmax attention of each query over its selected keys only (`q:
    /// [rows, Hq·d]` unscaled, `k, v: [P, Hkv·d]`): sequential dots times
    /// `1/√d`, max, `exp(s − max)` summed in key order, `o += (p/Σ)·v` in key
    /// order. `sinks` (`[Hq]` logits) join the max and the sum (after the
    /// keys) and contribute no value.
    #[allow(clippy::too_many_arguments)]
    fn attention_gathered(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        keep: &Self::Selection,
        q_heads: usize,
        kv: Heads,
        sinks: Option<&Self::Buf>,
    ) -> Result<Self::Buf>;

    /// Shared-K=V attention over a sliding window plus compressed entries
    /// (DeepSeek-V4). `q: [rows, heads·dim]` unscaled, query `i` at token
    /// `query_first + i`; `window: [P, dim]` K=V rows of tokens
    /// `window_first ..`; the query at `t` sees tokens `max(t + 1 − span,
    /// window_first) ..= t`, then the entries of `entries: [E, dim]` that
    /// `keep` allows, ascending. Per (query, head): sequential dots times
    /// `1/√dim`, max (with the head's `sinks` logit), `exp(s − max)` summed
    /// in key order and then the sink's term, `o = Σ (p/Σ)·kv` in key order.
    #[allow(clippy::too_many_arguments)]
    fn attention_window(
        &self,
        q: &Self::Buf,
        heads: usize,
        dim: usize,
        query_first: usize,
        window: &Self::Buf,
        window_first: usize,
        span: usize,
        entries: &Self::Buf,
        keep: EntryKeep<'_, Self::Selection>,
        sinks: &Self::Buf,
    ) -> Result<Self::Buf>;

    // ---- compression ----

    /// Gated pooling of groups of `slots` consecutive rows of `kv, gate:
    /// [n·slots, dim]` → `[n, dim]`: per channel `p = softmax_j(gate)` (max
    /// subtracted, `exp` summed in `j` order, `p_j = e_j / Σ`), then `Σ_j
    /// kv_j·p_j` in `j` order from 0. A gate of −∞ is an empty slot.
    fn softmax_pool(
        &self,
        kv: &Self::Buf,
        gate: &Self::Buf,
        slots: usize,
        dim: usize,
    ) -> Result<Self::Buf>;
    /// Lightning-indexer scores `[rows, E]`: `s[r, e] = Σ_h (w[r, h]·w_scale)
    /// ·(relu(q[r, h]·keys[e])·scale)`, `q: [rows, heads·dim]`, `weights:
    /// [rows, heads]`, `keys: [E, dim]`; sequential dots, heads summed in
    /// order from 0.
    #[allow(clippy::too_many_arguments)]
    fn index_scores(
        &self,
        q: &Self::Buf,
        weights: &Self::Buf,
        keys: &Self::Buf,
        rows: usize,
        heads: usize,
        dim: usize,
        scale: f32,
        w_scale: f32,
    ) -> Result<Self::Buf>;
    /// Per row `r` of `scores: [rows, width]`: the `min(k, limits[r])`
    /// best columns among `0 .. limits[r]` (ties: the lower index),
    /// ascending.
    fn select_topk(
        &self,
        scores: &Self::Buf,
        rows: usize,
        width: usize,
        limits: &[usize],
        k: usize,
    ) -> Result<Self::Selection>;

    // ---- element-wise ----

    fn add(&self, a: &Self::Buf, b: &Self::Buf) -> Result<Self::Buf>;
    /// `x[r, j] + b[j]`, `x: [rows, width]`, `b: [width]` (a linear
    /// layer's bias).
    fn add_bias(&self, x: &Self::Buf, b: &Self::Buf, width: usize) -> Result<Self::Buf>;
    /// GELU per element in f32 ([`GeluForm`]).
    fn gelu(&self, x: &Self::Buf, form: GeluForm) -> Result<Self::Buf>;
    fn mul(&self, a: &Self::Buf, b: &Self::Buf) -> Result<Self::Buf>;
    /// `x·mul + add` (f32).
    fn affine(&self, x: &Self::Buf, mul: f32, add: f32) -> Result<Self::Buf>;
    /// `x / (1 + exp(−x))`.
    fn silu(&self, x: &Self::Buf) -> Result<Self::Buf>;
    /// `1 / (exp(−x) + 1)`.
    fn sigmoid(&self, x: &Self::Buf) -> Result<Self::Buf>;
    /// The ops of `chain` (at most [`UNARY_CHAIN_MAX`]) applied in turn:
    /// the bits of calling them one after another, which is what this
    /// default does. A device overrides it with one pass over the data
    /// (on CUDA one launch instead of one per step: the hyper-connection
    /// gates are chains of two and three).
    fn unary_chain(&self, x: &Self::Buf, chain: &[Unary]) -> Result<Self::Buf> {
        let step = |v: &Self::Buf, u: &Unary| match *u {
            Unary::Affine(m, a) => self.affine(v, m, a),
            Unary::Silu => self.silu(v),
            Unary::Sigmoid => self.sigmoid(v),
        };
        match chain {
            [first, rest @ ..] if chain.len() <= UNARY_CHAIN_MAX => {
                let mut y = step(x, first)?;
                for u in rest {
                    y = step(&y, u)?;
                }
                Ok(y)
            }
            _ => Err(crate::error::EngineError::State(format!(
                "a unary chain of {} steps (1 to {UNARY_CHAIN_MAX})",
                chain.len()
            ))),
        }
    }
    /// `gu: [rows, 2·I]` rows `[g | u]` → `silu(g)·u`, `[rows, I]`; with a
    /// `limit` L, `silu(min(g, L))·clamp(u, −L, L)`.
    fn swiglu(&self, gu: &Self::Buf, inter: usize, limit: Option<f32>) -> Result<Self::Buf>;
    /// Per-head decay of the gated delta rule: `a: [rows, H]` →
    /// `neg_a[h]·softplus(a + dt_bias[h])` (softplus linear above 20).
    fn softplus_decay(
        &self,
        a: &Self::Buf,
        neg_a: &Self::Buf,
        dt_bias: &Self::Buf,
    ) -> Result<Self::Buf>;
    /// `x[r, j]·s[r]`, `x: [rows, width]`, `s: [rows]`.
    fn scale_rows(&self, x: &Self::Buf, s: &Self::Buf, width: usize) -> Result<Self::Buf>;
    /// `base + scale_rows(x, sigmoid(g), width)`: a residual plus rows of
    /// `x` scaled by their sigmoid gates (`g`: one per row; Qwen's gated
    /// shared expert). The default runs the three ops; a device may fuse
    /// them with the same bits.
    fn add_gated_rows(
        &self,
        base: &Self::Buf,
        x: &Self::Buf,
        g: &Self::Buf,
        width: usize,
    ) -> Result<Self::Buf> {
        self.add(base, &self.scale_rows(x, &self.sigmoid(g)?, width)?)
    }
    /// Qwen's PLE gate per stream: `g = ⟨key_s, qry_s⟩/√H` (sequential
    /// dot), `g ← sign(g)·sqrt(max(|g|, 1e-6))`, `out_s = σ(g)·val`; `key,
    /// qry: [rows, C·H]`, `val: [rows, H]`.
    fn ple_gate(
        &self,
        key: &Self::Buf,
        qry: &Self::Buf,
        val: &Self::Buf,
        c: usize,
        h: usize,
    ) -> Result<Self::Buf>;
    /// mHC mixing weights from `z: [rows, (2+N)·N]` (the `fn` projection of
    /// the normalised streams), `base: [(2+N)·N]`, `scale: [3]`: `pre =
    /// σ(z_pre·scale₀ + b) + eps`, `post = 2σ(z_post·scale₁ + b)`, `C =
    /// softmax_k(z_comb·scale₂ + b) + eps` (`comb[j,k] = z[2N + jN + k]`),
    /// then Sinkhorn: `C /= colsum + eps`, and `iters − 1` rounds of `C /=
    /// rowsum + eps; C /= colsum + eps`. Returns `[rows, (2+N)·N]` as `[pre |
    /// post | C]`. Sums run in index order.
    #[allow(clippy::too_many_arguments)]
    fn hc_sinkhorn(
        &self,
        z: &Self::Buf,
        base: &Self::Buf,
        scale: &Self::Buf,
        n: usize,
        iters: usize,
        eps: f32,
    ) -> Result<Self::Buf>;
    /// `matmul(rms_norm(x, width, ones, eps), rows, w)` with `ones` a
    /// weight of ones (`width` = `w`'s input size): the mHC `fn`
    /// projection of the normalised streams. The default runs the two ops
    /// (every reference set); the CUDA fast set runs one launch whose sums
    /// have an order of their own that depends on `width` alone, so a
    /// row's outputs have the same bits in every row count (rule 6 of
    /// `shared/specs/backend.md`).
    fn rms_matmul(
        &self,
        x: &Self::Buf,
        rows: usize,
        ones: &Self::Buf,
        w: &Self::Matrix,
        eps: f32,
    ) -> Result<Self::Buf> {
        composed::rms_matmul(self, x, rows, ones, w, eps)
    }
    /// mHC block input: `x = Σ_s pre[s]·X[s]` (streams in order from 0),
    /// `xs: [rows, N·D]`, `mix` from [`Backend::hc_sinkhorn`] → `[rows, D]`.
    fn hc_pre(&self, xs: &Self::Buf, mix: &Self::Buf, n: usize) -> Result<Self::Buf>;
    /// mHC write-back: `X'[k] = post[k]·y + Σ_j C[j,k]·X[j]` (the sum over
    /// `j` in order from 0, then added to `post[k]·y`).
    fn hc_post(
        &self,
        xs: &Self::Buf,
        y: &Self::Buf,
        mix: &Self::Buf,
        n: usize,
    ) -> Result<Self::Buf>;
    /// Hyper-connection streams: `x: [rows, H]` → `[rows, C·H]` (`C` copies).
    fn tile_streams(&self, x: &Self::Buf, c: usize, h: usize) -> Result<Self::Buf>;
    /// `x: [rows, C·H]` → `(0 + x_0 + … + x_{C−1})·(1/C)`, `[rows, H]`.
    fn mean_streams(&self, x: &Self::Buf, c: usize, h: usize) -> Result<Self::Buf>;
    /// `mean_streams(mul(sigmoid(gates), x))`, `gates` and `x` `[rows,
    /// C·H]`: the gated-residual mix. The default runs the three ops; a
    /// device may fuse them with the same bits (every intermediate is an
    /// f32 either way).
    fn gated_mean_streams(
        &self,
        gates: &Self::Buf,
        x: &Self::Buf,
        c: usize,
        h: usize,
    ) -> Result<Self::Buf> {
        self.mean_streams(&self.mul(&self.sigmoid(gates)?, x)?, c, h)
    }
    /// `gated_mean_streams(matmul(x, rows, w), streams, c, h)`: the
    /// gated-residual mix whose gates are a product (`w` `[C·H, in]`). The
    /// default runs the two ops; a device may compute each output column's
    /// `C` gates and their mean in one launch, with the same bits.
    fn matmul_gated_mean(
        &self,
        x: &Self::Buf,
        rows: usize,
        w: &Self::Matrix,
        streams: &Self::Buf,
        c: usize,
        h: usize,
    ) -> Result<Self::Buf> {
        self.gated_mean_streams(&self.matmul(x, rows, w)?, streams, c, h)
    }
    /// `X + concat_s(inj_s·y)`: `X [rows, C·H]`, `y [rows, H]`, `inj [rows, C]`.
    fn inject_streams(
        &self,
        xs: &Self::Buf,
        y: &Self::Buf,
        inj: &Self::Buf,
        c: usize,
    ) -> Result<Self::Buf>;
    /// `X' = inject_streams(xs, y, inj, c)`, then the next mix's
    /// `rms_norm_grouped(X', C·H, H, scale, eps)` (`scale: [C·H]`):
    /// returns `[X', n]`. The default runs the two ops; a device may run a
    /// step's in one launch, with the same bits.
    #[allow(clippy::too_many_arguments)]
    fn inject_streams_norm(
        &self,
        xs: &Self::Buf,
        y: &Self::Buf,
        inj: &Self::Buf,
        c: usize,
        scale: &Self::Buf,
        eps: f64,
    ) -> Result<[Self::Buf; 2]> {
        composed::inject_streams_norm(self, xs, y, inj, c, scale, eps)
    }

    // ---- steps (graph mode) ----

    /// Whether forwards of a few rows should run as steps
    /// ([`Backend::run_step`]): true where replaying a captured step pays
    /// (CUDA graphs); false on the CPU.
    fn step_graphs(&self) -> bool;
    /// The identity of `x`'s storage (its address and capacity): part of a
    /// step's key, because a replayed step writes the buffers it was
    /// captured with.
    fn storage_key(&self, x: &Self::Buf) -> [u64; 2];
    /// Run `body` as the step at cache length `pos` over the tokens `ids`
    /// and return its outputs. `key` names everything the body's launches
    /// depend on besides the [`Backend::Step`] (the model, the row count,
    /// the storage of every buffer it writes): equal keys must mean equal
    /// launches. The body takes its per-step values only from the step it
    /// is given. CPU: runs `body`. CUDA: replays the graph captured for
    /// `key`, capturing it on first use (eager, with one log line, where
    /// capture fails).
    fn run_step(
        &self,
        key: &[u64],
        pos: usize,
        ids: &[u32],
        body: &mut StepBody<'_, Self::Step, Self::Buf>,
    ) -> Result<Vec<Self::Buf>>;
    /// Run `body` over `inputs` and return its outputs, where the body is
    /// a pure function of the inputs' values: its ops depend on nothing
    /// else but their shapes and what `key` names (the model, the layer,
    /// the row count), read no host values and keep no state. Equal keys
    /// must mean equal ops. CPU: runs `body`. CUDA: captures the body's
    /// launches once per key and replays them, the inputs copied into the
    /// captured buffers first and the outputs copied out after (a decode
    /// step's launch count is its host's cost): the same kernels, so the
    /// same bits.
    fn run_pure(
        &self,
        key: &[u64],
        inputs: &[&Self::Buf],
        body: &mut PureBody<'_, Self::Buf>,
    ) -> Result<Vec<Self::Buf>> {
        let _ = key;
        body(inputs)
    }
    /// Set `dst`'s length to `n` values; values past the old length are
    /// unspecified until written. Where its storage is shared or too small
    /// it is replaced by its own with room for `grow_to` values, so steps
    /// that fit write the same storage.
    fn resize(&self, dst: &mut Self::Buf, n: usize, grow_to: usize) -> Result<()>;
    /// [`Backend::gather_rows`] of the step's token ids (checked by the
    /// caller).
    fn gather_rows_step(&self, table: &Self::Table, step: &Self::Step) -> Result<Self::Buf>;
    /// [`Backend::rows`] from the step's position: rows `pos .. pos + count`.
    fn rows_step(
        &self,
        x: &Self::Buf,
        width: usize,
        step: &Self::Step,
        count: usize,
    ) -> Result<Self::Buf>;
    /// Write `src: [n, width]` over rows `pos .. pos + n` of `dst` (already
    /// [`Backend::resize`]d to hold them).
    fn write_rows_step(
        &self,
        dst: &mut Self::Buf,
        src: &Self::Buf,
        width: usize,
        step: &Self::Step,
    ) -> Result<()>;
    /// [`Backend::attention_causal`] at `offset = pos`, bit for bit.
    fn attention_causal_step(
        &self,
        q: &Self::Buf,
        k: &[&Self::Buf],
        v: &[&Self::Buf],
        step: &Self::Step,
        q_heads: usize,
        kv: Heads,
    ) -> Result<Self::Buf>;

    // ---- f16 row caches ----

    /// An empty f16 buffer; an `Unsupported` error where the backend has
    /// no f16 cache.
    fn half_empty(&self) -> Result<Self::Half>;
    /// The number of f16 values held.
    fn half_len(&self, x: &Self::Half) -> usize;
    /// Append `src` rounded to f16: round to nearest, ties to even (as
    /// F16C's `vcvtps2ph` and `half::f16::from_f32`); beyond ±65504 an
    /// infinity, NaN stays NaN.
    fn half_append(&self, dst: &mut Self::Half, src: &Self::Buf) -> Result<()>;
    /// Keep the first `n` values.
    fn half_truncate(&self, dst: &mut Self::Half, n: usize) -> Result<()>;
    /// The values widened to f32 on the host (exact).
    fn half_download(&self, x: &Self::Half) -> Result<Vec<f32>>;
    /// [`Backend::attention_causal`] over f16 keys and values: each element
    /// widened to f32 (exact) as it is read, then the f32 op's sequence, so
    /// the result equals `attention_causal` over the widened rows, bit for
    /// bit.
    fn attention_causal_half(
        &self,
        q: &Self::Buf,
        k: &[&Self::Half],
        v: &[&Self::Half],
        offset: usize,
        q_heads: usize,
        kv: Heads,
    ) -> Result<Self::Buf>;
    /// [`Backend::attention_causal_batch`] over f16 caches.
    fn attention_causal_half_batch(
        &self,
        parts: &[CausalPart<'_, Self::Buf, Self::Half>],
        q_heads: usize,
        kv: Heads,
    ) -> Result<Self::Buf> {
        composed::part_by_part(self, parts, |p| {
            self.attention_causal_half(p.q, p.k, p.v, p.offset, q_heads, kv)
        })
    }
}
