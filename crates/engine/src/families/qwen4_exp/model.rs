//! The Qwen4-Exp text model (trunk) and its MTP head, batch 1.
//!
//! ```text
//! X = tile(embed(ids), C)                                       [T, C·H]
//! for each layer:
//!   if PLE layer:  X += PLE(X, ids)
//!   x, inj = HC_attn(X);  X = X + concat_s(inj_s · (GDN | QSA-attn)(x))
//!   x, inj = HC_mlp(X);   X = X + concat_s(inj_s · MoE(x))
//! logits = lm_head( HC_final(X) )        the final mixer is the final norm
//! ```
//!
//! ## MTP contract
//!
//! The head (checkpoint keys `mtp.*`, ignored by transformers) runs in stream
//! space. Row `i` of an MTP call combines
//!
//! * the token that *follows* trunk position `t` (`tok_{t+1}`, the token just
//!   sampled from the trunk's row `t`, or a drafted token when chaining), and
//! * the trunk's **pre-mixer streams at position `t`**: the output of the
//!   last decoder layer, `[C·H]`, before `hyper_connection_mixer`
//!   ([`TrunkOutput::streams`]). Not the mixed/normalised `[H]` hidden.
//!
//! at RoPE position `t`:
//!
//! ```text
//! e    = fc_embedding · N1(embed(tok); pre_fc_norm_embedding)        [H]
//! X0_s = fc_hidden · N1(Xtrunk_t; pre_fc_norm_hidden)_s + e          one rms over all C·H values
//! X1   = QSA decoder layer (HC-attn + HC-MoE) on X0, own KV + indexer cache ([`MtpState`])
//! logits = lm_head( mtp.hyper_connection_mixer(X1) )
//! ```
//!
//! A deeper draft feeds `X1` (pre-mixer, [`MtpOutput::streams`]) back as
//! `Xtrunk` with the drafted token at position `t+1`. After verification the
//! decode loop truncates the MTP state to the committed rows and feeds the
//! trunk's streams of the accepted rows.

use std::path::Path;

use candle_core::{D, Device, Tensor};

use super::config::{LayerKind, Qwen4ExpConfig};
use super::gated_attention::{GatedAttention, MRope};
use super::gated_deltanet::GatedDeltaNet;
use super::hyper_connections::GatedResidual;
use super::kernels::Dense;
use super::moe::{Moe, Routing};
use super::norms::{ZcNorm, load, to_vec};
use super::ple::Ple;
use super::state::{
    AttnCache, GdnReplay, LayerCache, LinearCapture, MtpState, PleCache, Qwen4ExpState,
    WindowCapture,
};
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::load::safetensors::SafetensorsDir;
use crate::model::{ForwardOutput, Hidden, LogitsRows, Model, MtpContract, MtpStep, VerifyWindow};

#[derive(Debug, Clone)]
enum Mixer {
    Gdn(GatedDeltaNet),
    Attn(GatedAttention),
}

#[derive(Debug, Clone)]
pub struct DecoderLayer {
    ple: Option<Ple>,
    mixer: Mixer,
    moe: Moe,
    attn_hc: GatedResidual,
    mlp_hc: GatedResidual,
}

/// What one layer did, for tests and `debug` tooling.
#[derive(Debug, Clone)]
pub struct LayerTrace {
    /// Output streams `[T, C·H]`.
    pub streams: Tensor,
    /// Kept token indices per new query (attention layers).
    pub qsa: Option<Vec<Vec<u32>>>,
    pub routing: Routing,
}

/// Window record of one linear layer while it runs.
#[derive(Default)]
struct LayerCapture {
    gdn: Option<GdnReplay>,
    ple_before: Option<PleCache>,
    ple: Vec<PleCache>,
}

