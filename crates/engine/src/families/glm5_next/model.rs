//! The GLM-5 text model (trunk) and its NextN head, batch 1.
//!
//! ```text
//! X = tile(embed(ids), N)                                 [T, N·D]
//! for each layer: X = layer(X)                            (see `layer`)
//! h = norm( mean_N(X) )                                   the final hidden (the MTP input)
//! logits = lm_head(h)
//! ```
//!
//! NoPE: nothing depends on positions except causality, so the state holds
//! only a length. The MTP contract is documented in [`super::mtp`].

use std::path::Path;

use super::config::Glm5NextConfig;
use super::layer::{DecoderLayer, LayerTrace};
use super::mtp::{MTP_DEFAULT_DEPTH, MTP_HIDDEN, MTP_MAX_DEPTH, NextN};
use super::state::{Glm5NextState, LayerCache, MtpState, WindowCapture};
use crate::backend::{Backend, CpuOps};
use crate::error::{EngineError, Result};
use crate::families::FamilyDescriptor;
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::RmsNorm;
use crate::load::binder::{Binder, WeightSource};
use crate::load::checkpoint::HfCheckpoint;
use crate::model::{
    DeviceRows, ForwardOutput, LogitsRows, Model, MtpContract, MtpStep, VerifyWindow,
};

// Large parts are boxed so that `LoadedModel` stays small.
pub struct Glm5NextModel<B: Backend = CpuOps> {
    pub(super) ops: B,
    pub(super) cfg: Box<Glm5NextConfig>,
    /// `[V, D]`.
    embed: B::Table,
    pub(super) lm_head: Linear<B>,
    pub(super) layers: Vec<DecoderLayer<B>>,
    pub(super) norm: RmsNorm<B>,
    pub(super) mtp: Option<Box<NextN<B>>>,
    /// This model's identity in pure-unit keys ([`crate::backend::pure_scope`]).
    pub(super) scope: u64,
}

/// A trunk forward with everything tests and the decode loops may need.
#[derive(Debug)]
pub struct TrunkOutput<B: Backend = CpuOps> {
    pub logits: ForwardOutput,
    /// The final hidden of every new row, `[T, D]` (the MTP head's input).
    pub hidden: B::Buf,
    /// The window record (only from [`Glm5NextModel::forward_window`]).
    pub capture: Option<WindowCapture<B>>,
    /// Per-layer traces (only when asked).
    pub trace: Vec<LayerTrace>,
}

impl Glm5NextModel<CpuOps> {
    /// Load a Hugging Face directory on the CPU (see [`Self::load`]).
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        Self::load(dir, CpuOps)
    }
}

impl<B: Backend> Glm5NextModel<B> {
    /// Load a Hugging Face directory: the conditional-generation layout
    /// (`model.language_model.*`, `model.visual.*` ignored) or the
    /// text-only one (`model.*`), f32/bf16/f16 weights computed in f32. The
    /// NextN head (`layers.{L}.*`) is bound when present.
    ///
    /// `dir` may also be a GGUF file in the same names with the
    /// configuration embedded ([`HfCheckpoint`]).
    pub fn load(dir: &Path, ops: B) -> Result<Self> {
        let mut st = HfCheckpoint::open(dir)?;
        let config_path = st.config_path();
        let cfg = Glm5NextConfig::from_hf(&config_path, st.config())?;
        let prefix = if st.has("model.language_model.embed_tokens.weight") {
            "model.language_model"
        } else {
            "model"
        };
        // The vision tower is not part of the text model.
        st.ignore_prefix("model.visual.");
        let has_mtp = st.has(&format!(
            "{prefix}.layers.{}.eh_proj.weight",
            cfg.num_layers
        ));
        let model = Self::load_from(st.source(), cfg, prefix, has_mtp, ops)?;
        st.finish(&[])?;
        Ok(model)
    }

