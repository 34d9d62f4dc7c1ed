//! Llama weights bound to layers, and the forward pass.
//!
//! Shapes (batch is always 1 and dropped): tokens `[t]` → embeddings
//! `[t, hidden]` → `num_layers` × (pre-norm attention, pre-norm SwiGLU, both
//! residual) → final norm → head `[rows, vocab]` where `rows` is 1 for
//! [`LogitsRows::Last`] (the head is the largest matmul; a prefill chunk
//! needs only its last row) or `t` for [`LogitsRows::All`].

use std::path::Path;

use super::config::LlamaConfig;
use super::mtp::{
    LlamaMtpHistory, MTP_DEFAULT_DEPTH, MTP_HIDDEN, MTP_MAX_DEPTH, MtpHead, draft_stop_on,
};
use crate::backend::{Backend, CpuOps, HostWeight};
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::layers::attention::Attention;
use crate::layers::embedding::embed_tokens;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::mlp::SwiGlu;
use crate::layers::norms::RmsNorm;
use crate::layers::rope::{Rope, RopeRows, RopeScaling};
use crate::load::ModelFormat;
use crate::load::binder::Binder;
use crate::load::gguf::GgufFile;
use crate::load::safetensors::SafetensorsDir;
use crate::model::{
    BatchCall, BatchResult, DeviceRows, ForwardOutput, HiddenRows, LogitsRows, Model, ModelState,
    MtpCall, MtpContract, MtpStep, VerifyWindow,
};
use crate::state::kv_cache::{KvCache, KvType};

/// Tensors a Hugging Face llama checkpoint may carry that hold nothing we
/// need: old transformers versions saved the RoPE inverse frequencies, which
/// we recompute from the config.
pub const HF_IGNORED: &[&str] = &["rotary_emb.inv_freq"];

/// One decoder layer (the trunk's, and the MTP head's own).
#[derive(Debug)]
pub(super) struct Block<B: Backend> {
    pub(super) attn_norm: RmsNorm<B>,
    pub(super) attn: Attention<B>,
    pub(super) mlp_norm: RmsNorm<B>,
    pub(super) mlp: SwiGlu<B>,
}

impl<B: Backend> Block<B> {
    /// Bind a layer under `b`'s scope with the tensor names `n` gives.
    pub(super) fn load(
        b: &mut Binder<'_, B>,
        n: &Names,
        cfg: &LlamaConfig,
        mode: GgufWeights,
    ) -> Result<Self> {
        let (hidden, d, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
        let (qd, kvd, ffn) = (
            cfg.num_heads * d,
            cfg.num_kv_heads * d,
            cfg.intermediate_size,
        );
        let [q, k, v, o, gate, up, down] = n.proj;
        Ok(Block {
            attn_norm: RmsNorm::load(b, n.attn_norm, hidden, eps)?,
            attn: Attention {
                q: linear(b, q, qd, hidden, mode)?,
                k: linear(b, k, kvd, hidden, mode)?,
                v: linear(b, v, kvd, hidden, mode)?,
                o: linear(b, o, hidden, qd, mode)?,
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: d,
            },
            mlp_norm: RmsNorm::load(b, n.mlp_norm, hidden, eps)?,
            mlp: SwiGlu {
                gate: linear(b, gate, ffn, hidden, mode)?,
                up: linear(b, up, ffn, hidden, mode)?,
                down: linear(b, down, hidden, ffn, mode)?,
            },
        })
    }

    /// `x: [t, hidden]` → the residual stream after this layer; writes
    /// layer `layer` of `kv` (not advanced).
    pub(super) fn forward(
        &self,
        ops: &B,
        x: B::Buf,
        t: usize,
        rope: &RopeRows<B>,
        kv: &mut KvCache<B>,
        layer: usize,
    ) -> Result<B::Buf> {
        self.forward_at(ops, x, t, rope, kv, layer, None)
    }

    /// [`Block::forward`], as a step when `step` is given (see
    /// [`Attention::forward_at`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward_at(
        &self,
        ops: &B,
        x: B::Buf,
        t: usize,
        rope: &RopeRows<B>,
        kv: &mut KvCache<B>,
        layer: usize,
        step: Option<&B::Step>,
    ) -> Result<B::Buf> {
        let h = self.attn.forward_at(
            ops,
            &self.attn_norm.forward(ops, &x)?,
            t,
            rope,
            kv,
            layer,
            step,
        )?;
        let x = ops.add(&x, &h)?;
        let h = self.mlp.forward(ops, &self.mlp_norm.forward(ops, &x)?, t)?;
        ops.add(&x, &h)
    }
}