impl DecoderLayer {
    fn load(
        st: &mut SafetensorsDir,
        p: &str,
        cfg: &Qwen4ExpConfig,
        kind: LayerKind,
        pli: Option<usize>,
    ) -> Result<Self> {
        let (h, c, eps) = (cfg.hidden_size, cfg.hc_count, cfg.rms_norm_eps);
        let ple = match pli {
            Some(i) => Some(Ple::load(st, &format!("{p}ple."), cfg, i)?),
            None => None,
        };
        let mixer = match kind {
            LayerKind::Linear => Mixer::Gdn(GatedDeltaNet::load(
                st,
                &format!("{p}linear_attn."),
                h,
                cfg.linear_num_key_heads,
                cfg.linear_num_value_heads,
                cfg.linear_key_head_dim,
                cfg.linear_value_head_dim,
                cfg.linear_conv_kernel,
                cfg.output_gate,
                eps,
            )?),
            LayerKind::Indexed => Mixer::Attn(GatedAttention::load(
                st,
                &format!("{p}self_attn."),
                h,
                cfg.num_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                (
                    cfg.indexer_n_heads,
                    cfg.indexer_head_dim,
                    cfg.indexer_budget,
                    cfg.indexer_compress_ratio,
                ),
                eps,
            )?),
        };
        Ok(Self {
            ple,
            mixer,
            moe: Moe::load(
                st,
                &format!("{p}mlp."),
                h,
                cfg.num_experts,
                cfg.num_experts_per_tok,
                cfg.moe_intermediate_size,
                cfg.shared_expert_intermediate_size,
                cfg.norm_topk_prob,
            )?,
            attn_hc: GatedResidual::load(
                st,
                &format!("{p}attn_hyper_connection."),
                c,
                h,
                cfg.hc_lowrank,
                eps,
                true,
            )?,
            mlp_hc: GatedResidual::load(
                st,
                &format!("{p}mlp_hyper_connection."),
                c,
                h,
                cfg.hc_lowrank,
                eps,
                true,
            )?,
        })
    }

    fn new_cache(&self) -> LayerCache {
        match &self.mixer {
            Mixer::Gdn(g) => LayerCache::Linear {
                gdn: g.new_cache(),
                ple: self.ple.as_ref().map(|p| p.new_cache()),
            },
            Mixer::Attn(_) => LayerCache::Attn(AttnCache::default()),
        }
    }

    /// `xs: [T, C·H]` → `[T, C·H]`.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        xs: &Tensor,
        tokens: &[u32],
        cache: &mut LayerCache,
        positions: &[[u32; 3]],
        rope: &MRope,
        mut capture: Option<&mut LayerCapture>,
        trace: bool,
    ) -> Result<(Tensor, Option<LayerTrace>)> {
        let mut xs = xs.clone();
        let mut qsa = None;
        match (&self.mixer, cache) {
            (Mixer::Gdn(gdn), LayerCache::Linear { gdn: gc, ple: pc }) => {
                if let Some(cap) = capture.as_deref_mut() {
                    cap.ple_before = pc.clone();
                }
                if let (Some(ple), Some(pc)) = (&self.ple, pc.as_mut()) {
                    let add =
                        ple.forward(&xs, tokens, pc, capture.as_deref_mut().map(|c| &mut c.ple))?;
                    xs = (xs + add)?;
                }
                let (x, inj) = self.attn_hc.mix(&xs)?;
                let y = gdn.forward(&x, gc, capture.map(|c| &mut c.gdn))?;
                xs = self
                    .attn_hc
                    .combine(&xs, &y, &inj.expect("combining module"))?;
            }
            (Mixer::Attn(attn), LayerCache::Attn(ac)) => {
                let (x, inj) = self.attn_hc.mix(&xs)?;
                let (y, sel) = attn.forward(&x, ac, positions, rope)?;
                xs = self
                    .attn_hc
                    .combine(&xs, &y, &inj.expect("combining module"))?;
                qsa = Some(sel);
            }
            _ => {
                return Err(EngineError::State(
                    "layer cache does not match the layer kind".into(),
                ));
            }
        }
        let (x, inj) = self.mlp_hc.mix(&xs)?;
        let (y, routing) = self.moe.forward(&x)?;
        xs = self
            .mlp_hc
            .combine(&xs, &y, &inj.expect("combining module"))?;
        let tr = trace.then(|| LayerTrace {
            streams: xs.clone(),
            qsa,
            routing,
        });
        Ok((xs, tr))
    }
}

/// The MTP head (see the module docs for its contract).
#[derive(Debug, Clone)]
pub struct MtpHead {
    pre_e: ZcNorm,
    pre_h: ZcNorm,
    fc_e: Dense,
    fc_h: Dense,
    layer: DecoderLayer,
    mixer: GatedResidual,
}

/// A trunk forward with everything the decode loops and tests may need.
#[derive(Debug)]
pub struct TrunkOutput {
    pub logits: ForwardOutput,
    /// Pre-mixer streams of the last decoder layer, `[T, C·H]` (what feeds
    /// the MTP head).
    pub streams: Tensor,
    /// The window record (only from [`Qwen4ExpModel::forward_window`]).
    pub capture: Option<WindowCapture>,
    /// Per-layer traces (only when asked).
    pub trace: Vec<LayerTrace>,
}

