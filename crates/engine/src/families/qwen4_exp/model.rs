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

use super::config::{LayerKind, ParsedConfig, Qwen4ExpConfig};
use super::gated_attention::GatedAttention;
use super::gated_deltanet::GatedDeltaNet;
use super::moe::{Moe, Routing};
use super::ple::Ple;
use super::state::{
    AttnCache, LayerCache, LinearCapture, MtpState, PleCache, Qwen4ExpState, WindowCapture,
};
use crate::backend::PURE_MAX_ROWS;
use crate::backend::{Backend, CpuOps};
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::layers::delta_rule::DeltaReplay;
use crate::layers::hyper_connections::{GatedResidual, Streams};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::ZcNorm;
use crate::layers::rope::{MRope, Positions};
use crate::load::binder::{Binder, WeightSource};
use crate::load::checkpoint::HfCheckpoint;
use crate::model::{
    DeviceRows, ForwardOutput, LogitsRows, MediaChunk, Model, MtpContract, MtpStep, VerifyWindow,
};

/// Which pure unit of a layer a key names.
const UNIT_MOE: u64 = 1;
/// The layer index of the MTP head's layer in unit keys.
pub(super) const MTP_LAYER: u64 = u64::MAX;

#[derive(Debug)]
pub(super) enum Mixer<B: Backend> {
    Gdn(GatedDeltaNet<B>),
    Attn(GatedAttention<B>),
}

#[derive(Debug)]
pub struct DecoderLayer<B: Backend> {
    pub(super) ple: Option<Ple<B>>,
    pub(super) mixer: Mixer<B>,
    moe: Moe<B>,
    pub(super) attn_hc: GatedResidual<B>,
    mlp_hc: GatedResidual<B>,
}

/// What one layer did, for tests and `debug` tooling (read back to the
/// host only when a trace is asked for).
#[derive(Debug, Clone)]
pub struct LayerTrace {
    /// Output streams `[T, C·H]`.
    pub streams: Vec<f32>,
    /// Kept token indices per new query (attention layers).
    pub qsa: Option<Vec<Vec<u32>>>,
    pub routing: Routing,
}

/// Window record of one linear layer while it runs.
pub(super) struct LayerCapture<B: Backend> {
    pub(super) gdn: Option<DeltaReplay<B>>,
    pub(super) ple_before: Option<PleCache<B>>,
    pub(super) ple: Vec<PleCache<B>>,
}

impl<B: Backend> LayerCapture<B> {
    /// A verify window's record from its linear layers' captures.
    pub(super) fn window(base: usize, rows: usize, caps: Vec<Self>) -> Result<WindowCapture<B>> {
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
        Ok(WindowCapture { base, rows, layers })
    }
}

impl<B: Backend> Default for LayerCapture<B> {
    fn default() -> Self {
        Self {
            gdn: None,
            ple_before: None,
            ple: Vec::new(),
        }
    }
}

impl<B: Backend> DecoderLayer<B> {
    fn load(
        w: &mut Binder<'_, B>,
        config_path: &Path,
        cfg: &Qwen4ExpConfig,
        kind: LayerKind,
        pli: Option<usize>,
    ) -> Result<Self> {
        let (h, c, eps) = (cfg.hidden_size, cfg.hc_count, cfg.rms_norm_eps);
        let ple = match pli {
            Some(i) => Some(Ple::load(&mut w.pp("ple"), config_path, cfg, i)?),
            None => None,
        };
        let mixer = match kind {
            LayerKind::Linear => Mixer::Gdn(GatedDeltaNet::load(cfg, &mut w.pp("linear_attn"))?),
            LayerKind::Indexed => Mixer::Attn(GatedAttention::load(cfg, &mut w.pp("self_attn"))?),
        };
        Ok(Self {
            ple,
            mixer,
            moe: Moe::load(cfg, &mut w.pp("mlp"))?,
            attn_hc: GatedResidual::load(
                &mut w.pp("attn_hyper_connection"),
                c,
                h,
                cfg.hc_lowrank,
                eps,
                true,
            )?,
            mlp_hc: GatedResidual::load(
                &mut w.pp("mlp_hyper_connection"),
                c,
                h,
                cfg.hc_lowrank,
                eps,
                true,
            )?,
        })
    }

