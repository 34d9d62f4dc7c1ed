//! The DeepSeek-V4 text model (trunk) and its MTP head, batch 1.
//!
//! ```text
//! X = tile(embed(ids), N)                                        [T, N·D]
//! for each layer:
//!   x, mix = mHC_attn(X);  X = post·attn(attn_norm(x)) + Cᵀ·X
//!   x, mix = mHC_ffn(X);   X = post·moe(ffn_norm(x), ids) + Cᵀ·X
//! logits = head( norm( hc_head(X) ) )          hc_head: σ-weighted sum of the streams
//! ```
//!
//! ## MTP contract
//!
//! The head (`mtp.0.*`; transformers does not build it — the layout is the
//! digest's Part D, from vLLM and ds4) runs in stream space. Row `i` of an
//! MTP call combines the token that follows trunk position `t` with the
//! trunk's **pre-`hc_head` streams at `t`** (`[N·D]`, the last decoder
//! layer's output), at position `t`:
//!
//! ```text
//! X0_s = h_proj·hnorm(Xtrunk_s) + e_proj·enorm(embed(tok))      per stream
//! X1   = one sliding-window decoder layer (learned top-k MoE), own window cache
//! logits = head( mtp.norm( mtp.hc_head(X1) ) )
//! ```
//!
//! A deeper draft feeds `X1` back as the trunk streams with the drafted
//! token at `t + 1`.

use std::path::Path;

use super::attention::{Attention, AttnCache, AttnRows, Ropes, Rotations};
use super::config::{AttnKind, DeepseekV4Config, MlpKind};
use super::moe::Moe;
use super::state::{DeepseekV4State, MtpState, WindowMark};
use crate::backend::PURE_MAX_ROWS;
use crate::backend::{Backend, CpuOps, RopeLayout};
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::layers::hyper_connections::{HyperConnection, Mhc};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::RmsNorm;
use crate::layers::rope::RopeFreqs;
use crate::layers::rope::RopeRows;
use crate::load::binder::{Binder, WeightSource};
use crate::load::safetensors::SafetensorsDir;
use crate::model::{
    DeviceRows, ForwardOutput, LogitsRows, Model, MtpContract, MtpStep, VerifyWindow,
};
use crate::state::mtp::MtpCache;

/// Which pure unit of a layer a key names (the numbers of stop 66's
/// units, which ended at the attention's projections' input and began at
/// its output, are not reused).
const UNIT_ATTN_ROWS: u64 = 3;
const UNIT_OUT_FFN: u64 = 4;
/// The layer index of the MTP head's layer in unit keys.
pub(super) const MTP_LAYER: u64 = u64::MAX;

#[derive(Debug)]
pub struct DecoderLayer<B: Backend> {
    pub(super) attn_norm: RmsNorm<B>,
    pub(super) ffn_norm: RmsNorm<B>,
    pub(super) attn_hc: Mhc<B>,
    pub(super) ffn_hc: Mhc<B>,
    pub(super) attn: Attention<B>,
    pub(super) moe: Moe<B>,
}

/// What one layer did (read back only when a trace is asked for).
#[derive(Debug, Clone)]
pub struct LayerTrace {
    /// Output streams `[T, N·D]`.
    pub streams: Vec<f32>,
    /// Entries kept per new query (CSA layers).
    pub selection: Option<Vec<Vec<u32>>>,
    /// Routed experts `[T·k]`.
    pub experts: Vec<usize>,
}

/// The final stream collapse: `pre = σ(hc_fn·rms(X)·scale + base) + eps`,
/// `x = Σ_s pre_s·X_s`.
#[derive(Debug)]
pub(super) struct HcHead<B: Backend> {
    proj: Linear<B>,
    /// `[(2+N)·N]`: `base` then zeros, and `[scale, 1, 1]`, so that
    /// [`Backend::hc_sinkhorn`]'s `pre` is the head's weights.
    base: B::Buf,
    scale: B::Buf,
    ones: B::Buf,
    n: usize,
    eps: f32,
    rms_eps: f32,
}

