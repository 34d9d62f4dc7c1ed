//! One GLM-5 decoder layer (`Glm5NextTextDecoderLayer`) over the 4-stream
//! mHC residual `X: [T, N·D]`:
//!
//! ```text
//! x, mix = attn_hc(X) ;  X = attn_hc.combine(X, mixer(input_layernorm(x)), mix)
//! x, mix = ffn_hc(X)  ;  X = ffn_hc.combine(X, ffn(post_attention_layernorm(x)), mix)
//! ```
//!
//! The mixer is KDA ([`crate::layers::kda`]) or MLA ([`crate::layers::mla`])
//! whose selection comes from its own pooled indexer
//! ([`crate::layers::pooled_indexer`]) or, on a shared-indexer layer, from
//! the MLA layer right before it.
//!
//! Up to [`PURE_MAX_ROWS`] rows (decode steps, verify windows) a layer runs
//! as two pure units ([`Backend::run_pure`]: one replayed graph each on a
//! device, the same ops and bits) around the part that reads and writes
//! the caches: the mixer's rows (mix, `input_layernorm` and the mixer's
//! row-wise projections) and the mixer's output rows with the whole FFN
//! half, as DeepSeek-V4's layers run them.

use super::config::{Glm5NextConfig, IndexerKind, LayerKind};
use super::ffn::Ffn;
use super::state::{LayerCache, MlaCache};
use crate::backend::{Backend, PURE_MAX_ROWS};
use crate::error::{EngineError, Result};
use crate::layers::delta_rule::DeltaReplay;
use crate::layers::hyper_connections::{HyperConnection, Mhc};
use crate::layers::kda::{Kda, KdaSpec};
use crate::layers::linear::BindLinear;
use crate::layers::mla::{Mla, MlaSpec};
use crate::layers::norms::RmsNorm;
use crate::layers::pooled_indexer::{PooledIndexer, PooledIndexerSpec};
use crate::load::binder::Binder;

#[derive(Debug)]
pub enum Mixer<B: Backend> {
    Kda(Kda<B>),
    Mla {
        mla: Mla<B>,
        /// `None` on a shared-indexer layer.
        indexer: Option<PooledIndexer<B>>,
    },
}

#[derive(Debug)]
pub struct DecoderLayer<B: Backend> {
    pub mixer: Mixer<B>,
    ffn: Ffn<B>,
    pub(super) input_norm: RmsNorm<B>,
    post_norm: RmsNorm<B>,
    pub(super) attn_hc: Mhc<B>,
    ffn_hc: Mhc<B>,
}

/// Which pure unit of a layer a key names (the numbers of stop 66's
/// units, the mixer's input alone and the FFN half alone, are not reused).
const UNIT_MIXER_ROWS: u64 = 3;
const UNIT_OUT_FFN: u64 = 4;

/// The mixer's row-wise inputs ([`DecoderLayer::mixer_rows`]).
pub(super) enum MixerRows<B: Backend> {
    /// `[u, g, β, z]` ([`Kda::project`]).
    Kda([B::Buf; 4]),
    /// The absorbed queries, the new latents and, on a layer with its own
    /// indexer, its `[k, g, q, w]` ([`PooledIndexer::project_rows`]).
    Mla {
        q: B::Buf,
        latents: B::Buf,
        index: Option<[B::Buf; 4]>,
    },
}

/// What one layer did, on the host (only when a trace is asked for).
#[derive(Debug, Clone)]
pub struct LayerTrace {
    /// Output streams `[T, N·D]`.
    pub streams: Vec<f32>,
    /// Selected token indices per new query (MLA layers).
    pub selection: Option<Vec<Vec<u32>>>,
    /// `[T·k]` experts and weights (sparse FFNs).
    pub routing: Option<(Vec<usize>, Vec<f32>)>,
}

/// A layer's output streams `[rows, N·D]`, its selection (MLA layers: what
/// a shared successor reuses) and its trace when asked.
pub struct LayerOutput<B: Backend> {
    pub streams: B::Buf,
    pub selection: Option<B::Selection>,
    pub trace: Option<LayerTrace>,
}