    /// Bind every weight from `src`: the trunk under `prefix` (`model` or
    /// `model.language_model`), `lm_head.weight` at the top level (unless
    /// tied), and the NextN head (`{prefix}.layers.{L}.*`) when `with_mtp`.
    /// The caller checks that `src` has nothing left over.
    pub(super) fn load_from(
        src: &mut dyn WeightSource,
        cfg: Glm5NextConfig,
        prefix: &str,
        with_mtp: bool,
        ops: B,
    ) -> Result<Self> {
        let (v, h, n_layers) = (cfg.vocab_size, cfg.hidden_size, cfg.num_layers);
        let (embed, lm_head, layers, norm, mtp) = {
            let mut root = Binder::new(src, &ops);
            let mut w = root.pp(prefix);
            let embed_w = w.raw("embed_tokens.weight", &[v, h])?;
            let embed = w.ops().table(embed_w.clone(), v, h)?;
            let layers = (0..n_layers)
                .map(|l| DecoderLayer::load(&mut w.pp(&format!("layers.{l}")), &cfg, l))
                .collect::<Result<Vec<_>>>()?;
            let norm = RmsNorm::load(&mut w, "norm.weight", h, cfg.rms_norm_eps)?;
            let mtp = if with_mtp {
                Some(Box::new(NextN::load(
                    &mut w.pp(&format!("layers.{n_layers}")),
                    &cfg,
                )?))
            } else {
                None
            };
            let lm_head = if cfg.tie_word_embeddings {
                root.linear_from(embed_w, v, h)?
            } else {
                root.linear("lm_head", v, h)?
            };
            (embed, lm_head, layers, norm, mtp)
        };
        Ok(Self {
            ops,
            cfg: Box::new(cfg),
            embed,
            lm_head,
            layers,
            norm,
            mtp,
            scope: crate::backend::pure_scope(),
        })
    }

    /// Bind random weights from `src` (`load::synthetic::stored`: ds4's
    /// stored types under the text-only names, `model.*` and `lm_head`),
    /// without the NextN head (`bench --synthetic glm5_next`).
    pub fn load_synthetic(
        src: &mut crate::load::synthetic::stored::StoredSource,
        cfg: Glm5NextConfig,
        ops: B,
    ) -> Result<Self> {
        Self::load_from(src, cfg, "model", false, ops)
    }

    pub fn config(&self) -> &Glm5NextConfig {
        &self.cfg
    }

    pub fn ops(&self) -> &B {
        &self.ops
    }

    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Rows of `table` (the trunk's embedding unless given), after the
    /// vocabulary check.
    pub(super) fn embed_from(&self, table: Option<&B::Table>, tokens: &[u32]) -> Result<B::Buf> {
        crate::layers::embedding::embed_tokens(
            &self.ops,
            table.unwrap_or(&self.embed),
            tokens,
            self.cfg.vocab_size,
        )
    }

    pub(super) fn logits(&self, x: &B::Buf, rows: usize) -> Result<ForwardOutput> {
        let logits = self.logits_on_device(x, rows)?;
        Ok(ForwardOutput {
            logits: self.ops.download(&logits)?,
            rows,
            vocab: self.cfg.vocab_size,
        })
    }

    /// [`Self::logits`] before the read-back.
    pub(super) fn logits_on_device(&self, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        self.lm_head.forward(&self.ops, x, rows)
    }

    /// A trunk forward of `tokens` after everything `state` covers, with
    /// the final hidden of every row and optional per-layer traces.
    ///
    /// Out-of-vocabulary tokens and context overflow are refused before the
    /// state changes; a later error leaves the state partially advanced, so
    /// callers restore a snapshot.
    pub fn forward_ext(
        &self,
        tokens: &[u32],
        state: &mut Glm5NextState<B>,
        rows: LogitsRows,
        trace: bool,
    ) -> Result<TrunkOutput<B>> {
        self.run(tokens, state, rows, trace, false)
    }

    /// A verify window: all logits rows and a record (the KDA states before
    /// it and their scan inputs) from which [`Glm5NextState::commit`] keeps
    /// any prefix.
    pub fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut Glm5NextState<B>,
    ) -> Result<TrunkOutput<B>> {
        self.run(tokens, state, LogitsRows::All, false, true)
    }