impl<B: Backend> HcHead<B> {
    fn load(w: &mut Binder<'_, B>, names: [&str; 3], cfg: &DeepseekV4Config) -> Result<Self> {
        let (n, d) = (cfg.hc_mult, cfg.hidden_size);
        let proj = w.raw(names[0], &[n, n * d])?;
        let mut base = w.host(names[1], &[n])?;
        base.resize((2 + n) * n, 0.0);
        let scale = w.host(names[2], &[1])?[0];
        let ops = w.ops().clone();
        Ok(Self {
            proj: w.linear_from(proj, n, n * d)?,
            base: ops.upload(&base)?,
            scale: ops.upload(&[scale, 1.0, 1.0])?,
            ones: ops.upload(&vec![1.0; n * d])?,
            n,
            eps: cfg.hc_eps,
            rms_eps: cfg.rms_norm_eps,
        })
    }

    fn forward(&self, ops: &B, xs: &B::Buf, rows: usize) -> Result<B::Buf> {
        let n = self.n;
        let z = self
            .proj
            .forward_rms(ops, xs, rows, &self.ones, self.rms_eps)?;
        let pad = ops.zeros(rows * (1 + n) * n)?;
        let z = ops.concat_cols(&[(&z, n), (&pad, (1 + n) * n)], rows)?;
        let mix = ops.hc_sinkhorn(&z, &self.base, &self.scale, n, 1, self.eps)?;
        ops.hc_pre(xs, &mix, n)
    }
}