#[derive(Debug)]
pub struct LlamaModel<B: Backend = CpuOps> {
    pub(super) ops: B,
    pub(super) cfg: LlamaConfig,
    /// (A boxed path: `LoadedModel` holds this model by value, and the
    /// variant's size is kept near the others'.)
    source: Box<Path>,
    format: ModelFormat,
    /// `[vocab, hidden]`. A block-quantized GGUF table (Q8_0 in the default
    /// model) stays quantized and is dequantized row by row on lookup: the
    /// whole table in f32 would take 113 MB for SmolLM2 (more than the 98 MB
    /// model), for a saving of ~600 multiply-adds per token.
    pub(super) embed: B::Table,
    pub(super) blocks: Vec<Block<B>>,
    pub(super) norm: RmsNorm<B>,
    pub(super) head: Linear<B>,
    pub(super) rope: Rope<B>,
    /// The MTP head, when one is attached ([`LlamaModel::attach_mtp_head`]).
    /// (Boxed: `LoadedModel` holds models by value.)
    mtp: Option<Box<MtpHead<B>>>,
    /// This model's part of a step's key (unique per loaded model, so a
    /// graph captured with one model's weights never serves another).
    step_scope: u64,
    /// The element type of the states this model makes
    /// ([`LlamaModel::set_kv_type`]).
    kv_type: KvType,
}

/// Forwards of at most this many rows run as steps where the backend
/// replays them ([`Backend::step_graphs`]): a decode step and an MTP
/// verify window; longer ones are prefill chunks, run eagerly.
pub const STEP_MAX_ROWS: usize = 8;

static STEP_SCOPES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What a llama model remembers: the KV cache of every layer.
#[derive(Debug, Clone)]
pub struct LlamaState<B: Backend = CpuOps> {
    pub kv: KvCache<B>,
}

impl<B: Backend> LlamaState<B> {
    /// Like [`ModelState::snapshot`], reporting allocation failures.
    pub fn try_snapshot(&self) -> Result<Self> {
        Ok(self.clone())
    }

    /// Become an independent copy of `snap` (which stays usable).
    pub fn restore(&mut self, snap: &Self) -> Result<()> {
        *self = snap.try_snapshot()?;
        Ok(())
    }
}

impl<B: Backend> ModelState for LlamaState<B> {
    type Window = LlamaWindow;

    fn commit(&mut self, window: &LlamaWindow, accepted: usize) -> Result<()> {
        // Attention only: keeping a prefix of the window is a truncation.
        if self.kv.len() != window.start + window.rows || accepted > window.rows {
            return Err(EngineError::State(format!(
                "commit of {accepted} rows of a {}-row window at {} on a state of {} positions \
                 (the window must be the last forward)",
                window.rows,
                window.start,
                self.kv.len()
            )));
        }
        self.kv.truncate(window.start + accepted)
    }

    fn len(&self) -> usize {
        self.kv.len()
    }

    fn truncate_floor(&self) -> usize {
        0
    }

    fn snapshot(&self) -> Self {
        self.clone()
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        self.kv.truncate(n)
    }

    fn byte_size(&self) -> usize {
        self.kv.byte_size()
    }

    fn export(&self) -> Result<Vec<crate::state::table::NamedTensor>> {
        self.kv.export()
    }

    fn import(&mut self, tensors: Vec<crate::state::table::NamedTensor>) -> Result<()> {
        self.kv.import(tensors)
    }
}

/// How GGUF matrices are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufWeights {
    /// Keep block-quantized weights quantized (Q4_1 / Q8_0 run with f32
    /// activations; other block types through candle's kernels, which round
    /// activations to Q8 like llama.cpp). The fast path.
    #[default]
    Quantized,
    /// Dequantize every matrix to f32 once at load (4-8x the memory). The
    /// arithmetic is then the f32 reference's, which isolates quantized
    /// activation rounding when comparing against transformers.
    DequantizeF32,
}