pub fn mla_spec(cfg: &Glm5NextConfig) -> MlaSpec {
    MlaSpec {
        heads: cfg.num_heads,
        q_lora: cfg.q_lora_rank,
        latent: cfg.kv_lora_rank,
        nope: cfg.qk_nope_head_dim,
        v: cfg.v_head_dim,
        eps: cfg.rms_norm_eps,
    }
}

pub fn indexer_spec(cfg: &Glm5NextConfig) -> PooledIndexerSpec {
    PooledIndexerSpec {
        heads: cfg.index_n_heads,
        dim: cfg.index_head_dim,
        pool: cfg.index_pool,
        pool_topk: cfg.pool_topk(),
        tail: true,
    }
}

/// mHC parts under either name layout: upstream `hc_attn_fn` /
/// `hc_attn_base` / `hc_attn_scale`, or internal `attn_hc.fn` / `.base` /
/// `.scale`.
fn load_hc<B: Backend>(w: &mut Binder<'_, B>, which: &str, cfg: &Glm5NextConfig) -> Result<Mhc<B>> {
    let (n, d) = (cfg.hc_mult, cfg.hidden_size);
    let m = (2 + n) * n;
    let upstream = format!("hc_{which}_fn");
    let names: [String; 3] = if w.has(&upstream) {
        ["fn", "base", "scale"].map(|p| format!("hc_{which}_{p}"))
    } else {
        ["fn", "base", "scale"].map(|p| format!("{which}_hc.{p}"))
    };
    let proj = w.raw(&names[0], &[m, n * d])?;
    let proj = w.linear_from(proj, m, n * d)?;
    let base = w.vector(&names[1], &[m])?;
    let scale = w.vector(&names[2], &[3])?;
    Mhc::new(
        w.ops(),
        proj,
        base,
        scale,
        n,
        d,
        cfg.hc_sinkhorn_iters,
        cfg.hc_eps as f32,
        cfg.rms_norm_eps as f32,
    )
}