impl<B: Backend> DecoderLayer<B> {
    fn load(
        w: &mut Binder<'_, B>,
        cfg: &DeepseekV4Config,
        attn: AttnKind,
        mlp: MlpKind,
    ) -> Result<Self> {
        let (h, n, eps) = (cfg.hidden_size, cfg.hc_mult, cfg.rms_norm_eps);
        let mhc = |w: &mut Binder<'_, B>, which: &str| -> Result<Mhc<B>> {
            let m = (2 + n) * n;
            let proj = w.raw(&format!("hc_{which}_fn"), &[m, n * h])?;
            let proj = w.linear_from(proj, m, n * h)?;
            let base = w.vector(&format!("hc_{which}_base"), &[m])?;
            let scale = w.vector(&format!("hc_{which}_scale"), &[3])?;
            Mhc::new(
                w.ops(),
                proj,
                base,
                scale,
                n,
                h,
                cfg.hc_sinkhorn_iters,
                cfg.hc_eps,
                eps,
            )
        };
        let attn_hc = mhc(w, "attn")?;
        let ffn_hc = mhc(w, "ffn")?;
        Ok(Self {
            attn_norm: RmsNorm::load(w, "attn_norm.weight", h, eps as f64)?,
            ffn_norm: RmsNorm::load(w, "ffn_norm.weight", h, eps as f64)?,
            attn_hc,
            ffn_hc,
            attn: Attention::load(&mut w.pp("attn"), cfg, attn)?,
            moe: Moe::load(&mut w.pp("ffn"), cfg, mlp)?,
        })
    }

    /// `xs: [T, N·D]` → `[T, N·D]`. `unit` names this layer in its model
    /// (the keys of its pure units, [`Backend::run_pure`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        ops: &B,
        xs: &B::Buf,
        tokens: &[u32],
        cache: &mut AttnCache<B>,
        rot: &Rotations<'_, B>,
        trace: bool,
        unit: [u64; 2],
    ) -> Result<(B::Buf, Option<LayerTrace>)> {
        let rows = tokens.len();
        if trace {
            let (x, mix) = self.attn_hc.mix(ops, xs, rows)?;
            let mix = mix.ok_or_else(|| EngineError::State("mHC gave no combine".into()))?;
            let (y, sel) =
                self.attn
                    .forward(ops, &self.attn_norm.forward(ops, &x)?, rows, cache, rot)?;
            let (xs, routing) = self.ffn_half_routed(ops, xs, &y, &mix, tokens)?;
            let tr = LayerTrace {
                streams: ops.download(&xs)?,
                selection: sel.map(|s| ops.selection_to_host(&s)).transpose()?,
                experts: ops.routing_to_host(&routing)?.0,
            };
            return Ok((xs, Some(tr)));
        }
        let [rotate, inverse] = self.attn.kind_tables(
            [&rot.main, &rot.main_inverse],
            [&rot.compress, &rot.compress_inverse],
        );
        let (normed, mix, projected) =
            self.attn_rows_in(ops, xs, rows, [rotate, &rot.compress], unit)?;
        let (o, _) = self
            .attn
            .attend_cached(ops, &normed, &projected, rows, cache, rot)?;
        drop((normed, projected));
        cache.trim(ops)?;
        let xs = self.out_and_ffn(ops, xs, o, &mix, inverse, tokens, unit)?;
        Ok((xs, None))
    }

    /// The attention's input and the row-wise half of its projections:
    /// `attn_norm(mix(xs))`, the mix's combine weights, and
    /// [`Attention::project_rows`] of the normed rows (`tables`: the
    /// rotation at this layer kind's frequencies and at the compressed
    /// ones, for the rows' positions). Pure (one replayed unit on a device,
    /// the tables among its inputs) up to [`PURE_MAX_ROWS`] rows: what is
    /// left eager between this unit and [`Self::out_and_ffn`] is the part
    /// that reads and writes the caches ([`Attention::attend_cached`]).
    pub(super) fn attn_rows_in(
        &self,
        ops: &B,
        xs: &B::Buf,
        rows: usize,
        [rotate, compress]: [&RopeRows<B>; 2],
        unit: [u64; 2],
    ) -> Result<(B::Buf, B::Buf, AttnRows<B>)> {
        let body = |ops: &B, xs: &B::Buf, tables: [&RopeRows<B>; 2]| {
            let (x, mix) = self.attn_hc.mix(ops, xs, rows)?;
            let mix = mix.ok_or_else(|| EngineError::State("mHC gave no combine".into()))?;
            let normed = self.attn_norm.forward(ops, &x)?;
            let projected = self.attn.project_rows(ops, &normed, rows, tables)?;
            Ok::<_, EngineError>((normed, mix, projected))
        };
        if rows > PURE_MAX_ROWS {
            return body(ops, xs, [rotate, compress]);
        }
        let key = [unit[0], unit[1], UNIT_ATTN_ROWS, rows as u64];
        let mut pure = |inp: &[&B::Buf]| {
            let (r, c) = (rotate.on(inp[1], inp[2]), compress.on(inp[3], inp[4]));
            let (normed, mix, AttnRows { q, kv, index }) = body(ops, inp[0], [&r, &c])?;
            let mut outs = vec![normed, mix, q, kv];
            outs.extend(index.into_iter().flatten());
            Ok(outs)
        };
        let inputs = [xs, &rotate.cos, &rotate.sin, &compress.cos, &compress.sin];
        let outs = ops.run_pure(&key, &inputs, &mut pure)?;
        let n = outs.len();
        let wrong = || EngineError::State(format!("the attention-rows unit returned {n} buffers"));
        let mut outs = outs.into_iter();
        let (Some(normed), Some(mix), Some(q), Some(kv)) =
            (outs.next(), outs.next(), outs.next(), outs.next())
        else {
            return Err(wrong());
        };
        let index = match (outs.next(), outs.next(), outs.next()) {
            (None, None, None) => None,
            (Some(iq), Some(iw), None) => Some([iq, iw]),
            _ => return Err(wrong()),
        };
        Ok((normed, mix, AttnRows { q, kv, index }))
    }

    /// The attention's output rows ([`Attention::output_rows`]: the
    /// inverse rotation at the rows' positions, `wo_a`, `wo_b`), its
    /// combine and the whole MoE half: `xs` after the layer. Pure (one
    /// replayed unit on a device, the inverse tables among its inputs) up
    /// to [`PURE_MAX_ROWS`] rows, except on hash layers (their experts come
    /// from the token ids, host values a replay would not see).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn out_and_ffn(
        &self,
        ops: &B,
        xs: &B::Buf,
        o: B::Buf,
        mix: &B::Buf,
        inverse: &RopeRows<B>,
        tokens: &[u32],
        unit: [u64; 2],
    ) -> Result<B::Buf> {
        let rows = tokens.len();
        if rows > PURE_MAX_ROWS || self.moe.is_hash() {
            let y = self.attn.output_rows(ops, o, rows, inverse)?;
            return Ok(self.ffn_half_routed(ops, xs, &y, mix, tokens)?.0);
        }
        let key = [unit[0], unit[1], UNIT_OUT_FFN, rows as u64];
        let mut pure = |inp: &[&B::Buf]| {
            // The unit's own copy of `o` (rotated back in place).
            let inverse = inverse.on(inp[3], inp[4]);
            let y = self.attn.output_rows(ops, inp[1].clone(), rows, &inverse)?;
            Ok(vec![
                self.ffn_half_routed(ops, inp[0], &y, inp[2], tokens)?.0,
            ])
        };
        let inputs = [xs, &o, mix, &inverse.cos, &inverse.sin];
        let outs = ops.run_pure(&key, &inputs, &mut pure)?;
        outs.into_iter()
            .next()
            .ok_or_else(|| EngineError::State("the output and MoE unit returned nothing".into()))
    }

    /// [`Self::out_and_ffn`]'s ops after the output rows, with the routing.
    fn ffn_half_routed(
        &self,
        ops: &B,
        xs: &B::Buf,
        y: &B::Buf,
        mix: &B::Buf,
        tokens: &[u32],
    ) -> Result<(B::Buf, B::Routing)> {
        let rows = tokens.len();
        let xs = self.attn_hc.combine(ops, xs, y, mix)?;
        let (x, mix) = self.ffn_hc.mix(ops, &xs, rows)?;
        let mix = mix.ok_or_else(|| EngineError::State("mHC gave no combine".into()))?;
        let (y, routing) = self
            .moe
            .forward(ops, &self.ffn_norm.forward(ops, &x)?, tokens)?;
        Ok((self.ffn_hc.combine(ops, &xs, &y, &mix)?, routing))
    }
}

