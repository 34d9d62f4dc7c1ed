//! Llama weights bound to layers, and the forward pass.
//!
//! Shapes (batch is always 1 and dropped): tokens `[t]` → embeddings
//! `[t, hidden]` → `num_layers` × (pre-norm attention, pre-norm SwiGLU, both
//! residual) → final norm → head `[rows, vocab]` where `rows` is 1 for
//! [`LogitsRows::Last`] (the head is the largest matmul; a prefill chunk
//! needs only its last row) or `t` for [`LogitsRows::All`].

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};

use super::config::LlamaConfig;
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::layers::attention::Attention;
use crate::layers::linear::Linear;
use crate::layers::mlp::SwiGlu;
use crate::layers::rms_norm::RmsNorm;
use crate::layers::rope::{Rope, RopeScaling};
use crate::load::ModelFormat;
use crate::load::gguf::GgufFile;
use crate::load::safetensors::SafetensorsDir;
use crate::model::{ForwardOutput, LogitsRows, Model, ModelState};
use crate::state::kv_cache::KvCache;

/// Tensors a Hugging Face llama checkpoint may carry that hold nothing we
/// need: old transformers versions saved the RoPE inverse frequencies, which
/// we recompute from the config.
pub const HF_IGNORED: &[&str] = &["rotary_emb.inv_freq"];

/// Token embedding table.
#[derive(Debug)]
enum Embedding {
    /// `[vocab, hidden]` f32.
    Dense(Tensor),
    /// A block-quantized GGUF table (Q8_0 in the default model). Rows are
    /// dequantized on lookup: the whole table in f32 would take 113 MB for
    /// SmolLM2 (more than the 98 MB model), for a saving of ~600 multiply-adds
    /// per token. The quantized table also serves as the tied output head.
    Quantized {
        table: Arc<QTensor>,
        dtype: GgmlDType,
        row_bytes: usize,
    },
}

impl Embedding {
    /// `tokens: [t]` → `[t, hidden]` f32.
    fn lookup(
        &self,
        tokens: &[u32],
        vocab: usize,
        hidden: usize,
        device: &Device,
    ) -> Result<Tensor> {
        if let Some(&bad) = tokens.iter().find(|&&tok| tok as usize >= vocab) {
            return Err(EngineError::TokenOutOfRange { token: bad, vocab });
        }
        match self {
            Embedding::Dense(table) => {
                let ids = Tensor::from_slice(tokens, tokens.len(), device)?;
                Ok(table.index_select(&ids, 0)?)
            }
            Embedding::Quantized {
                table,
                dtype,
                row_bytes,
            } => {
                // On CPU `data()` borrows the table; on a GPU it would copy it
                // to the host, so a GPU backend must gather on the device.
                let data = table.data()?;
                let mut rows = Vec::with_capacity(tokens.len() * row_bytes);
                for &tok in tokens {
                    let start = tok as usize * row_bytes;
                    rows.extend_from_slice(&data[start..start + row_bytes]);
                }
                let storage = QStorage::from_data(Cow::Owned(rows), device, *dtype)?;
                let q = QTensor::new(storage, (tokens.len(), hidden))?;
                Ok(q.dequantize(device)?)
            }
        }
    }
}

#[derive(Debug)]
struct Block {
    attn_norm: RmsNorm,
    attn: Attention,
    mlp_norm: RmsNorm,
    mlp: SwiGlu,
}

#[derive(Debug)]
pub struct LlamaModel {
    cfg: LlamaConfig,
    source: PathBuf,
    format: ModelFormat,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    head: Linear,
    rope: Rope,
    device: Device,
}

/// What a llama model remembers: the KV cache of every layer.
#[derive(Debug)]
pub struct LlamaState {
    pub kv: KvCache,
}

impl LlamaState {
    /// Like [`ModelState::snapshot`], reporting allocation failures.
    pub fn try_snapshot(&self) -> Result<Self> {
        Ok(Self {
            kv: self.kv.snapshot()?,
        })
    }

    /// Become an independent copy of `snap` (which stays usable).
    pub fn restore(&mut self, snap: &Self) -> Result<()> {
        *self = snap.try_snapshot()?;
        Ok(())
    }
}

impl ModelState for LlamaState {
    type Window = crate::model::NoMtp;

    fn len(&self) -> usize {
        self.kv.len()
    }

    fn truncate_floor(&self) -> usize {
        0
    }