    fn run(
        &self,
        tokens: &[u32],
        state: &mut Glm5NextState<B>,
        rows: LogitsRows,
        trace: bool,
        capture: bool,
    ) -> Result<TrunkOutput<B>> {
        let ops = &self.ops;
        let t = tokens.len();
        if t == 0 {
            return Err(EngineError::State(
                "forward needs at least one token".into(),
            ));
        }
        let base = state.len;
        let needed = base + t;
        if needed > self.cfg.context_length {
            return Err(EngineError::ContextOverflow {
                needed,
                limit: self.cfg.context_length,
            });
        }
        let (n, d) = (self.cfg.hc_mult, self.cfg.hidden_size);
        let mut xs = ops.tile_streams(&self.embed_from(None, tokens)?, n, d)?;
        let mut replays = Vec::new();
        let mut traces = Vec::new();
        let mut prev = None;
        for (l, (layer, cache)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            let mut cap = None;
            let is_kda = matches!(cache, LayerCache::Kda(_));
            let want = capture && is_kda;
            let out = layer.forward(
                ops,
                &xs,
                t,
                cache,
                prev.as_ref(),
                want.then_some(&mut cap),
                trace,
                [self.scope, l as u64],
            )?;
            xs = out.streams;
            prev = out.selection;
            traces.extend(out.trace);
            if want {
                replays.push(cap.ok_or_else(|| {
                    EngineError::State("a KDA layer recorded no window replay".into())
                })?);
            }
        }
        state.len = needed;
        let hidden = self.norm.forward(ops, &ops.mean_streams(&xs, n, d)?)?;
        let logits = match rows {
            LogitsRows::All => self.logits(&hidden, t)?,
            LogitsRows::Last => self.logits(&ops.rows(&hidden, d, t - 1, 1)?, 1)?,
        };
        Ok(TrunkOutput {
            logits,
            hidden,
            capture: capture.then_some(WindowCapture {
                base,
                rows: t,
                kda: replays,
            }),
            trace: traces,
        })
    }

    /// A fresh NextN history, when the checkpoint has the head.
    pub fn new_mtp_state(&self) -> Option<Result<MtpState<B>>> {
        self.mtp.as_ref().map(|m| m.new_state(&self.ops))
    }

    /// NextN rows: `tokens[i]` with `hidden[i]` (`[n, D]`: trunk final
    /// hidden, or a previous depth's output), appended to `state`. Returns
    /// the logits of every row (or the last) and the rows' output hidden.
    pub fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &B::Buf,
        state: &mut MtpState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, B::Buf)> {
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            EngineError::Unsupported("this glm5_next checkpoint has no NextN layer".into())
        })?;
        let n = tokens.len();
        let d = self.cfg.hidden_size;
        if n == 0 || self.ops.len(hidden) != n * d {
            return Err(EngineError::State(format!(
                "NextN rows: {n} tokens and {} hidden values (expected [{n}, {d}])",
                self.ops.len(hidden)
            )));
        }
        // The head's own embedding copy when the checkpoint has one.
        let emb = self.embed_from(mtp.embed.as_ref(), tokens)?;
        let last = rows == LogitsRows::Last;
        let out = mtp.forward(&self.ops, &emb, hidden, n, state, &self.lm_head, last)?;
        let m = if last { 1 } else { n };
        Ok((
            ForwardOutput {
                logits: self.ops.download(&out.logits)?,
                rows: m,
                vocab: self.cfg.vocab_size,
            },
            out.hidden,
        ))
    }

    pub(super) fn hidden_rows(&self, buf: B::Buf, rows: usize) -> Result<DeviceRows<B>> {
        DeviceRows::new(&self.ops, buf, rows, self.cfg.hidden_size)
    }
}