/// The MTP head (see the module docs for its contract).
#[derive(Debug)]
pub struct MtpHead<B: Backend> {
    pub(super) enorm: RmsNorm<B>,
    pub(super) hnorm: RmsNorm<B>,
    pub(super) e_proj: Linear<B>,
    pub(super) h_proj: Linear<B>,
    pub(super) layer: DecoderLayer<B>,
    pub(super) hc_head: HcHead<B>,
    pub(super) norm: RmsNorm<B>,
}

impl<B: Backend> MtpHead<B> {
    /// Bound under `m`'s scope (`mtp.0`).
    fn load(m: &mut Binder<'_, B>, cfg: &DeepseekV4Config) -> Result<Self> {
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f64);
        Ok(Self {
            enorm: RmsNorm::load(m, "enorm.weight", h, eps)?,
            hnorm: RmsNorm::load(m, "hnorm.weight", h, eps)?,
            e_proj: m.linear("e_proj", h, h)?,
            h_proj: m.linear("h_proj", h, h)?,
            layer: DecoderLayer::load(m, cfg, AttnKind::Sliding, MlpKind::TopK)?,
            hc_head: HcHead::load(m, ["hc_head_fn", "hc_head_base", "hc_head_scale"], cfg)?,
            norm: RmsNorm::load(m, "norm.weight", h, eps)?,
        })
    }
}

/// A trunk forward with what the decode loops and tests may need.
#[derive(Debug)]
pub struct TrunkOutput<B: Backend = CpuOps> {
    pub logits: ForwardOutput,
    /// Pre-`hc_head` streams of the last layer, `[T, N·D]` (the MTP input).
    pub streams: B::Buf,
    pub trace: Vec<LayerTrace>,
}

pub struct DeepseekV4Model<B: Backend = CpuOps> {
    pub(super) ops: B,
    pub(super) cfg: Box<DeepseekV4Config>,
    pub(super) embed: B::Table,
    pub(super) head: Linear<B>,
    pub(super) norm: RmsNorm<B>,
    pub(super) layers: Vec<DecoderLayer<B>>,
    pub(super) hc_head: HcHead<B>,
    pub(super) ropes: Ropes,
    pub(super) mtp: Option<Box<MtpHead<B>>>,
    /// This model's identity in pure-unit keys ([`crate::backend::pure_scope`]).
    pub(super) scope: u64,
}

impl DeepseekV4Model<CpuOps> {
    /// Load a Hugging Face directory on the CPU (see [`Self::load`]).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        Self::load(dir, CpuOps)
    }
}