/// An MTP call's logits and pre-mixer streams `[n, C·H]` (the next depth's
/// input).
#[derive(Debug)]
pub struct MtpOutput {
    pub logits: ForwardOutput,
    pub streams: Tensor,
}

// Large parts are boxed so that `LoadedModel` stays small.
pub struct Qwen4ExpModel {
    cfg: Box<Qwen4ExpConfig>,
    /// `[V, H]`.
    embed: Tensor,
    lm_head: Dense,
    layers: Vec<DecoderLayer>,
    mixer: Box<GatedResidual>,
    rope: MRope,
    mtp: Option<Box<MtpHead>>,
}

impl Qwen4ExpModel {
    /// Load a Hugging Face directory (`qwen4_exp_text` or the VL
    /// `qwen4_exp`; f32, bf16 or f16 weights, computed in f32). `mtp.*`
    /// weights are bound when present; `model.visual.*` is ignored.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let mut st = SafetensorsDir::open(dir)?;
        let parsed = Qwen4ExpConfig::from_hf(&st.config_path(), st.config())?;
        let (cfg, p) = (parsed.config, parsed.prefix);
        let (h, c, eps) = (cfg.hidden_size, cfg.hc_count, cfg.rms_norm_eps);
        let embed = load(&mut st, p, "embed_tokens.weight", &[cfg.vocab_size, h])?;
        let lm_head = if cfg.tie_word_embeddings {
            Dense::new(embed.clone())?
        } else {
            Dense::new(load(&mut st, "", "lm_head.weight", &[cfg.vocab_size, h])?)?
        };
        let layers = (0..cfg.num_layers)
            .map(|l| {
                DecoderLayer::load(
                    &mut st,
                    &format!("{p}layers.{l}."),
                    &cfg,
                    cfg.layer_kinds[l],
                    cfg.ple_index(l),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let mixer = GatedResidual::load(
            &mut st,
            &format!("{p}hyper_connection_mixer."),
            c,
            h,
            cfg.hc_lowrank,
            eps,
            false,
        )?;
        let mtp = if st.has("mtp.fc_embedding.weight") {
            // The head's layer is a QSA layer even when the trunk has none,
            // so the indexer geometry must hold for it too.
            if cfg.rotary_dim > cfg.indexer_head_dim {
                return Err(EngineError::Config {
                    path: st.config_path(),
                    field: "indexer_head_dim".into(),
                    message: format!(
                        "the MTP head's QSA layer needs indexer_head_dim >= rotary dim {}",
                        cfg.rotary_dim
                    ),
                });
            }
            // The MTP layer is a QSA decoder layer without PLE.
            Some(Box::new(MtpHead {
                pre_e: ZcNorm::load(&mut st, "mtp.", "pre_fc_norm_embedding.weight", h, h, eps)?,
                pre_h: ZcNorm::load(
                    &mut st,
                    "mtp.",
                    "pre_fc_norm_hidden.weight",
                    c * h,
                    c * h,
                    eps,
                )?,
                fc_e: Dense::new(load(&mut st, "mtp.", "fc_embedding.weight", &[h, h])?)?,
                fc_h: Dense::new(load(&mut st, "mtp.", "fc_hidden.weight", &[h, h])?)?,
                layer: DecoderLayer::load(
                    &mut st,
                    "mtp.layers.0.",
                    &cfg,
                    LayerKind::Indexed,
                    None,
                )?,
                mixer: GatedResidual::load(
                    &mut st,
                    "mtp.hyper_connection_mixer.",
                    c,
                    h,
                    cfg.hc_lowrank,
                    eps,
                    false,
                )?,
            }))
        } else {
            None
        };
        // The vision tower is not part of the text model.
        let visual: Vec<String> = st
            .entries()
            .filter(|(n, _)| n.starts_with("model.visual."))
            .map(|(n, _)| n.to_string())
            .collect();
        for n in visual {
            st.ignore(&n);
        }
        st.finish(&[])?;
        let rope = MRope::new(cfg.rope_theta, cfg.rotary_dim, cfg.mrope_section);
        Ok(Self {
            cfg: Box::new(cfg),
            embed,
            lm_head,
            layers,
            mixer: Box::new(mixer),
            rope,
            mtp,
        })
    }

    pub fn config(&self) -> &Qwen4ExpConfig {
        &self.cfg
    }

    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    fn embed(&self, tokens: &[u32]) -> Result<Tensor> {
        for &t in tokens {
            if t as usize >= self.cfg.vocab_size {
                return Err(EngineError::TokenOutOfRange {
                    token: t,
                    vocab: self.cfg.vocab_size,
                });
            }
        }
        let ids = Tensor::from_vec(tokens.to_vec(), tokens.len(), &Device::Cpu)?;
        Ok(self.embed.index_select(&ids, 0)?)
    }

    /// Final mixer + head over `streams: [T, C·H]`, for the rows asked.
    fn head(
        &self,
        streams: &Tensor,
        mixer: &GatedResidual,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        let t = streams.dim(0)?;
        let s = match rows {
            LogitsRows::All => streams.clone(),
            LogitsRows::Last => streams.narrow(0, t - 1, 1)?,
        };
        let (x, _) = mixer.mix(&s)?;
        let logits = self.lm_head.forward(&x)?;
        let (rows, vocab) = logits.dims2()?;
        Ok(ForwardOutput {
            logits: to_vec(&logits)?,
            rows,
            vocab,
        })
    }

    /// A trunk forward of `tokens` after everything `state` covers, with
    /// the last layer's streams and optional per-layer traces.
    ///
    /// Out-of-vocabulary tokens and context overflow are refused before the
    /// state changes; any later (tensor) error leaves the state partially
    /// advanced, so callers restore a snapshot.
    pub fn forward_ext(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState,
        rows: LogitsRows,
        trace: bool,
    ) -> Result<TrunkOutput> {
        self.run(tokens, state, rows, trace, false)
    }

    /// A verify window: like [`Self::forward_ext`] with all logits rows, and
    /// a record of the window (recurrent state before it, the GDN scan
    /// inputs, PLE windows per row), so that [`Qwen4ExpState::commit`] can
    /// keep any prefix of the window.
    pub fn forward_window(&self, tokens: &[u32], state: &mut Qwen4ExpState) -> Result<TrunkOutput> {
        self.run(tokens, state, LogitsRows::All, false, true)
    }

    fn run(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState,
        rows: LogitsRows,
        trace: bool,
        capture: bool,
    ) -> Result<TrunkOutput> {
        if tokens.is_empty() {
            return Err(EngineError::State(
                "forward needs at least one token".into(),
            ));
        }
        let base = state.positions.len();
        let needed = base + tokens.len();
        if needed > self.cfg.context_length {
            return Err(EngineError::ContextOverflow {
                needed,
                limit: self.cfg.context_length,
            });
        }
        let x = self.embed(tokens)?;
        // Text positions: t = h = w = index. (Image/video tokens would carry
        // their own (t, h, w) here.)
        state
            .positions
            .extend((base..needed).map(|p| [p as u32; 3]));
        let mut caps: Vec<LayerCapture> = Vec::new();
        let mut xs = Tensor::cat(&vec![&x; self.cfg.hc_count], D::Minus1)?;
        let mut traces = Vec::new();
        for (layer, cache) in self.layers.iter().zip(state.layers.iter_mut()) {
            let mut cap = LayerCapture::default();
            let is_linear = matches!(cache, LayerCache::Linear { .. });
            let (out, tr) = layer.forward(
                &xs,
                tokens,
                cache,
                &state.positions,
                &self.rope,
                (capture && is_linear).then_some(&mut cap),
                trace,
            )?;
            xs = out;
            if capture && is_linear {
                caps.push(cap);
            }
            traces.extend(tr);
        }
        let logits = self.head(&xs, &self.mixer, rows)?;
        let capture = if capture {
            let layers = caps
                .into_iter()
                .map(|c| {
                    let gdn = c.gdn.ok_or_else(|| {
                        EngineError::State("a linear layer recorded no window replay".into())
                    })?;
                    Ok(LinearCapture {
                        gdn,
                        ple_before: c.ple_before,
                        ple_rows: c.ple,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Some(WindowCapture {
                base,
                rows: tokens.len(),
                layers,
            })
        } else {
            None
        };
        Ok(TrunkOutput {
            logits,
            streams: xs,
            capture,
            trace: traces,
        })
    }

    /// A fresh MTP state, when the checkpoint has an MTP head.
    pub fn new_mtp_state(&self) -> Option<MtpState> {
        let mtp = self.mtp.as_ref()?;
        Some(MtpState {
            cache: mtp.layer.new_cache(),
            positions: Vec::new(),
            kv_width: self.cfg.num_kv_heads * self.cfg.head_dim,
            idx_dim: self.cfg.indexer_head_dim,
            ratio: self.cfg.indexer_compress_ratio,
        })
    }

    /// MTP rows: `tokens[i]` with `streams[i]` (`[n, C·H]`, trunk pre-mixer
    /// streams or a previous depth's output) at RoPE position
    /// `positions[i]`, appended to `state`.
    pub fn mtp_forward(
        &self,
        tokens: &[u32],
        streams: &Tensor,
        positions: &[u32],
        state: &mut MtpState,
        rows: LogitsRows,
    ) -> Result<MtpOutput> {
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            EngineError::Unsupported("this qwen4_exp checkpoint has no mtp.* weights".into())
        })?;
        let n = tokens.len();
        let (c, h) = (self.cfg.hc_count, self.cfg.hidden_size);
        if n == 0 || streams.dims() != [n, c * h] || positions.len() != n {
            return Err(EngineError::State(format!(
                "MTP rows: {n} tokens, {} positions, streams {:?} (expected [{n}, {}])",
                positions.len(),
                streams.dims(),
                c * h
            )));
        }
        let e = mtp
            .fc_e
            .forward(&mtp.pre_e.forward(&self.embed(tokens)?)?)?;
        let hn = mtp.pre_h.forward(streams)?.reshape((n * c, h))?;
        let x0 = mtp
            .fc_h
            .forward(&hn)?
            .reshape((n, c, h))?
            .broadcast_add(&e.unsqueeze(1)?)?
            .reshape((n, c * h))?;
        state.positions.extend(positions.iter().map(|&p| [p; 3]));
        let (x1, _) = mtp.layer.forward(
            &x0,
            tokens,
            &mut state.cache,
            &state.positions,
            &self.rope,
            None,
            false,
        )?;
        let logits = self.head(&x1, &mtp.mixer, rows)?;
        Ok(MtpOutput {
            logits,
            streams: x1,
        })
    }
}

impl Model for Qwen4ExpModel {
    type State = Qwen4ExpState;
    type MtpHistory = MtpState;

    fn descriptor(&self) -> &'static FamilyDescriptor {
        &super::DESCRIPTOR
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn context_length(&self) -> usize {
        self.cfg.context_length
    }

    fn new_state(&self) -> Qwen4ExpState {
        Qwen4ExpState {
            layers: self.layers.iter().map(|l| l.new_cache()).collect(),
            positions: Vec::new(),
            kv_width: self.cfg.num_kv_heads * self.cfg.head_dim,
            idx_dim: self.cfg.indexer_head_dim,
            ratio: self.cfg.indexer_compress_ratio,
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self.run(tokens, state, rows, false, false)?.logits)
    }

    // The speculative contract delegates to the family's own API (see the
    // module docs for the MTP contract).

    fn mtp_contract(&self) -> Option<MtpContract> {
        self.has_mtp().then_some(MtpContract {
            default_depth: MTP_DEFAULT_DEPTH,
            max_depth: MTP_MAX_DEPTH,
            hidden: "pre-mixer streams of the last decoder layer [C*H], before the final hyper-connection mixer",
        })
    }

    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, Hidden)> {
        let out = self.forward_ext(tokens, state, rows, false)?;
        Ok((out.logits, out.streams))
    }

    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState,
    ) -> Result<VerifyWindow<WindowCapture>> {
        let out = Qwen4ExpModel::forward_window(self, tokens, state)?;
        let capture = out
            .capture
            .ok_or_else(|| EngineError::State("a verify window recorded no capture".into()))?;
        Ok(VerifyWindow {
            logits: out.logits,
            hidden: out.streams,
            record: capture,
        })
    }

    fn new_mtp_history(&self) -> Option<MtpState> {
        self.new_mtp_state()
    }

    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &Hidden,
        state: &mut MtpState,
    ) -> Result<MtpStep> {
        let base = state.len() as u32;
        let positions: Vec<u32> = (base..base + tokens.len() as u32).collect();
        let out =
            Qwen4ExpModel::mtp_forward(self, tokens, hidden, &positions, state, LogitsRows::Last)?;
        let n = out.streams.dim(0)?;
        Ok(MtpStep {
            logits: out.logits.last_row().to_vec(),
            hidden: out.streams.narrow(0, n - 1, 1)?,
        })
    }
}

/// Draft depth when a request leaves it unset.
pub const MTP_DEFAULT_DEPTH: usize = 2;
/// Deepest chain: verify windows of up to 8 rows. (Any window size gives
/// each row the bits of a single-row forward: the kernels are
/// row-independent.)
pub const MTP_MAX_DEPTH: usize = 7;