impl<B: Backend> Model for Glm5NextModel<B> {
    type State = Glm5NextState<B>;
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

    fn new_state(&self) -> Glm5NextState<B> {
        Glm5NextState {
            ops: self.ops.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| l.new_cache(&self.ops))
                .collect::<Result<Vec<_>>>()
                .expect("allocating a fresh state's empty caches"),
            len: 0,
        }
    }

    fn forward(
        &self,
        tokens: &[u32],
        state: &mut Glm5NextState<B>,
        rows: LogitsRows,
    ) -> Result<ForwardOutput> {
        Ok(self.run(tokens, state, rows, false, false)?.logits)
    }

    /// Every session's rows through each layer together, each on its own
    /// caches (`batch.rs`).
    fn forward_batch(
        &self,
        calls: &mut [crate::model::BatchCall<'_, Glm5NextState<B>>],
    ) -> Vec<Result<crate::model::BatchResult<Self>>> {
        self.run_batch(calls)
    }

    fn mtp_contract(&self) -> Option<MtpContract> {
        self.has_mtp().then_some(MtpContract {
            default_depth: MTP_DEFAULT_DEPTH,
            max_depth: MTP_MAX_DEPTH,
            hidden: MTP_HIDDEN,
            min_draft_confidence: None,
        })
    }

    fn forward_hidden(
        &self,
        tokens: &[u32],
        state: &mut Glm5NextState<B>,
        rows: LogitsRows,
    ) -> Result<(ForwardOutput, DeviceRows<B>)> {
        let out = self.run(tokens, state, rows, false, false)?;
        Ok((out.logits, self.hidden_rows(out.hidden, tokens.len())?))
    }

    fn forward_window(
        &self,
        tokens: &[u32],
        state: &mut Glm5NextState<B>,
    ) -> Result<VerifyWindow<WindowCapture<B>, DeviceRows<B>>> {
        let out = Glm5NextModel::forward_window(self, tokens, state)?;
        let record = out
            .capture
            .ok_or_else(|| EngineError::State("a verify window recorded no capture".into()))?;
        Ok(VerifyWindow {
            logits: out.logits,
            hidden: self.hidden_rows(out.hidden, tokens.len())?,
            record,
        })
    }

    fn hidden_from_host(&self, rows: usize, width: usize, data: Vec<f32>) -> Result<DeviceRows<B>> {
        if width != self.cfg.hidden_size {
            return Err(EngineError::State(format!(
                "glm5_next hidden rows are {} wide, not {width}",
                self.cfg.hidden_size
            )));
        }
        self.hidden_rows(self.ops.upload(&data)?, rows)
    }

    fn new_mtp_history(&self) -> Option<MtpState<B>> {
        self.new_mtp_state()
            .map(|s| s.expect("allocating a fresh NextN history's empty caches"))
    }

    fn mtp_forward(
        &self,
        tokens: &[u32],
        hidden: &DeviceRows<B>,
        state: &mut MtpState<B>,
    ) -> Result<MtpStep<DeviceRows<B>>> {
        let (logits, out) =
            Glm5NextModel::mtp_forward(self, tokens, hidden.buf(), state, LogitsRows::Last)?;
        let n = tokens.len();
        let last = self.ops.rows(&out, self.cfg.hidden_size, n - 1, 1)?;
        Ok(MtpStep {
            logits: logits.last_row().to_vec(),
            hidden: self.hidden_rows(last, 1)?,
        })
    }

    fn mtp_forward_batch(
        &self,
        calls: &mut [crate::model::MtpCall<'_, DeviceRows<B>, MtpState<B>>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        self.run_mtp_batch(calls)
    }
}