impl<B: Backend> DecoderLayer<B> {
    /// Layer `l`, bound under `w`'s scope (`…layers.{l}`).
    pub fn load(w: &mut Binder<'_, B>, cfg: &Glm5NextConfig, l: usize) -> Result<Self> {
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let mixer = {
            let mut a = w.pp("self_attn");
            match cfg.layer_kinds[l] {
                LayerKind::Kda => Mixer::Kda(Kda::load(
                    &mut a,
                    h,
                    KdaSpec {
                        heads: cfg.linear_num_heads,
                        head_dim: cfg.linear_head_dim,
                        kernel: cfg.linear_conv_kernel,
                        lower_bound: cfg.linear_lower_bound.map(|v| v as f32),
                        eps: eps as f32,
                    },
                )?),
                LayerKind::Mla => Mixer::Mla {
                    mla: Mla::load(&mut a, h, mla_spec(cfg))?,
                    indexer: match cfg.indexer_kinds[l] {
                        IndexerKind::Full => Some(PooledIndexer::load(
                            &mut a.pp("indexer"),
                            h,
                            cfg.q_lora_rank,
                            indexer_spec(cfg),
                        )?),
                        IndexerKind::Shared => None,
                    },
                },
            }
        };
        Ok(Self {
            mixer,
            ffn: Ffn::load(&mut w.pp("mlp"), cfg, cfg.mlp_kinds[l])?,
            input_norm: RmsNorm::load(w, "input_layernorm.weight", h, eps)?,
            post_norm: RmsNorm::load(w, "post_attention_layernorm.weight", h, eps)?,
            attn_hc: load_hc(w, "attn", cfg)?,
            ffn_hc: load_hc(w, "ffn", cfg)?,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<LayerCache<B>> {
        Ok(match &self.mixer {
            Mixer::Kda(k) => LayerCache::Kda(k.new_cache(ops)?),
            Mixer::Mla { mla, indexer } => LayerCache::Mla(MlaCache::new(
                ops,
                mla.spec.latent,
                indexer.as_ref().map(|i| i.new_cache(ops)).transpose()?,
            )?),
        })
    }

    /// `xs: [rows, N·D]` → `[rows, N·D]`. `prev` is the previous layer's
    /// selection (what a shared-indexer layer reuses). Returns the streams,
    /// this layer's selection (MLA) and, with `trace`, what it did. `unit`
    /// names this layer in its model (the keys of its pure units).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ops: &B,
        xs: &B::Buf,
        rows: usize,
        cache: &mut LayerCache<B>,
        prev: Option<&B::Selection>,
        capture: Option<&mut Option<DeltaReplay<B>>>,
        trace: bool,
        unit: [u64; 2],
    ) -> Result<LayerOutput<B>> {
        // A trace reads the routing, which a replayed unit does not return.
        let unit = (!trace && rows <= PURE_MAX_ROWS).then_some(unit);
        let (mix, projected) = self.mixer_rows(ops, xs, rows, unit)?;
        let mut selection = None;
        let (o, z) = match (&self.mixer, cache, projected) {
            (Mixer::Kda(kda), LayerCache::Kda(c), MixerRows::Kda([u, g, beta, z])) => {
                (kda.recur(ops, u, g, beta, rows, c, capture)?, Some(z))
            }
            (
                Mixer::Mla { mla, indexer },
                LayerCache::Mla(c),
                MixerRows::Mla { q, latents, index },
            ) => {
                c.latent.append(ops, &latents)?;
                let sel = match (indexer, c.indexer.as_mut(), index) {
                    (Some(ix), Some(ic), Some(ixr)) => ix.select_rows(ops, &ixr, rows, ic)?,
                    (None, None, None) => prev.cloned().ok_or_else(|| {
                        EngineError::State(
                            "a shared-indexer layer got no selection from the layer before".into(),
                        )
                    })?,
                    _ => return Err(mismatch()),
                };
                let o = mla.attend_latent(ops, &q, c.latent.buf(), &sel)?;
                selection = Some(sel);
                (o, None)
            }
            _ => return Err(mismatch()),
        };
        let (xs, routing) = self.out_and_ffn(ops, xs, &o, z.as_ref(), &mix, rows, unit)?;
        let tr = if trace {
            Some(LayerTrace {
                streams: ops.download(&xs)?,
                selection: selection
                    .as_ref()
                    .map(|s| ops.selection_to_host(s))
                    .transpose()?,
                routing: routing.map(|r| ops.routing_to_host(&r)).transpose()?,
            })
        } else {
            None
        };
        Ok(LayerOutput {
            streams: xs,
            selection,
            trace: tr,
        })
    }
}

impl<B: Backend> DecoderLayer<B> {
    /// The attention mix's weights and the mixer's row-wise inputs from
    /// `input_layernorm(attn_hc mix(xs))` ([`MixerRows`]): one pure unit
    /// keyed by `unit` when given. What is left between it and
    /// [`Self::out_and_ffn`] reads and writes the caches (KDA's conv and
    /// recurrence; MLA's latent append, the indexer's pools and selection,
    /// the gathered attention).
    pub(super) fn mixer_rows(
        &self,
        ops: &B,
        xs: &B::Buf,
        rows: usize,
        unit: Option<[u64; 2]>,
    ) -> Result<(B::Buf, MixerRows<B>)> {
        // `[mix, rows…]`: KDA's `[u, g, β, z]`; MLA's absorbed queries and
        // latents, then the own indexer's `[k, g, q, w]`.
        let body = |ops: &B, xs: &B::Buf| -> Result<Vec<B::Buf>> {
            let (x, mix) = self.attn_hc.mix(ops, xs, rows)?;
            let x = self.input_norm.forward(ops, &x)?;
            let mut out = vec![mix.ok_or_else(no_mix)?];
            match &self.mixer {
                Mixer::Kda(kda) => out.extend(kda.project(ops, &x, rows)?),
                Mixer::Mla { mla, indexer } => {
                    let (qr, q) = mla.queries(ops, &x, rows)?;
                    out.push(mla.absorb(ops, &q, rows)?);
                    out.push(mla.latents(ops, &x, rows)?);
                    if let Some(ix) = indexer {
                        out.extend(ix.project_rows(ops, &x, &qr, rows)?);
                    }
                }
            }
            Ok(out)
        };
        let outs = match unit {
            None => body(ops, xs)?,
            Some(unit) => {
                let key = [unit[0], unit[1], UNIT_MIXER_ROWS, rows as u64];
                let mut pure = |inp: &[&B::Buf]| body(ops, inp[0]);
                ops.run_pure(&key, &[xs], &mut pure)?
            }
        };
        let n = outs.len();
        let wrong = || EngineError::State(format!("the mixer-rows unit returned {n} buffers"));
        let mut it = outs.into_iter();
        let mix = it.next().ok_or_else(wrong)?;
        let mut rest: Vec<B::Buf> = it.collect();
        let projected = match &self.mixer {
            Mixer::Kda(_) => MixerRows::Kda(rest.try_into().map_err(|_| wrong())?),
            Mixer::Mla { indexer, .. } => {
                let index = match indexer {
                    None => None,
                    Some(_) if rest.len() == 6 => {
                        Some(rest.split_off(2).try_into().map_err(|_| wrong())?)
                    }
                    Some(_) => return Err(wrong()),
                };
                let [q, latents]: [B::Buf; 2] = rest.try_into().map_err(|_| wrong())?;
                MixerRows::Mla { q, latents, index }
            }
        };
        Ok((mix, projected))
    }

    /// The mixer's output rows (KDA's gated norm and `o_proj` with `z`,
    /// MLA's value absorption and `o_proj`), then [`Self::ffn_half`]: one
    /// pure unit keyed by `unit` when given (its routing then stays on the
    /// device).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn out_and_ffn(
        &self,
        ops: &B,
        xs: &B::Buf,
        o: &B::Buf,
        z: Option<&B::Buf>,
        mix: &B::Buf,
        rows: usize,
        unit: Option<[u64; 2]>,
    ) -> Result<(B::Buf, Option<B::Routing>)> {
        let body = |ops: &B, xs: &B::Buf, o: &B::Buf, z: Option<&B::Buf>, mix: &B::Buf| {
            let y = match (&self.mixer, z) {
                (Mixer::Kda(kda), Some(z)) => kda.output(ops, o, z, rows)?,
                (Mixer::Mla { mla, .. }, None) => mla.output(ops, o, rows)?,
                _ => return Err(mismatch()),
            };
            self.ffn_half(ops, xs, &y, mix, rows)
        };
        let Some(unit) = unit else {
            return body(ops, xs, o, z, mix);
        };
        let key = [unit[0], unit[1], UNIT_OUT_FFN, rows as u64];
        let mut pure = |inp: &[&B::Buf]| {
            Ok(vec![
                body(ops, inp[0], inp[1], inp.get(3).copied(), inp[2])?.0,
            ])
        };
        let mut inputs = vec![xs, o, mix];
        inputs.extend(z);
        let xs = ops
            .run_pure(&key, &inputs, &mut pure)?
            .into_iter()
            .next()
            .ok_or_else(|| EngineError::State("the output and FFN unit returned nothing".into()))?;
        Ok((xs, None))
    }

    /// The mixer's write-back (`y`, with the attention mix's weights `mix`)
    /// into `xs`, then the FFN half, over `rows` rows (one session's, or a
    /// batch's: every op here is per row); → the layer's output streams and
    /// the routing of a sparse FFN.
    pub(super) fn ffn_half(
        &self,
        ops: &B,
        xs: &B::Buf,
        y: &B::Buf,
        mix: &B::Buf,
        rows: usize,
    ) -> Result<(B::Buf, Option<B::Routing>)> {
        let xs = self.attn_hc.combine(ops, xs, y, mix)?;
        let (x, mix) = self.ffn_hc.mix(ops, &xs, rows)?;
        let x = self.post_norm.forward(ops, &x)?;
        let (y, routing) = self.ffn.forward(ops, &x, rows)?;
        let xs = self
            .ffn_hc
            .combine(ops, &xs, &y, &mix.ok_or_else(no_mix)?)?;
        Ok((xs, routing))
    }
}

pub(super) fn mismatch() -> EngineError {
    EngineError::State("layer cache does not match the layer kind".into())
}

pub(super) fn no_mix() -> EngineError {
    EngineError::State("an mHC block returned no mixing weights".into())
}