/// A linear layer `{name}.weight` bound as `mode` says.
fn linear<B: Backend>(
    w: &mut Binder<'_, B>,
    name: &str,
    out: usize,
    inp: usize,
    mode: GgufWeights,
) -> Result<Linear<B>> {
    match mode {
        GgufWeights::Quantized => w.linear(name, out, inp),
        GgufWeights::DequantizeF32 => {
            let t = w.tensor(&format!("{name}.weight"), &[out, inp])?;
            w.linear_from(HostWeight::F32(t), out, inp)
        }
    }
}

/// Tensor names of the two layouts a llama checkpoint comes in.
pub(super) struct Names {
    embed: &'static str,
    head: &'static str,
    norm: &'static str,
    block: fn(usize) -> String,
    attn_norm: &'static str,
    mlp_norm: &'static str,
    /// q, k, v, o, gate, up, down.
    proj: [&'static str; 7],
}

pub(super) const GGUF_NAMES: Names = Names {
    embed: "token_embd.weight",
    head: "output",
    norm: "output_norm.weight",
    block: |i| format!("blk.{i}"),
    attn_norm: "attn_norm.weight",
    mlp_norm: "ffn_norm.weight",
    proj: [
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ],
};

const HF_NAMES: Names = Names {
    embed: "model.embed_tokens.weight",
    head: "lm_head",
    norm: "model.norm.weight",
    block: |i| format!("model.layers.{i}"),
    attn_norm: "input_layernorm.weight",
    mlp_norm: "post_attention_layernorm.weight",
    proj: [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    ],
};

impl LlamaModel<CpuOps> {
    /// Load from a `.gguf` file on the CPU, keeping quantized weights
    /// quantized.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::load_gguf(path, GgufWeights::Quantized, CpuOps)
    }

    /// Load from a `.gguf` file on the CPU, binding matrices as `mode` says.
    pub fn from_gguf_with(path: &Path, mode: GgufWeights) -> Result<Self> {
        Self::load_gguf(path, mode, CpuOps)
    }

    /// Load from a Hugging Face directory on the CPU.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        Self::load_hf(dir, CpuOps)
    }
}

impl<B: Backend> LlamaModel<B> {
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn format(&self) -> ModelFormat {
        self.format
    }

    pub fn ops(&self) -> &B {
        &self.ops
    }

    /// Load from a `.gguf` file onto `ops`, binding matrices as `mode` says.
    pub fn load_gguf(path: &Path, mode: GgufWeights, ops: B) -> Result<Self> {
        let mut g = GgufFile::open(path)?;
        let mut cfg = LlamaConfig::from_gguf(&g)?;
        if g.has_tensor("rope_freqs.weight") {
            let f = WeightSource::read_f32(&mut g, "rope_freqs.weight", &[cfg.head_dim / 2])?;
            cfg.rope_scaling = RopeScaling::FreqFactors(f.to_vec1::<f32>()?);
        }
        let model = Self::bind(cfg, &mut g, &GGUF_NAMES, mode, path, ModelFormat::Gguf, ops)?;
        g.finish()?;
        Ok(model)
    }

    /// Load from a Hugging Face directory (`config.json` + safetensors).
    pub fn load_hf(dir: &Path, ops: B) -> Result<Self> {
        let mut st = SafetensorsDir::open(dir)?;
        let cfg = LlamaConfig::from_hf(&st.config_path(), st.config())?;
        if cfg.tie_word_embeddings {
            // transformers re-ties after loading, discarding a stored copy.
            st.ignore("lm_head.weight");
        }
        let model = Self::bind(
            cfg,
            &mut st,
            &HF_NAMES,
            GgufWeights::Quantized,
            dir,
            ModelFormat::HfDir,
            ops,
        )?;
        st.finish(HF_IGNORED)?;
        Ok(model)
    }