    fn snapshot(&self) -> Self {
        // The only failure is allocating the copy (out of memory), which the
        // contract gives no way to report; see `try_snapshot`.
        self.try_snapshot()
            .expect("allocating a kv-cache snapshot failed (out of memory)")
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

fn gguf_f32(g: &mut GgufFile, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
    let q = g.tensor(name, shape, device)?;
    Ok(q.dequantize(device)?)
}

/// How GGUF matrices are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgufWeights {
    /// Keep block-quantized weights quantized (candle's quantized matmul,
    /// activations rounded to Q8 like llama.cpp). The fast path.
    #[default]
    Quantized,
    /// Dequantize every matrix to f32 once at load (4-8x the memory). The
    /// arithmetic is then the f32 reference's, which isolates quantized
    /// activation rounding when comparing against transformers.
    DequantizeF32,
}

fn gguf_linear(
    g: &mut GgufFile,
    name: &str,
    shape: &[usize],
    mode: GgufWeights,
    device: &Device,
) -> Result<Linear> {
    let q = g.tensor(name, shape, device)?;
    bind_gguf_linear(Arc::new(q), mode, device)
}

fn bind_gguf_linear(q: Arc<QTensor>, mode: GgufWeights, device: &Device) -> Result<Linear> {
    Ok(match mode {
        GgufWeights::Quantized => Linear::quantized(q)?,
        GgufWeights::DequantizeF32 => Linear::dense(q.dequantize(device)?)?,
    })
}

impl LlamaModel {
    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn format(&self) -> ModelFormat {
        self.format
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Load from a `.gguf` file, keeping quantized weights quantized.
    pub fn from_gguf(path: &Path, device: &Device) -> Result<Self> {
        Self::from_gguf_with(path, GgufWeights::Quantized, device)
    }

    /// Load from a `.gguf` file, binding matrices as `mode` says.
    pub fn from_gguf_with(path: &Path, mode: GgufWeights, device: &Device) -> Result<Self> {
        let mut g = GgufFile::open(path)?;
        let mut cfg = LlamaConfig::from_gguf(&g)?;
        let (hidden, d) = (cfg.hidden_size, cfg.head_dim);

        if g.has_tensor("rope_freqs.weight") {
            let f = gguf_f32(&mut g, "rope_freqs.weight", &[d / 2], device)?;
            cfg.rope_scaling = RopeScaling::FreqFactors(f.to_vec1::<f32>()?);
        }

        let embd = g.tensor("token_embd.weight", &[cfg.vocab_size, hidden], device)?;
        let embd = Arc::new(embd);
        let embed = match embd.dtype() {
            GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16 => {
                Embedding::Dense(embd.dequantize(device)?)
            }
            dtype => {
                let row_bytes = hidden / dtype.block_size() * dtype.type_size();
                if hidden % dtype.block_size() != 0 {
                    return Err(EngineError::Tensor {
                        path: path.to_path_buf(),
                        tensor: "token_embd.weight".into(),
                        message: format!("rows of {hidden} are not whole {dtype:?} blocks"),
                    });
                }
                Embedding::Quantized {
                    table: embd.clone(),
                    dtype,
                    row_bytes,
                }
            }
        };
        let head = if cfg.tie_word_embeddings {
            bind_gguf_linear(embd, mode, device)?
        } else {
            gguf_linear(
                &mut g,
                "output.weight",
                &[cfg.vocab_size, hidden],
                mode,
                device,
            )?
        };
        let norm = RmsNorm::new(
            gguf_f32(&mut g, "output_norm.weight", &[hidden], device)?,
            cfg.rms_norm_eps,
        );

        let (qd, kvd, ffn) = (
            cfg.num_heads * d,
            cfg.num_kv_heads * d,
            cfg.intermediate_size,
        );
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            blocks.push(Block {
                attn_norm: RmsNorm::new(
                    gguf_f32(&mut g, &n("attn_norm"), &[hidden], device)?,
                    cfg.rms_norm_eps,
                ),
                attn: Attention {
                    q: gguf_linear(&mut g, &n("attn_q"), &[qd, hidden], mode, device)?,
                    k: gguf_linear(&mut g, &n("attn_k"), &[kvd, hidden], mode, device)?,
                    v: gguf_linear(&mut g, &n("attn_v"), &[kvd, hidden], mode, device)?,
                    o: gguf_linear(&mut g, &n("attn_output"), &[hidden, qd], mode, device)?,
                    num_heads: cfg.num_heads,
                    num_kv_heads: cfg.num_kv_heads,
                    head_dim: d,
                },
                mlp_norm: RmsNorm::new(
                    gguf_f32(&mut g, &n("ffn_norm"), &[hidden], device)?,
                    cfg.rms_norm_eps,
                ),
                mlp: SwiGlu {
                    gate: gguf_linear(&mut g, &n("ffn_gate"), &[ffn, hidden], mode, device)?,
                    up: gguf_linear(&mut g, &n("ffn_up"), &[ffn, hidden], mode, device)?,
                    down: gguf_linear(&mut g, &n("ffn_down"), &[hidden, ffn], mode, device)?,
                },
            });
        }
        g.finish()?;
        Self::assemble(
            cfg,
            path,
            ModelFormat::Gguf,
            embed,
            blocks,
            norm,
            head,
            device,
        )
    }