    fn new_cache(&self, ops: &B) -> Result<LayerCache<B>> {
        Ok(match &self.mixer {
            Mixer::Gdn(g) => LayerCache::Linear {
                gdn: g.new_cache(ops)?,
                ple: self.ple.as_ref().map(|p| p.new_cache(ops)).transpose()?,
            },
            Mixer::Attn(a) => LayerCache::Attn(a.new_cache(ops)?),
        })
    }

    fn attn_cache(&self, ops: &B) -> Result<AttnCache<B>> {
        match &self.mixer {
            Mixer::Attn(a) => a.new_cache(ops),
            Mixer::Gdn(_) => Err(EngineError::State(
                "the MTP head's layer is not an attention layer".into(),
            )),
        }
    }

    /// Streams `[T, C·H]` → `[T, C·H]`, in and out with their last
    /// write-back pending ([`Streams`]), so each seam's inject runs with the
    /// next norm. `unit` names this layer in its model (the key of its pure
    /// units, [`Backend::run_pure`]).
    #[allow(clippy::too_many_arguments)]
    fn forward<'m>(
        &'m self,
        ops: &B,
        input: Streams<'_, B>,
        tokens: &[u32],
        cache: &mut LayerCache<B>,
        pos: &Positions<'_, B, MRope>,
        mut capture: Option<&mut LayerCapture<B>>,
        trace: bool,
        unit: [u64; 2],
    ) -> Result<(Streams<'m, B>, Option<LayerTrace>)> {
        let rows = tokens.len();
        let mut qsa = None;
        // The mixer half: the streams, its output `y` and the streams'
        // write weights.
        let (xs, y, inj) = match (&self.mixer, cache) {
            (Mixer::Gdn(gdn), LayerCache::Linear { gdn: gc, ple: pc }) => {
                if let Some(cap) = capture.as_deref_mut() {
                    cap.ple_before = pc.clone();
                }
                let mut input = input;
                if let (Some(ple), Some(pc)) = (&self.ple, pc.as_mut()) {
                    let xs = input.into_buf(ops)?;
                    let add = ple.forward(
                        ops,
                        &xs,
                        tokens,
                        pc,
                        capture.as_deref_mut().map(|c| &mut c.ple),
                    )?;
                    input = Streams::ready(ops.add(&xs, &add)?);
                }
                let (xs, x, inj) = input.mix(ops, &self.attn_hc, rows)?;
                let y = gdn.forward(ops, &x, rows, gc, capture.map(|c| &mut c.gdn))?;
                (xs, y, inj)
            }
            (Mixer::Attn(attn), LayerCache::Attn(ac)) => {
                let (xs, x, inj) = input.mix(ops, &self.attn_hc, rows)?;
                let (y, sel) = attn.forward(ops, &x, rows, ac, pos)?;
                qsa = Some(sel);
                (xs, y, inj)
            }
            _ => {
                return Err(EngineError::State(
                    "layer cache does not match the layer kind".into(),
                ));
            }
        };
        let inj = inj.ok_or_else(|| {
            EngineError::State("the mixer's hyper-connection does not combine".into())
        })?;
        self.moe_half(ops, xs, y, inj, rows, qsa, trace, unit)
    }

    /// The layer's MoE half after its mixer half (`xs` the streams, `y` the
    /// mixer's output, `inj` the streams' write weights), over `rows` rows
    /// (one session's, or a batch's: it reads nothing else); `qsa` is the
    /// mixer's selection for a trace.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_half<'m>(
        &'m self,
        ops: &B,
        xs: B::Buf,
        y: B::Buf,
        inj: B::Buf,
        rows: usize,
        qsa: Option<B::Selection>,
        trace: bool,
        unit: [u64; 2],
    ) -> Result<(Streams<'m, B>, Option<LayerTrace>)> {
        // The MoE half reads nothing but the mixer half's streams, output
        // and write weights (its combine and the MoE mix's norm are one op,
        // `combine_mix`) and the weights, and leaves its own write-back
        // pending: a pure unit (one replayed graph on a device for a decode
        // step or verify window), except when a trace wants its routing.
        type Half<B> = (
            <B as Backend>::Buf,
            <B as Backend>::Buf,
            <B as Backend>::Buf,
            <B as Backend>::Routing,
        );
        let mlp = |ops: &B, xs: &B::Buf, y: &B::Buf, inj: &B::Buf| -> Result<Half<B>> {
            let (xs, x, inj) = self
                .attn_hc
                .combine_mix(ops, xs, y, inj, &self.mlp_hc, rows)?;
            let (y, routing) = self.moe.forward(ops, &x, rows)?;
            let inj = inj.ok_or_else(|| {
                EngineError::State("the MoE hyper-connection does not combine".into())
            })?;
            Ok((xs, y, inj, routing))
        };
        if trace || rows > PURE_MAX_ROWS {
            let (xs, y, inj, routing) = mlp(ops, &xs, &y, &inj)?;
            let out = Streams::pending(&self.mlp_hc, xs, y, inj);
            if !trace {
                return Ok((out, None));
            }
            let xs = out.into_buf(ops)?;
            let (experts, weights) = ops.routing_to_host(&routing)?;
            let tr = LayerTrace {
                streams: ops.download(&xs)?,
                qsa: qsa.map(|s| ops.selection_to_host(&s)).transpose()?,
                routing: Routing { experts, weights },
            };
            return Ok((Streams::ready(xs), Some(tr)));
        }
        let key = [unit[0], unit[1], UNIT_MOE, rows as u64];
        let mut body = |inp: &[&B::Buf]| {
            let (xs, y, inj, _) = mlp(ops, inp[0], inp[1], inp[2])?;
            Ok(vec![xs, y, inj])
        };
        let outs = ops.run_pure(&key, &[&xs, &y, &inj], &mut body)?;
        let [xs, y, inj]: [B::Buf; 3] = outs
            .try_into()
            .map_err(|_| EngineError::State("the MoE unit returned other than three".into()))?;
        Ok((Streams::pending(&self.mlp_hc, xs, y, inj), None))
    }
}