    fn bind(
        cfg: LlamaConfig,
        src: &mut dyn WeightSource,
        n: &Names,
        mode: GgufWeights,
        source: &Path,
        format: ModelFormat,
        ops: B,
    ) -> Result<Self> {
        let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        let mut w = Binder::new(src, &ops);
        let embd = w.raw(n.embed, &[cfg.vocab_size, hidden])?;
        let embed = w.ops().table(embd.clone(), cfg.vocab_size, hidden)?;
        let head = if cfg.tie_word_embeddings {
            let embd = match (mode, embd) {
                (GgufWeights::DequantizeF32, w @ HostWeight::Quant(_)) => {
                    HostWeight::F32(w.to_f32()?)
                }
                (_, embd) => embd,
            };
            w.linear_from(embd, cfg.vocab_size, hidden)?
        } else {
            linear(&mut w, n.head, cfg.vocab_size, hidden, mode)?
        };
        let norm = RmsNorm::load(&mut w, n.norm, hidden, eps)?;
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            blocks.push(Block::load(&mut w.pp(&(n.block)(i)), n, &cfg, mode)?);
        }
        let rope = Rope::new(
            &ops,
            cfg.rope_theta,
            cfg.head_dim,
            &cfg.rope_scaling,
            cfg.rope_layout,
            cfg.context_length,
        )?;
        Ok(Self {
            ops,
            cfg,
            source: source.into(),
            format,
            embed,
            blocks,
            norm,
            head,
            rope,
            mtp: None,
            step_scope: STEP_SCOPES.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            kv_type: KvType::F32,
        })
    }

    /// The layers over `x: [t, hidden]`, appending to `kv` (not advanced).
    fn layers(&self, mut x: B::Buf, t: usize, kv: &mut KvCache<B>) -> Result<B::Buf> {
        let ops = &self.ops;
        let rope = self.rope.tables(ops, kv.len(), t)?;
        for (i, b) in self.blocks.iter().enumerate() {
            x = b.forward(ops, x, t, &rope, kv, i)?;
        }
        Ok(x)
    }

    /// Bind the MTP head stored in `path` (a head file made by
    /// `tools/mtp_head`; its checksum is the caller's to check) and enable
    /// speculative decoding. A file that does not fit this model is refused
    /// and the model stays as it was.
    /// Make states with a KV cache of `kv_type` from now on (f16 is
    /// refused where the backend has no f16 rows: CUDA). The MTP head's own
    /// one-layer cache stays f32.
    pub fn set_kv_type(&mut self, kv_type: KvType) -> Result<()> {
        KvCache::with_type(&self.ops, 1, 1, 1, 1, kv_type)?;
        self.kv_type = kv_type;
        Ok(())
    }

    /// The element type of this model's KV caches.
    pub fn kv_type(&self) -> KvType {
        self.kv_type
    }

    pub fn attach_mtp_head(&mut self, path: &Path) -> Result<()> {
        self.mtp = Some(Box::new(MtpHead::load(path, &self.cfg, &self.ops)?));
        Ok(())
    }

    /// Record the greedy draft depth measured fastest for the attached
    /// head on this machine (`decode::mtp_pieces`); attaching another head
    /// forgets it.
    pub fn set_measured_greedy_depth(&mut self, depth: usize) {
        if let Some(head) = self.mtp.as_deref_mut() {
            head.measured_greedy_depth = Some(depth);
        }
    }

    /// See [`LlamaModel::set_measured_greedy_depth`].
    pub fn measured_greedy_depth(&self) -> Option<usize> {
        self.mtp.as_deref().and_then(|h| h.measured_greedy_depth)
    }

    /// The attached MTP head, if any.
    pub fn mtp_head(&self) -> Option<&MtpHead<B>> {
        self.mtp.as_deref()
    }

    /// Embeddings, layers and logits of `tokens` after `state`; also the
    /// pre-norm hidden of every new row (what the MTP head reads).
    fn run(
        &self,
        tokens: &[u32],
        state: &mut LlamaState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, B::Buf)> {
        let ops = &self.ops;
        let t = tokens.len();
        if t == 0 {
            return Err(EngineError::State(
                "forward needs at least one token".into(),
            ));
        }
        let total = state.len() + t;
        if total > self.cfg.context_length {
            return Err(EngineError::ContextOverflow {
                needed: total,
                limit: self.cfg.context_length,
            });
        }
        if t <= STEP_MAX_ROWS && ops.step_graphs() {
            return self.run_step(tokens, state, rows);
        }
        let x = embed_tokens(ops, &self.embed, tokens, self.cfg.vocab_size)?;
        // A forward that fails half way leaves the cache as it was.
        let x = match self.layers(x, t, &mut state.kv) {
            Ok(x) => x,
            Err(e) => {
                state.kv.rollback()?;
                return Err(e);
            }
        };
        state.kv.advance(t)?;
        let (logits, n) = self.logits(&x, t, rows)?;
        let out = ForwardOutput {
            logits: ops.download(&logits)?,
            rows: n,
            vocab: self.cfg.vocab_size,
        };
        Ok((out, x))
    }

    /// The head over the last row or every row of `x: [t, hidden]`.
    fn logits(&self, x: &B::Buf, t: usize, rows: LogitsRows) -> Result<(B::Buf, usize)> {
        let ops = &self.ops;
        let (last, n) = match rows {
            LogitsRows::Last => (ops.rows(x, self.cfg.hidden_size, t - 1, 1)?, 1),
            LogitsRows::All => (x.clone(), t),
        };
        Ok((
            self.head.forward(ops, &self.norm.forward(ops, &last)?, n)?,
            n,
        ))
    }

    /// [`LlamaModel::run`] as one step ([`Backend::run_step`]): the same
    /// ops in the same order, with the token ids, the rope rows, the cache
    /// writes and the attention's key count taken from the step, so that
    /// a device can replay it (a CUDA graph); the bits are the eager
    /// forward's. Checks run on the host first: a refused forward leaves
    /// the state as it was. (Checked by the caller: `t ≥ 1`, the context.)
    pub fn run_step(
        &self,
        tokens: &[u32],
        state: &mut LlamaState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, B::Buf)> {
        let ops = &self.ops;
        let (t, pos, vocab) = (tokens.len(), state.len(), self.cfg.vocab_size);
        if let Some(&token) = tokens.iter().find(|&&x| x as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { token, vocab });
        }
        if pos + t > self.rope.max_positions() {
            return Err(EngineError::ContextOverflow {
                needed: pos + t,
                limit: self.rope.max_positions(),
            });
        }
        state.kv.prepare_step(t)?;
        let mut key = vec![
            self.step_scope,
            t as u64,
            matches!(rows, LogitsRows::All) as u64,
        ];
        key.extend(state.kv.storage_keys());
        let kv = &mut state.kv;
        let mut body = |step: &B::Step| -> Result<Vec<B::Buf>> {
            let mut x = ops.gather_rows_step(&self.embed, step)?;
            let rope = self.rope.tables_step(ops, step, t)?;
            for (i, b) in self.blocks.iter().enumerate() {
                x = b.forward_at(ops, x, t, &rope, kv, i, Some(step))?;
            }
            let (logits, _) = self.logits(&x, t, rows)?;
            Ok(vec![logits, x])
        };
        let outs = match ops.run_step(&key, pos, tokens, &mut body) {
            Ok(o) => o,
            Err(e) => {
                state.kv.rollback()?;
                return Err(e);
            }
        };
        state.kv.advance(t)?;
        let [logits, x]: [B::Buf; 2] = outs.try_into().map_err(|o: Vec<B::Buf>| {
            EngineError::State(format!("a llama step returned {} buffers, not 2", o.len()))
        })?;
        let n = match rows {
            LogitsRows::Last => 1,
            LogitsRows::All => t,
        };
        let out = ForwardOutput {
            logits: ops.download(&logits)?,
            rows: n,
            vocab,
        };
        Ok((out, x))
    }

    pub(super) fn hidden_rows(&self, buf: B::Buf, rows: usize) -> Result<DeviceRows<B>> {
        DeviceRows::new(&self.ops, buf, rows, self.cfg.hidden_size)
    }
}