impl<B: Backend> DeepseekV4Model<B> {
    /// Load a Hugging Face directory (transformers' saved names, `model.*`,
    /// or the upstream ones without the prefix; f32, bf16 or f16 weights,
    /// computed in f32) onto `ops`. `mtp.0.*` is bound when present.
    pub fn load(dir: &Path, ops: B) -> Result<Self> {
        let mut st = SafetensorsDir::open(dir)?;
        let config_path = st.config_path();
        let cfg = DeepseekV4Config::from_hf(&config_path, st.config())?;
        // transformers' save: `model.embed_tokens`, `model.hc_head.hc_fn`;
        // upstream: `embed`, `hc_head_fn`.
        let hybrid = st.has("model.embed_tokens.weight");
        let has_mtp = st.has("mtp.0.e_proj.weight");
        let model = Self::load_from(&mut st, cfg, hybrid, has_mtp, ops)?;
        st.finish(&[])?;
        Ok(model)
    }

    /// Bind every weight from `src` under the upstream names (`hybrid`:
    /// transformers' `model.*` top level), and the MTP head when
    /// `with_mtp`. The caller checks that `src` has nothing left over
    /// (the GGUF layout in [`super::gguf`] maps these names).
    pub(super) fn load_from(
        src: &mut dyn WeightSource,
        cfg: DeepseekV4Config,
        hybrid: bool,
        with_mtp: bool,
        ops: B,
    ) -> Result<Self> {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let (p, embed_name, hc_names) = if hybrid {
            (
                "model",
                "embed_tokens.weight",
                ["hc_head.hc_fn", "hc_head.hc_base", "hc_head.hc_scale"],
            )
        } else {
            (
                "",
                "embed.weight",
                ["hc_head_fn", "hc_head_base", "hc_head_scale"],
            )
        };
        let (embed, head, norm, layers, hc_head, mtp) = {
            let mut root = Binder::new(src, &ops);
            let mut w = root.pp(p);
            let embed_w = w.raw(embed_name, &[v, h])?;
            let embed = w.ops().table(embed_w.clone(), v, h)?;
            let layers = (0..cfg.num_layers)
                .map(|l| {
                    DecoderLayer::load(
                        &mut w.pp(&format!("layers.{l}")),
                        &cfg,
                        cfg.attn[l],
                        cfg.mlp[l],
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            let norm = RmsNorm::load(&mut w, "norm.weight", h, cfg.rms_norm_eps as f64)?;
            let hc_head = HcHead::load(&mut w, hc_names, &cfg)?;
            let head = if cfg.tie_word_embeddings {
                root.linear_from(embed_w, v, h)?
            } else {
                root.linear("head", v, h)?
            };
            let mtp = if with_mtp {
                Some(Box::new(MtpHead::load(&mut root.pp("mtp.0"), &cfg)?))
            } else {
                None
            };
            (embed, head, norm, layers, hc_head, mtp)
        };
        let ropes = Ropes {
            main: RopeFreqs::new(
                cfg.main_rope.theta,
                cfg.rope_dim,
                &cfg.main_rope.scaling,
                cfg.main_rope.attention_factor,
                RopeLayout::InterleavedTail,
            ),
            compress: RopeFreqs::new(
                cfg.compress_rope.theta,
                cfg.rope_dim,
                &cfg.compress_rope.scaling,
                cfg.compress_rope.attention_factor,
                RopeLayout::InterleavedTail,
            ),
        };
        Ok(Self {
            ops,
            cfg: Box::new(cfg),
            embed,
            head,
            norm,
            layers,
            hc_head,
            ropes,
            mtp,
            scope: crate::backend::pure_scope(),
        })
    }

    /// An MTP head (`mtp.0.*`) bound from `src` for this model.
    pub(super) fn bind_mtp(&self, src: &mut dyn WeightSource) -> Result<MtpHead<B>> {
        MtpHead::load(&mut Binder::new(src, &self.ops).pp("mtp.0"), &self.cfg)
    }

    /// Use `head` as the MTP head (replacing any the model has).
    pub(super) fn set_mtp(&mut self, head: MtpHead<B>) {
        self.mtp = Some(Box::new(head));
    }

    pub fn ops(&self) -> &B {
        &self.ops
    }

    pub fn config(&self) -> &DeepseekV4Config {
        &self.cfg
    }

    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    pub(super) fn embed(&self, tokens: &[u32]) -> Result<B::Buf> {
        crate::layers::embedding::embed_tokens(&self.ops, &self.embed, tokens, self.cfg.vocab_size)
    }

    /// Logits from [`Self::logits_on_device`], read back.
    fn read_logits(&self, (logits, rows): (B::Buf, usize)) -> Result<ForwardOutput> {
        Ok(ForwardOutput {
            logits: self.ops.download(&logits)?,
            rows,
            vocab: self.cfg.vocab_size,
        })
    }

    /// `head(norm(hc_head(streams)))` for the rows asked, on the backend,
    /// and their count `n` (every row of `streams`, or its last).
    pub(super) fn logits_on_device(
        &self,
        streams: &B::Buf,
        t: usize,
        hc_head: &HcHead<B>,
        norm: &RmsNorm<B>,
        rows: LogitsRows,
    ) -> Result<(B::Buf, usize)> {
        let ops = &self.ops;
        let nd = self.cfg.hc_mult * self.cfg.hidden_size;
        let (s, n) = match rows {
            LogitsRows::All => (streams.clone(), t),
            LogitsRows::Last => (ops.rows(streams, nd, t - 1, 1)?, 1),
        };
        let x = norm.forward(ops, &hc_head.forward(ops, &s, n)?)?;
        Ok((self.head.forward(ops, &x, n)?, n))
    }

    /// A trunk forward of `tokens` after everything `state` covers, with
    /// the last layer's streams and optional per-layer traces.
    ///
    /// Out-of-vocabulary tokens and context overflow are refused before the
    /// state changes; a later error leaves it partially advanced, so callers
    /// restore a snapshot.
    pub fn forward_ext(
        &self,
        tokens: &[u32],
        state: &mut DeepseekV4State<B>,
        rows: LogitsRows,
        trace: bool,
    ) -> Result<TrunkOutput<B>> {
        let ops = &self.ops;
        if tokens.is_empty() {
            return Err(EngineError::State(
                "forward needs at least one token".into(),
            ));
        }
        let needed = state.len + tokens.len();
        if needed > self.cfg.context_length {
            return Err(EngineError::ContextOverflow {
                needed,
                limit: self.cfg.context_length,
            });
        }
        let x = self.embed(tokens)?;
        let mut xs = ops.tile_streams(&x, self.cfg.hc_mult, self.cfg.hidden_size)?;
        let rot = self.ropes.for_rows(ops, state.len, tokens.len())?;
        let mut traces = Vec::new();
        for (l, (layer, cache)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            let (out, tr) =
                layer.forward(ops, &xs, tokens, cache, &rot, trace, [self.scope, l as u64])?;
            xs = out;
            traces.extend(tr);
        }
        state.len = needed;
        let logits = self.read_logits(self.logits_on_device(
            &xs,
            tokens.len(),
            &self.hc_head,
            &self.norm,
            rows,
        )?)?;
        Ok(TrunkOutput {
            logits,
            streams: xs,
            trace: traces,
        })
    }

    /// A fresh MTP state, when the checkpoint has an MTP head.
    pub fn new_mtp_state(&self) -> Option<MtpState<B>> {
        let mtp = self.mtp.as_ref()?;
        let cache = mtp
            .layer
            .attn
            .new_cache(&self.ops)
            .expect("a fresh window cache allocates");
        Some(MtpCache::new(&self.ops, cache))
    }

    /// MTP rows: `tokens[i]` with `streams[i]` (`[n, N·D]`, trunk
    /// pre-`hc_head` streams or a previous depth's output), appended to
    /// `state` at positions `state.len() ..`. Returns the logits rows asked
    /// and the output streams `[n, N·D]`.
    pub fn mtp_forward(
        &self,
        tokens: &[u32],
        streams: &B::Buf,
        state: &mut MtpState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, B::Buf)> {
        let ops = &self.ops;
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            EngineError::Unsupported("this deepseek_v4 checkpoint has no mtp.0.* weights".into())
        })?;
        let n = tokens.len();
        let (c, h) = (self.cfg.hc_mult, self.cfg.hidden_size);
        if n == 0 || ops.len(streams) != n * c * h {
            return Err(EngineError::State(format!(
                "MTP rows: {n} tokens and {} stream values (expected [{n}, {}])",
                ops.len(streams),
                c * h
            )));
        }
        let e = mtp
            .e_proj
            .forward(ops, &mtp.enorm.forward(ops, &self.embed(tokens)?)?, n)?;
        // hnorm and h_proj act on each stream (rows of D).
        let hs = mtp
            .h_proj
            .forward(ops, &mtp.hnorm.forward(ops, streams)?, n * c)?;
        let x0 = ops.add(&hs, &ops.tile_streams(&e, c, h)?)?;
        let base = state.positions.len() as u32;
        let rot = self.ropes.for_rows(ops, base as usize, n)?;
        state
            .positions
            .extend((base..base + n as u32).map(|p| [p; 3]));
        // The head's layer is sliding-only with a learned router: no token
        // ids reach it.
        let (x1, _) = mtp.layer.forward(
            ops,
            &x0,
            tokens,
            &mut state.cache,
            &rot,
            false,
            [self.scope, MTP_LAYER],
        )?;
        let logits =
            self.read_logits(self.logits_on_device(&x1, n, &mtp.hc_head, &mtp.norm, rows)?)?;
        Ok((logits, x1))
    }

    pub(super) fn hidden(&self, streams: B::Buf, rows: usize) -> Result<DeviceRows<B>> {
        DeviceRows::new(
            &self.ops,
            streams,
            rows,
            self.cfg.hc_mult * self.cfg.hidden_size,
        )
    }
}

/// Synthetic weights (`bench --synthetic deepseek_v4`).
impl<B: Backend> DeepseekV4Model<B> {
    /// Bind random weights from `src` (`load::synthetic::stored`: ds4's
    /// stored types under the upstream names), without the MTP head.
    pub fn load_synthetic(
        src: &mut crate::load::synthetic::stored::StoredSource,
        cfg: DeepseekV4Config,
        ops: B,
    ) -> Result<Self> {
        Self::load_from(src, cfg, false, false, ops)
    }
}

impl<B: Backend> Model for DeepseekV4Model<B> {
    type State = DeepseekV4State<B>;
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