/// The MTP head (see the module docs for its contract).
#[derive(Debug)]
pub struct MtpHead<B: Backend> {
    pub(super) pre_e: ZcNorm<B>,
    pub(super) pre_h: ZcNorm<B>,
    pub(super) fc_e: Linear<B>,
    pub(super) fc_h: Linear<B>,
    pub(super) layer: DecoderLayer<B>,
    pub(super) mixer: GatedResidual<B>,
}

/// A trunk forward with everything the decode loops and tests may need.
#[derive(Debug)]
pub struct TrunkOutput<B: Backend = CpuOps> {
    pub logits: ForwardOutput,
    /// Pre-mixer streams of the last decoder layer, `[T, C·H]` (what feeds
    /// the MTP head), on the device.
    pub streams: B::Buf,
    /// The window record (only from [`Qwen4ExpModel::forward_window`]).
    pub capture: Option<WindowCapture<B>>,
    /// Per-layer traces (only when asked).
    pub trace: Vec<LayerTrace>,
}

/// An MTP call's logits and pre-mixer streams `[n, C·H]` (the next depth's
/// input).
#[derive(Debug)]
pub struct MtpOutput<B: Backend = CpuOps> {
    pub logits: ForwardOutput,
    pub streams: B::Buf,
}

// Large parts are boxed so that `LoadedModel` stays small.
pub struct Qwen4ExpModel<B: Backend = CpuOps> {
    pub(super) ops: B,
    pub(super) cfg: Box<Qwen4ExpConfig>,
    /// `[V, H]`.
    embed: B::Table,
    pub(super) lm_head: Linear<B>,
    pub(super) layers: Vec<DecoderLayer<B>>,
    pub(super) mixer: Box<GatedResidual<B>>,
    pub(super) rope: MRope,
    pub(super) mtp: Option<Box<MtpHead<B>>>,
    /// This model's identity in pure-unit keys ([`crate::backend::pure_scope`]).
    pub(super) scope: u64,
}