    /// Load from a Hugging Face directory (`config.json` + safetensors).
    pub fn from_hf_dir(dir: &Path, device: &Device) -> Result<Self> {
        let mut st = SafetensorsDir::open(dir)?;
        let cfg = LlamaConfig::from_hf(&st.config_path(), st.config())?;
        let (hidden, d) = (cfg.hidden_size, cfg.head_dim);
        let embed = st.tensor(
            "model.embed_tokens.weight",
            &[cfg.vocab_size, hidden],
            device,
        )?;
        let head = if cfg.tie_word_embeddings {
            // transformers re-ties after loading, discarding a stored copy.
            st.ignore("lm_head.weight");
            Linear::dense(embed.clone())?
        } else {
            Linear::dense(st.tensor("lm_head.weight", &[cfg.vocab_size, hidden], device)?)?
        };
        let norm = RmsNorm::new(
            st.tensor("model.norm.weight", &[hidden], device)?,
            cfg.rms_norm_eps,
        );
        let (qd, kvd, ffn) = (
            cfg.num_heads * d,
            cfg.num_kv_heads * d,
            cfg.intermediate_size,
        );
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = |s: &str| format!("model.layers.{i}.{s}.weight");
            let mut lin = |s: &str, shape: &[usize]| -> Result<Linear> {
                Ok(Linear::dense(st.tensor(&n(s), shape, device)?)?)
            };
            let attn = Attention {
                q: lin("self_attn.q_proj", &[qd, hidden])?,
                k: lin("self_attn.k_proj", &[kvd, hidden])?,
                v: lin("self_attn.v_proj", &[kvd, hidden])?,
                o: lin("self_attn.o_proj", &[hidden, qd])?,
                num_heads: cfg.num_heads,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: d,
            };
            let mlp = SwiGlu {
                gate: lin("mlp.gate_proj", &[ffn, hidden])?,
                up: lin("mlp.up_proj", &[ffn, hidden])?,
                down: lin("mlp.down_proj", &[hidden, ffn])?,
            };
            blocks.push(Block {
                attn_norm: RmsNorm::new(
                    st.tensor(&n("input_layernorm"), &[hidden], device)?,
                    cfg.rms_norm_eps,
                ),
                attn,
                mlp_norm: RmsNorm::new(
                    st.tensor(&n("post_attention_layernorm"), &[hidden], device)?,
                    cfg.rms_norm_eps,
                ),
                mlp,
            });
        }
        st.finish(HF_IGNORED)?;
        Self::assemble(
            cfg,
            dir,
            ModelFormat::HfDir,
            Embedding::Dense(embed),
            blocks,
            norm,
            head,
            device,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        cfg: LlamaConfig,
        source: &Path,
        format: ModelFormat,
        embed: Embedding,
        blocks: Vec<Block>,
        norm: RmsNorm,
        head: Linear,
        device: &Device,
    ) -> Result<Self> {
        let rope = Rope::new(
            cfg.rope_theta,
            cfg.head_dim,
            &cfg.rope_scaling,
            cfg.rope_layout,
            cfg.context_length,
            device,
        )?;
        Ok(Self {
            cfg,
            source: source.to_path_buf(),
            format,
            embed,
            blocks,
            norm,
            head,
            rope,
            device: device.clone(),
        })
    }
}

impl Model for LlamaModel {
    type State = LlamaState;
    type MtpHistory = crate::model::NoMtp;

    fn descriptor(&self) -> &'static FamilyDescriptor {
        &super::DESCRIPTOR
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.cfg.context_length
    }

    fn new_state(&self) -> LlamaState {
        LlamaState {
            kv: KvCache::new(
                self.cfg.num_layers,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.context_length,
                &self.device,
            ),
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut LlamaState,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        let t = tokens.len();
        if t == 0 {
            return Err(EngineError::State(
                "forward needs at least one token".into(),
            ));
        }
        let offset = state.len();
        let total = offset + t;
        if total > self.cfg.context_length {
            return Err(EngineError::ContextOverflow {
                needed: total,
                limit: self.cfg.context_length,
            });
        }
        let mut x = self.embed.lookup(
            tokens,
            self.cfg.vocab_size,
            self.cfg.hidden_size,
            &self.device,
        )?;
        state.kv.reserve(total)?;
        let (cos, sin) = self.rope.tables(offset, t)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let h = b.attn.forward(
                &b.attn_norm.forward(&x)?,
                &self.rope,
                &cos,
                &sin,
                &mut state.kv,
                i,
            )?;
            x = x.add(&h)?;
            let h = b.mlp.forward(&b.mlp_norm.forward(&x)?)?;
            x = x.add(&h)?;
        }
        state.kv.advance(t)?;
        let x = match rows {
            LogitsRows::Last => x.narrow(0, t - 1, 1)?,
            LogitsRows::All => x,
        };
        let logits = self.head.forward(&self.norm.forward(&x)?)?;
        let (rows, vocab) = logits.dims2()?;
        Ok(ForwardOutput {
            logits: logits.flatten_all()?.to_vec1::<f32>()?,
            rows,
            vocab,
        })
    }
}