    fn new_state(&self) -> DeepseekV4State<B> {
        DeepseekV4State {
            ops: self.ops.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| l.attn.new_cache(&self.ops))
                .collect::<Result<Vec<_>>>()
                .expect("allocating a fresh state's caches"),
            len: 0,
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut DeepseekV4State<B>,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self.forward_ext(tokens, state, rows, false)?.logits)
    }

    fn forward_batch(
        &self,
        calls: &mut [crate::model::BatchCall<'_, DeepseekV4State<B>>],
    ) -> Vec<Result<crate::model::BatchResult<Self>>> {
        self.run_batch(calls)
    }

    fn mtp_contract(&self) -> Option<MtpContract> {
        self.has_mtp().then_some(MtpContract {
            default_depth: MTP_DEFAULT_DEPTH,
            max_depth: MTP_MAX_DEPTH,
            hidden: "pre-hc_head streams of the last decoder layer [N*D]",
            min_draft_confidence: None,
        })
    }

    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut DeepseekV4State<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, DeviceRows<B>)> {
        let out = self.forward_ext(tokens, state, rows, false)?;
        Ok((out.logits, self.hidden(out.streams, tokens.len())?))
    }

    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut DeepseekV4State<B>,
    ) -> Result<VerifyWindow<WindowMark, DeviceRows<B>>> {
        let base = state.len;
        let out = self.forward_ext(tokens, state, LogitsRows::All, false)?;
        Ok(VerifyWindow {
            logits: out.logits,
            hidden: self.hidden(out.streams, tokens.len())?,
            record: WindowMark {
                base,
                rows: tokens.len(),
            },
        })
    }

    fn hidden_from_host(&self, rows: usize, width: usize, data: Vec<f32>) -> Result<DeviceRows<B>> {
        let nd = self.cfg.hc_mult * self.cfg.hidden_size;
        if width != nd {
            return Err(EngineError::State(format!(
                "deepseek_v4 hidden rows are {nd} wide, not {width}"
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
        let (logits, streams) =
            DeepseekV4Model::mtp_forward(self, tokens, hidden.buf(), state, LogitsRows::Last)?;
        let n = tokens.len();
        let nd = self.cfg.hc_mult * self.cfg.hidden_size;
        let last = self.ops.rows(&streams, nd, n - 1, 1)?;
        Ok(MtpStep {
            logits: logits.last_row().to_vec(),
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

/// Draft depth when a request leaves it unset (ds4's production depth).
pub const MTP_DEFAULT_DEPTH: usize = 2;
/// Deepest chain (verify windows of up to 8 rows; the caches step back
/// further than that).
pub const MTP_MAX_DEPTH: usize = 7;