impl Qwen4ExpModel<CpuOps> {
    /// Load a Hugging Face directory on the CPU (see [`Self::load`]).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        Self::load(dir, CpuOps)
    }
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// Load a Hugging Face directory (`qwen4_exp_text` or the VL
    /// `qwen4_exp`; f32, bf16 or f16 weights, computed in f32) onto `ops`.
    /// `mtp.*` weights are bound when present; `model.visual.*` is ignored.
    ///
    /// `dir` may also be a GGUF file in the same names with the
    /// configuration embedded ([`HfCheckpoint`]).
    pub fn load(dir: &Path, ops: B) -> Result<Self> {
        let mut st = HfCheckpoint::open(dir)?;
        let config_path = st.config_path();
        let parsed = Qwen4ExpConfig::from_hf(&config_path, st.config())?;
        // The vision tower is not part of the text model.
        st.ignore_prefix("model.visual.");
        let model = Self::load_from(st.source(), &config_path, parsed, ops)?;
        st.finish(&[])?;
        Ok(model)
    }

    /// Bind a parsed configuration's weights from any source (a checkpoint
    /// directory, or [`crate::load::synthetic::SyntheticSource`]).
    pub fn load_from(
        st: &mut dyn WeightSource,
        config_path: &Path,
        parsed: ParsedConfig,
        ops: B,
    ) -> Result<Self> {
        let config_path = config_path.to_path_buf();
        let (cfg, p) = (parsed.config, parsed.prefix);
        let (h, c, eps) = (cfg.hidden_size, cfg.hc_count, cfg.rms_norm_eps);
        let has_mtp = st.has("mtp.fc_embedding.weight");
        let (embed, lm_head, layers, mixer, mtp) = {
            let mut root = Binder::new(st, &ops);
            let mut w = root.pp(p.trim_end_matches('.'));
            let embed_w = w.raw("embed_tokens.weight", &[cfg.vocab_size, h])?;
            let embed = w.ops().table(embed_w.clone(), cfg.vocab_size, h)?;
            let layers = (0..cfg.num_layers)
                .map(|l| {
                    DecoderLayer::load(
                        &mut w.pp(&format!("layers.{l}")),
                        &config_path,
                        &cfg,
                        cfg.layer_kinds[l],
                        cfg.ple_index(l),
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let mixer = GatedResidual::load(
                &mut w.pp("hyper_connection_mixer"),
                c,
                h,
                cfg.hc_lowrank,
                eps,
                false,
            )?;
            let lm_head = if cfg.tie_word_embeddings {
                root.linear_from(embed_w, cfg.vocab_size, h)?
            } else {
                root.linear("lm_head", cfg.vocab_size, h)?
            };
            let mtp = if has_mtp {
                // The head's layer is a QSA layer even when the trunk has
                // none, so the indexer geometry must hold for it too.
                if cfg.rotary_dim > cfg.indexer_head_dim {
                    return Err(EngineError::Config {
                        path: config_path.clone(),
                        field: "indexer_head_dim".into(),
                        message: format!(
                            "the MTP head's QSA layer needs indexer_head_dim >= rotary dim {}",
                            cfg.rotary_dim
                        ),
                    });
                }
                let mut m = root.pp("mtp");
                // The MTP layer is a QSA decoder layer without PLE.
                Some(Box::new(MtpHead {
                    pre_e: ZcNorm::load(&mut m, "pre_fc_norm_embedding.weight", h, h, eps)?,
                    pre_h: ZcNorm::load(&mut m, "pre_fc_norm_hidden.weight", c * h, c * h, eps)?,
                    fc_e: m.linear("fc_embedding", h, h)?,
                    fc_h: m.linear("fc_hidden", h, h)?,
                    layer: DecoderLayer::load(
                        &mut m.pp("layers.0"),
                        &config_path,
                        &cfg,
                        LayerKind::Indexed,
                        None,
                    )?,
                    mixer: GatedResidual::load(
                        &mut m.pp("hyper_connection_mixer"),
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
            (embed, lm_head, layers, mixer, mtp)
        };
        let rope = MRope::new(cfg.rope_theta, cfg.rotary_dim, cfg.mrope_section);
        Ok(Self {
            ops,
            cfg: Box::new(cfg),
            embed,
            lm_head,
            layers,
            mixer: Box::new(mixer),
            rope,
            mtp,
            scope: crate::backend::pure_scope(),
        })
    }

    pub fn config(&self) -> &Qwen4ExpConfig {
        &self.cfg
    }

    pub fn ops(&self) -> &B {
        &self.ops
    }

    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    pub(super) fn embed(&self, tokens: &[u32]) -> Result<B::Buf> {
        crate::layers::embedding::embed_tokens(&self.ops, &self.embed, tokens, self.cfg.vocab_size)
    }

    /// Final mixer + head over `streams: [T, C·H]`, for the rows asked.
    /// Returns the logits and `X'` (the streams with their write-back
    /// applied); the last write-back and the mixer's norm are one op.
    fn head(
        &self,
        streams: Streams<'_, B>,
        t: usize,
        mixer: &GatedResidual<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, B::Buf)> {
        let ops = &self.ops;
        let ch = self.cfg.hc_count * self.cfg.hidden_size;
        let [xs, normed] = streams.normed(ops, mixer)?;
        let (s, n) = match rows {
            LogitsRows::All => (normed, t),
            LogitsRows::Last => (ops.rows(&normed, ch, t - 1, 1)?, 1),
        };
        let (x, _) = mixer.mix_normed(ops, &s, n)?;
        let logits = self.lm_head.forward(ops, &x, n)?;
        let out = ForwardOutput {
            logits: ops.download(&logits)?,
            rows: n,
            vocab: self.cfg.vocab_size,
        };
        Ok((out, xs))
    }

    /// A trunk forward of `tokens` after everything `state` covers, with
    /// the last layer's streams and optional per-layer traces.
    ///
    /// Out-of-vocabulary tokens and context overflow are refused before the
    /// state changes; any later error leaves the state partially advanced,
    /// so callers restore a snapshot.
    pub fn forward_ext(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
        trace: bool,
    ) -> Result<TrunkOutput<B>> {
        self.run(tokens, &MediaChunk::default(), state, rows, trace, false)
    }

    /// A verify window: like [`Self::forward_ext`] with all logits rows, and
    /// a record of the window (recurrent state before it, the GDN scan
    /// inputs, PLE windows per row), so that [`Qwen4ExpState::commit`] can
    /// keep any prefix of the window.
    pub fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState<B>,
    ) -> Result<TrunkOutput<B>> {
        self.run(
            tokens,
            &MediaChunk::default(),
            state,
            LogitsRows::All,
            false,
            true,
        )
    }

    /// A trunk forward with image rows and M-RoPE positions
    /// ([`MediaChunk`]); see [`Self::forward_ext`].
    pub fn forward_media_ext(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
        trace: bool,
    ) -> Result<TrunkOutput<B>> {
        self.run(tokens, media, state, rows, trace, false)
    }

    /// The token embeddings with `media`'s rows in place of theirs.
    fn embed_media(&self, tokens: &[u32], media: &MediaChunk<'_>) -> Result<B::Buf> {
        let x = self.embed(tokens)?;
        if media.spans.is_empty() {
            return Ok(x);
        }
        let (ops, h) = (&self.ops, self.cfg.hidden_size);
        let mut out = ops.zeros(0)?;
        let mut at = 0;
        for &(first, rows) in media.spans {
            let n = rows.len() / h;
            if first < at || !rows.len().is_multiple_of(h) || n == 0 || first + n > tokens.len() {
                return Err(EngineError::State(format!(
                    "media rows at token {first}: {} values ({h} per row) do not fit a {}-token chunk after token {at}",
                    rows.len(),
                    tokens.len()
                )));
            }
            if first > at {
                ops.append(&mut out, &ops.rows(&x, h, at, first - at)?)?;
            }
            ops.append(&mut out, &ops.upload(rows)?)?;
            at = first + n;
        }
        if at < tokens.len() {
            ops.append(&mut out, &ops.rows(&x, h, at, tokens.len() - at)?)?;
        }
        Ok(out)
    }

    fn run(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
        trace: bool,
        capture: bool,
    ) -> Result<TrunkOutput<B>> {
        let ops = &self.ops;
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
        if !media.positions.is_empty() && media.positions.len() != tokens.len() {
            return Err(EngineError::State(format!(
                "{} M-RoPE positions for {} tokens",
                media.positions.len(),
                tokens.len()
            )));
        }
        let x = self.embed_media(tokens, media)?;
        if media.positions.is_empty() {
            // Text positions continue after the largest so far on all three
            // axes (transformers' `rope_deltas`): the token index when
            // there was no image.
            let next = state.next_text_position();
            state
                .positions
                .extend((0..tokens.len() as u32).map(|i| [next + i; 3]));
        } else {
            state.positions.extend_from_slice(media.positions);
        }
        let rope_rows = self.rope.tables(ops, &state.positions[base..])?;
        let pos = Positions {
            all: &state.positions,
            rope: &self.rope,
            rows: &rope_rows,
        };
        let mut caps: Vec<LayerCapture<B>> = Vec::new();
        let mut xs =
            Streams::ready(ops.tile_streams(&x, self.cfg.hc_count, self.cfg.hidden_size)?);
        let mut traces = Vec::new();
        for (i, (layer, cache)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            let mut cap = LayerCapture::default();
            let is_linear = matches!(cache, LayerCache::Linear { .. });
            let (out, tr) = layer.forward(
                ops,
                xs,
                tokens,
                cache,
                &pos,
                (capture && is_linear).then_some(&mut cap),
                trace,
                [self.scope, i as u64],
            )?;
            xs = out;
            if capture && is_linear {
                caps.push(cap);
            }
            traces.extend(tr);
        }
        let (logits, xs) = self.head(xs, tokens.len(), &self.mixer, rows)?;
        let capture = if capture {
            Some(LayerCapture::window(base, tokens.len(), caps)?)
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
    pub fn new_mtp_state(&self) -> Option<MtpState<B>> {
        let mtp = self.mtp.as_ref()?;
        let cache = mtp
            .layer
            .attn_cache(&self.ops)
            .expect("the MTP layer is a QSA layer and a fresh cache allocates");
        Some(MtpState::new(&self.ops, LayerCache::Attn(cache)))
    }

    /// MTP rows: `tokens[i]` with `streams[i]` (`[n, C·H]`, trunk pre-mixer
    /// streams or a previous depth's output) at RoPE position
    /// `positions[i]`, appended to `state`.
    pub fn mtp_forward(
        &self,
        tokens: &[u32],
        streams: &B::Buf,
        positions: &[u32],
        state: &mut MtpState<B>,
        rows: LogitsRows,
    ) -> Result<MtpOutput<B>> {
        let ops = &self.ops;
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            EngineError::Unsupported("this qwen4_exp checkpoint has no mtp.* weights".into())
        })?;
        let n = tokens.len();
        let (c, h) = (self.cfg.hc_count, self.cfg.hidden_size);
        if n == 0 || ops.len(streams) != n * c * h || positions.len() != n {
            return Err(EngineError::State(format!(
                "MTP rows: {n} tokens, {} positions, {} stream values (expected [{n}, {}])",
                positions.len(),
                ops.len(streams),
                c * h
            )));
        }
        let e = mtp
            .fc_e
            .forward(ops, &mtp.pre_e.forward(ops, &self.embed(tokens)?)?, n)?;
        let hn = mtp.pre_h.forward(ops, streams)?;
        // fc_hidden maps each stream (rows of H) separately; then every
        // stream gets the token's embedding term.
        let fh = mtp.fc_h.forward(ops, &hn, n * c)?;
        let x0 = ops.add(&fh, &ops.tile_streams(&e, c, h)?)?;
        let base = state.positions.len();
        state.positions.extend(positions.iter().map(|&p| [p; 3]));
        let rope_rows = self.rope.tables(ops, &state.positions[base..])?;
        let pos = Positions {
            all: &state.positions,
            rope: &self.rope,
            rows: &rope_rows,
        };
        let (x1, _) = mtp.layer.forward(
            ops,
            Streams::ready(x0),
            tokens,
            &mut state.cache,
            &pos,
            None,
            false,
            [self.scope, MTP_LAYER],
        )?;
        let (logits, x1) = self.head(x1, n, &mtp.mixer, rows)?;
        Ok(MtpOutput {
            logits,
            streams: x1,
        })
    }
}

impl<B: Backend> Model for Qwen4ExpModel<B> {
    type State = Qwen4ExpState<B>;
    type MtpHistory = MtpState<B>;
    type Hidden = DeviceRows<B>;

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

    fn new_state(&self) -> Qwen4ExpState<B> {
        Qwen4ExpState {
            ops: self.ops.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| l.new_cache(&self.ops))
                .collect::<Result<Vec<_>>>()
                .expect("allocating a fresh state's caches"),
            positions: Vec::new(),
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self
            .run(tokens, &MediaChunk::default(), state, rows, false, false)?
            .logits)
    }

    /// Every session's rows through each layer together, each on its own
    /// caches (`batch.rs`).
    fn forward_batch(
        &self,
        calls: &mut [crate::model::BatchCall<'_, Qwen4ExpState<B>>],
    ) -> Vec<Result<crate::model::BatchResult<Self>>> {
        self.run_batch(calls)
    }

    fn forward_media(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self.run(tokens, media, state, rows, false, false)?.logits)
    }

    // The speculative contract delegates to the family's own API (see the
    // module docs for the MTP contract).

    fn mtp_contract(&self) -> Option<MtpContract> {
        self.has_mtp().then_some(MtpContract {
            default_depth: MTP_DEFAULT_DEPTH,
            max_depth: MTP_MAX_DEPTH,
            hidden: "pre-mixer streams of the last decoder layer [C*H], before the final hyper-connection mixer",
            min_draft_confidence: None,
        })
    }

    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, DeviceRows<B>)> {
        let out = self.forward_ext(tokens, state, rows, false)?;
        Ok((out.logits, self.hidden(out.streams, tokens.len())?))
    }

    fn forward_hidden_media(
        &self,
        tokens: &[u32],
        media: &MediaChunk<'_>,
        state: &mut Qwen4ExpState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, DeviceRows<B>)> {
        let out = self.run(tokens, media, state, rows, false, false)?;
        Ok((out.logits, self.hidden(out.streams, tokens.len())?))
    }

    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut Qwen4ExpState<B>,
    ) -> Result<VerifyWindow<WindowCapture<B>, DeviceRows<B>>> {
        let out = Qwen4ExpModel::forward_window(self, tokens, state)?;
        let capture = out
            .capture
            .ok_or_else(|| EngineError::State("a verify window recorded no capture".into()))?;
        Ok(VerifyWindow {
            logits: out.logits,
            hidden: self.hidden(out.streams, tokens.len())?,
            record: capture,
        })
    }

    fn hidden_from_host(&self, rows: usize, width: usize, data: Vec<f32>) -> Result<DeviceRows<B>> {
        let ch = self.cfg.hc_count * self.cfg.hidden_size;
        if width != ch {
            return Err(EngineError::State(format!(
                "qwen4_exp hidden rows are {ch} wide, not {width}"
            )));
        }
        DeviceRows::new(&self.ops, self.ops.upload(&data)?, rows, width)
    }

    fn new_mtp_history(&self) -> Option<MtpState<B>> {
        self.new_mtp_state()
    }

    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &DeviceRows<B>,
        state: &mut MtpState<B>,
    ) -> Result<MtpStep<DeviceRows<B>>> {
        let base = state.len() as u32;
        let positions: Vec<u32> = (base..base + tokens.len() as u32).collect();
        let out = Qwen4ExpModel::mtp_forward(
            self,
            tokens,
            hidden.buf(),
            &positions,
            state,
            LogitsRows::Last,
        )?;
        let n = tokens.len();
        let ch = self.cfg.hc_count * self.cfg.hidden_size;
        let last = self.ops.rows(&out.streams, ch, n - 1, 1)?;
        Ok(MtpStep {
            logits: out.logits.last_row().to_vec(),
            hidden: self.hidden(last, 1)?,
        })
    }

    fn mtp_forward_batch(
        &self,
        calls: &mut [crate::model::MtpCall<'_, DeviceRows<B>, MtpState<B>>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        self.run_mtp_batch(calls)
    }
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// Streams `[rows, C·H]` as the contract's hidden rows (on the device).
    pub(super) fn hidden(&self, streams: B::Buf, rows: usize) -> Result<DeviceRows<B>> {
        let ch = self.cfg.hc_count * self.cfg.hidden_size;
        DeviceRows::new(&self.ops, streams, rows, ch)
    }
}

/// Draft depth when a request leaves it unset.
pub const MTP_DEFAULT_DEPTH: usize = 2;
/// Deepest chain: verify windows of up to 8 rows. (Any window size gives
/// each row the bits of a single-row forward: the kernels are
/// row-independent.)
pub const MTP_MAX_DEPTH: usize = 7;