use crate::load::binder::WeightSource;

/// A verify window of the llama trunk: where it started and its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaWindow {
    pub start: usize,
    pub rows: usize,
}

impl<B: Backend> Model for LlamaModel<B> {
    type State = LlamaState<B>;
    type MtpHistory = LlamaMtpHistory<B>;
    type Hidden = DeviceRows<B>;

    fn descriptor(&self) -> &'static FamilyDescriptor {
        &super::DESCRIPTOR
    }

    fn backend(&self) -> crate::backend::BackendId {
        let mut id = self.ops.id();
        // The cache type decides what a state holds: an f16 state must not
        // seed an f32 server's warm turn, nor the reverse (the f32 tag is
        // the one earlier releases wrote).
        if self.kv_type == KvType::F16 {
            id.tag.push_str("+kv-f16");
        }
        id
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.cfg.context_length
    }

    fn new_state(&self) -> LlamaState<B> {
        LlamaState {
            kv: KvCache::with_type(
                &self.ops,
                self.cfg.num_layers,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.context_length,
                self.kv_type,
            )
            .expect("allocating an empty kv cache"),
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut LlamaState<B>,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self.run(tokens, state, rows)?.0)
    }

    fn forward_batch(
        &self,
        calls: &mut [BatchCall<'_, LlamaState<B>>],
    ) -> Vec<Result<BatchResult<Self>>> {
        self.run_batch(calls)
    }

    fn mtp_contract(&self) -> Option<MtpContract> {
        self.mtp.as_ref().map(|_| MtpContract {
            default_depth: MTP_DEFAULT_DEPTH,
            max_depth: MTP_MAX_DEPTH,
            hidden: MTP_HIDDEN,
            // Tuned where a verify row costs a quarter of a step (the
            // CPU's reference set); elsewhere every draft pays.
            min_draft_confidence: draft_stop_on(&self.ops.id()),
        })
    }

    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut LlamaState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, DeviceRows<B>)> {
        let (out, x) = self.run(tokens, state, rows)?;
        Ok((out, self.hidden_rows(x, tokens.len())?))
    }

    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut LlamaState<B>,
    ) -> Result<VerifyWindow<LlamaWindow, DeviceRows<B>>> {
        let start = state.len();
        let (logits, x) = self.run(tokens, state, LogitsRows::All)?;
        Ok(VerifyWindow {
            logits,
            hidden: self.hidden_rows(x, tokens.len())?,
            record: LlamaWindow {
                start,
                rows: tokens.len(),
            },
        })
    }

    fn hidden_from_host(&self, rows: usize, width: usize, data: Vec<f32>) -> Result<DeviceRows<B>> {
        if width != self.cfg.hidden_size {
            return Err(EngineError::State(format!(
                "llama hidden rows are {} wide, not {width}",
                self.cfg.hidden_size
            )));
        }
        self.hidden_rows(self.ops.upload(&data)?, rows)
    }

    fn new_mtp_history(&self) -> Option<LlamaMtpHistory<B>> {
        self.mtp.as_ref().map(|_| {
            LlamaMtpHistory::new(&self.ops, &self.cfg).expect("allocating an empty MTP history")
        })
    }

    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &DeviceRows<B>,
        history: &mut LlamaMtpHistory<B>,
    ) -> Result<MtpStep<DeviceRows<B>>> {
        let head = self.mtp.as_ref().ok_or_else(|| {
            EngineError::Unsupported("llama: no MTP head is attached (mtp_forward)".into())
        })?;
        let n = tokens.len();
        if n == 0 || hidden.rows() != n || hidden.width() != self.cfg.hidden_size {
            return Err(EngineError::State(format!(
                "MTP rows: {n} tokens and hidden rows [{}, {}] (expected [{n}, {}])",
                hidden.rows(),
                hidden.width(),
                self.cfg.hidden_size
            )));
        }
        let emb = embed_tokens(&self.ops, &self.embed, tokens, self.cfg.vocab_size)?;
        let (logits, last) = head.forward(&self.ops, &emb, hidden.buf(), n, &self.rope, history)?;
        Ok(MtpStep {
            logits,
            hidden: self.hidden_rows(last, 1)?,
        })
    }

    fn mtp_forward_batch(
        &self,
        calls: &mut [MtpCall<'_, DeviceRows<B>, LlamaMtpHistory<B>>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        self.run_mtp_batch(calls)
    }
}
