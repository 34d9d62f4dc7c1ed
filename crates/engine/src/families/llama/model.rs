//! Llama weights bound to layers, and the forward pass.
//!
//! Shapes (batch is always 1 and dropped): tokens `[t]` → embeddings
//! `[t, hidden]` → `num_layers` × (pre-norm attention, pre-norm SwiGLU, both
//! residual) → final norm → head `[rows, vocab]` where `rows` is 1 for
//! [`LogitsRows::Last`] (the head is the largest matmul; a prefill chunk
//! needs only its last row) or `t` for [`LogitsRows::All`].

use std::path::{Path, PathBuf};

use super::config::LlamaConfig;
use crate::backend::{Backend, CpuOps, HostWeight};
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::layers::attention::Attention;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::mlp::SwiGlu;
use crate::layers::norms::RmsNorm;
use crate::layers::rope::{Rope, RopeScaling};
use crate::load::ModelFormat;
use crate::load::binder::Binder;
use crate::load::gguf::GgufFile;
use crate::load::safetensors::SafetensorsDir;
use crate::model::{ForwardOutput, LogitsRows, Model, ModelState};
use crate::state::kv_cache::KvCache;

/// Tensors a Hugging Face llama checkpoint may carry that hold nothing we
/// need: old transformers versions saved the RoPE inverse frequencies, which
/// we recompute from the config.
pub const HF_IGNORED: &[&str] = &["rotary_emb.inv_freq"];

#[derive(Debug)]
struct Block<B: Backend> {
    attn_norm: RmsNorm<B>,
    attn: Attention<B>,
    mlp_norm: RmsNorm<B>,
    mlp: SwiGlu<B>,
}

#[derive(Debug)]
pub struct LlamaModel<B: Backend = CpuOps> {
    ops: B,
    cfg: LlamaConfig,
    source: PathBuf,
    format: ModelFormat,
    /// `[vocab, hidden]`. A block-quantized GGUF table (Q8_0 in the default
    /// model) stays quantized and is dequantized row by row on lookup: the
    /// whole table in f32 would take 113 MB for SmolLM2 (more than the 98 MB
    /// model), for a saving of ~600 multiply-adds per token.
    embed: B::Table,
    blocks: Vec<Block<B>>,
    norm: RmsNorm<B>,
    head: Linear<B>,
    rope: Rope<B>,
}

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
    type Window = crate::model::NoMtp;

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
struct Names {
    embed: &'static str,
    head: &'static str,
    norm: &'static str,
    block: fn(usize) -> String,
    attn_norm: &'static str,
    mlp_norm: &'static str,
    /// q, k, v, o, gate, up, down.
    proj: [&'static str; 7],
}

const GGUF_NAMES: Names = Names {
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
        let (hidden, d) = (cfg.hidden_size, cfg.head_dim);
        let (qd, kvd, ffn) = (
            cfg.num_heads * d,
            cfg.num_kv_heads * d,
            cfg.intermediate_size,
        );
        let eps = cfg.rms_norm_eps;
        let mut w = Binder::new(src, &ops);
        let embd = w.raw(n.embed, &[cfg.vocab_size, hidden])?;
        let embed = w.ops().table(embd.clone(), cfg.vocab_size, hidden)?;
        let head = if cfg.tie_word_embeddings {
            let embd = match (mode, embd) {
                (GgufWeights::DequantizeF32, HostWeight::Gguf(q)) => {
                    HostWeight::F32(q.dequantize(&q.device())?)
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
            let mut b = w.pp(&(n.block)(i));
            let [q, k, v, o, gate, up, down] = n.proj;
            blocks.push(Block {
                attn_norm: RmsNorm::load(&mut b, n.attn_norm, hidden, eps)?,
                attn: Attention {
                    q: linear(&mut b, q, qd, hidden, mode)?,
                    k: linear(&mut b, k, kvd, hidden, mode)?,
                    v: linear(&mut b, v, kvd, hidden, mode)?,
                    o: linear(&mut b, o, hidden, qd, mode)?,
                    num_heads: cfg.num_heads,
                    num_kv_heads: cfg.num_kv_heads,
                    head_dim: d,
                },
                mlp_norm: RmsNorm::load(&mut b, n.mlp_norm, hidden, eps)?,
                mlp: SwiGlu {
                    gate: linear(&mut b, gate, ffn, hidden, mode)?,
                    up: linear(&mut b, up, ffn, hidden, mode)?,
                    down: linear(&mut b, down, hidden, ffn, mode)?,
                },
            });
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
            source: source.to_path_buf(),
            format,
            embed,
            blocks,
            norm,
            head,
            rope,
        })
    }

    /// The layers over `x: [t, hidden]`, appending to `kv` (not advanced).
    fn layers(&self, mut x: B::Buf, t: usize, kv: &mut KvCache<B>) -> Result<B::Buf> {
        let ops = &self.ops;
        let rope = self.rope.tables(ops, kv.len(), t)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let h = b
                .attn
                .forward(ops, &b.attn_norm.forward(ops, &x)?, t, &rope, kv, i)?;
            x = ops.add(&x, &h)?;
            let h = b.mlp.forward(ops, &b.mlp_norm.forward(ops, &x)?, t)?;
            x = ops.add(&x, &h)?;
        }
        Ok(x)
    }
}

use crate::load::binder::WeightSource;

impl<B: Backend> Model for LlamaModel<B> {
    type State = LlamaState<B>;
    type MtpHistory = crate::model::NoMtp;
    type Hidden = crate::model::NoMtp;

    fn descriptor(&self) -> &'static FamilyDescriptor {
        &super::DESCRIPTOR
    }

    fn backend(&self) -> crate::backend::BackendId {
        self.ops.id()
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.cfg.context_length
    }

    fn new_state(&self) -> LlamaState<B> {
        LlamaState {
            kv: KvCache::new(
                &self.ops,
                self.cfg.num_layers,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.context_length,
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
        if let Some(&bad) = tokens
            .iter()
            .find(|&&tok| tok as usize >= self.cfg.vocab_size)
        {
            return Err(EngineError::TokenOutOfRange {
                token: bad,
                vocab: self.cfg.vocab_size,
            });
        }
        let x = ops.gather_rows(&self.embed, tokens)?;
        // A forward that fails half way leaves the cache as it was.
        let x = match self.layers(x, t, &mut state.kv) {
            Ok(x) => x,
            Err(e) => {
                state.kv.rollback()?;
                return Err(e);
            }
        };
        state.kv.advance(t)?;
        let (x, n) = match rows {
            LogitsRows::Last => (ops.rows(&x, self.cfg.hidden_size, t - 1, 1)?, 1),
            LogitsRows::All => (x, t),
        };
        let logits = self.head.forward(ops, &self.norm.forward(ops, &x)?, n)?;
        Ok(ForwardOutput {
            logits: ops.download(&logits)?,
            rows: n,
            vocab: self.cfg.vocab_size,
        })
    }
}
