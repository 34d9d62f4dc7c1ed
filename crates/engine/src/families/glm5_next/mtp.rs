//! The NextN MTP head of GLM-5 and its contract.
//!
//! transformers does not build it (it ignores `layers.{L}.*`, `L =
//! num_hidden_layers`, and `*.shared_head.*`); the layout below follows the
//! GLM-4.5 / DeepSeek-V3 NextN convention that vLLM and SGLang implement
//! and that the digest's Part D reports for GLM-5 ports. What is inferred
//! rather than read from code is marked.
//!
//! Weights under `{prefix}layers.{L}.`: `enorm`, `hnorm`, `eh_proj [D, 2D]`,
//! `input_layernorm`, `self_attn.*` (MLA with a **full** pooled indexer),
//! `post_attention_layernorm`, `mlp.*` (sparse when `mlp.gate.weight` is
//! present, else dense), `shared_head.norm`, and optionally the
//! DeepSeek-V3 / GLM-4.5-style copies `shared_head.head` and `embed_tokens`
//! (used when present; otherwise the trunk's `lm_head` and embedding).
//!
//! Row `i` of a call combines the token that follows position `t`
//! (`tok_{t+1}`) with the hidden of position `t`:
//!
//! ```text
//! x  = eh_proj·[ enorm(embed(tok)) | hnorm(h_t) ]         embedding first (DeepSeek-V3 order)
//! x += MLA_DSA(input_layernorm(x))                        own latent + indexer cache
//! x += FFN(post_attention_layernorm(x))                   plain residual: no mHC
//! logits = head(shared_head.norm(x))
//! ```
//!
//! * `h_t` from the trunk is its **final hidden**: the mean of the 4 mHC
//!   streams after the last layer, then the final `norm` — exactly what
//!   `lm_head` reads. [inference] vLLM and SGLang feed their NextN layers
//!   the target model's final-normed hidden for DeepSeek-V3 and GLM-4.5;
//!   GLM-5's collapse is a plain mean, so the same point is the normed
//!   mean (the digest guessed "before the final norm"; `hnorm` follows
//!   either way).
//! * A deeper draft feeds back `x` **before** `shared_head.norm` (vLLM's
//!   chaining), with the drafted token.
//! * The embedding is not zeroed at position 0 (vLLM does, for its shifted
//!   batch layout; here row 0 pairs position 0 with token 1 and needs no
//!   mask).

use super::config::{Glm5NextConfig, MlpKind};
use super::ffn::Ffn;
use super::layer::{indexer_spec, mla_spec};
use super::state::{MlaCache, MtpState};
use crate::backend::Backend;
use crate::error::Result;
use crate::families::batch_split::{concat_rows, split_rows};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::mla::Mla;
use crate::layers::norms::RmsNorm;
use crate::layers::pooled_indexer::PooledIndexer;
use crate::load::binder::Binder;
use crate::state::mtp::MtpCache;

/// What feeds the head (the [`crate::MtpContract`]'s description).
pub const MTP_HIDDEN: &str =
    "final hidden [D]: mean of the mHC streams after the last layer, then the final norm";

/// Draft depth when a request leaves it unset.
pub const MTP_DEFAULT_DEPTH: usize = 2;
/// Deepest chain: verify windows of up to 8 rows (any window gives each row
/// a single-row forward's bits: the kernels are row-independent).
pub const MTP_MAX_DEPTH: usize = 7;

#[derive(Debug)]
pub struct NextN<B: Backend> {
    enorm: RmsNorm<B>,
    hnorm: RmsNorm<B>,
    eh_proj: Linear<B>,
    input_norm: RmsNorm<B>,
    mla: Mla<B>,
    indexer: PooledIndexer<B>,
    post_norm: RmsNorm<B>,
    ffn: Ffn<B>,
    shared_norm: RmsNorm<B>,
    /// `shared_head.head` when the checkpoint stores one.
    head: Option<Linear<B>>,
    /// `embed_tokens` when the checkpoint stores one.
    pub embed: Option<B::Table>,
}

/// One head call: logits rows and the layer's output `x` (pre-norm).
pub struct NextNOutput<B: Backend> {
    pub logits: B::Buf,
    pub hidden: B::Buf,
}

impl<B: Backend> NextN<B> {
    /// Bound under `w`'s scope (`…layers.{L}`).
    pub fn load(w: &mut Binder<'_, B>, cfg: &Glm5NextConfig) -> Result<Self> {
        let (h, eps, v) = (cfg.hidden_size, cfg.rms_norm_eps, cfg.vocab_size);
        let kind = if w.has("mlp.gate.weight") {
            MlpKind::Sparse
        } else {
            MlpKind::Dense
        };
        let mut a = w.pp("self_attn");
        let mla = Mla::load(&mut a, h, mla_spec(cfg))?;
        let indexer =
            PooledIndexer::load(&mut a.pp("indexer"), h, cfg.q_lora_rank, indexer_spec(cfg))?;
        let head = if w.has("shared_head.head.weight") {
            Some(w.linear("shared_head.head", v, h)?)
        } else {
            None
        };
        let embed = if w.has("embed_tokens.weight") {
            Some(w.table("embed_tokens.weight", v, h)?)
        } else {
            None
        };
        Ok(Self {
            enorm: RmsNorm::load(w, "enorm.weight", h, eps)?,
            hnorm: RmsNorm::load(w, "hnorm.weight", h, eps)?,
            eh_proj: w.linear("eh_proj", h, 2 * h)?,
            input_norm: RmsNorm::load(w, "input_layernorm.weight", h, eps)?,
            mla,
            indexer,
            post_norm: RmsNorm::load(w, "post_attention_layernorm.weight", h, eps)?,
            ffn: Ffn::load(&mut w.pp("mlp"), cfg, kind)?,
            shared_norm: RmsNorm::load(w, "shared_head.norm.weight", h, eps)?,
            head,
            embed,
        })
    }

    pub fn new_state(&self, ops: &B) -> Result<MtpState<B>> {
        let cache = MlaCache::new(
            ops,
            self.mla.spec.latent,
            Some(self.indexer.new_cache(ops)?),
        )?;
        Ok(MtpCache::new(ops, cache))
    }

    /// `emb: [n, D]` (the tokens' embeddings), `hidden: [n, D]`; appends
    /// `n` rows to `state`. `lm_head` is the trunk's head (used unless the
    /// checkpoint has `shared_head.head`); `last_only` asks for the last
    /// row's logits only.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ops: &B,
        emb: &B::Buf,
        hidden: &B::Buf,
        n: usize,
        state: &mut MtpState<B>,
        lm_head: &Linear<B>,
        last_only: bool,
    ) -> Result<NextNOutput<B>> {
        let d = self.eh_proj.out_dim();
        let e = self.enorm.forward(ops, emb)?;
        let hn = self.hnorm.forward(ops, hidden)?;
        let x = self
            .eh_proj
            .forward(ops, &ops.concat_cols(&[(&e, d), (&hn, d)], n)?, n)?;
        let a = self.input_norm.forward(ops, &x)?;
        let (qr, q) = self.mla.queries(ops, &a, n)?;
        let cache = &mut state.cache;
        cache.latent.append(ops, &self.mla.latents(ops, &a, n)?)?;
        let ic = cache.indexer.as_mut().ok_or_else(|| {
            crate::error::EngineError::State("the NextN cache has no indexer".into())
        })?;
        let sel = self.indexer.forward(ops, &a, &qr, n, ic)?;
        let x = ops.add(&x, &self.mla.attend(ops, &q, n, cache.latent.buf(), &sel)?)?;
        let (f, _) = self
            .ffn
            .forward(ops, &self.post_norm.forward(ops, &x)?, n)?;
        let x = ops.add(&x, &f)?;
        let base = state.positions.len() as u32;
        state
            .positions
            .extend((base..base + n as u32).map(|p| [p; 3]));
        let (rows_x, m) = if last_only {
            (ops.rows(&x, d, n - 1, 1)?, 1)
        } else {
            (x.clone(), n)
        };
        let normed = self.shared_norm.forward(ops, &rows_x)?;
        let logits = self
            .head
            .as_ref()
            .unwrap_or(lm_head)
            .forward(ops, &normed, m)?;
        Ok(NextNOutput { logits, hidden: x })
    }

    /// [`NextN::forward`] for several sessions' rows at once (their draft
    /// steps; `emb` and `hidden` hold each part's `counts[i]` rows one
    /// after another), each part's last row only: the norms, `eh_proj`,
    /// the MLA query and latent projections, the FFN and the head run once
    /// over every row; each session's latent append, indexer and attention
    /// on its own cache. Every op is row-independent, so each part's
    /// logits row and `x` row have the bits of its call alone. On an error
    /// the states are partly advanced, as a failed call leaves one.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_batch(
        &self,
        ops: &B,
        emb: &B::Buf,
        hidden: &B::Buf,
        counts: &[usize],
        states: &mut [&mut MtpState<B>],
        lm_head: &Linear<B>,
    ) -> Result<NextNOutput<B>> {
        let d = self.eh_proj.out_dim();
        let n: usize = counts.iter().sum();
        let e = self.enorm.forward(ops, emb)?;
        let hn = self.hnorm.forward(ops, hidden)?;
        let x = self
            .eh_proj
            .forward(ops, &ops.concat_cols(&[(&e, d), (&hn, d)], n)?, n)?;
        let a = self.input_norm.forward(ops, &x)?;
        let (qr, q) = self.mla.queries(ops, &a, n)?;
        let latents = self.mla.latents(ops, &a, n)?;
        let split = |x: &B::Buf| split_rows(ops, x, n, counts.iter().copied());
        let (ar, qrr, qs, ls) = (split(&a)?, split(&qr)?, split(&q)?, split(&latents)?);
        let mut ys = Vec::with_capacity(counts.len());
        for ((((state, &t), ai), qri), (qi, li)) in states
            .iter_mut()
            .zip(counts)
            .zip(&ar)
            .zip(&qrr)
            .zip(qs.iter().zip(&ls))
        {
            let cache = &mut state.cache;
            cache.latent.append(ops, li)?;
            let ic = cache.indexer.as_mut().ok_or_else(|| {
                crate::error::EngineError::State("the NextN cache has no indexer".into())
            })?;
            let sel = self.indexer.forward(ops, ai, qri, t, ic)?;
            ys.push(self.mla.attend(ops, qi, t, cache.latent.buf(), &sel)?);
        }
        let x = ops.add(&x, &concat_rows(ops, ys)?)?;
        let (f, _) = self
            .ffn
            .forward(ops, &self.post_norm.forward(ops, &x)?, n)?;
        let x = ops.add(&x, &f)?;
        for (state, &t) in states.iter_mut().zip(counts) {
            let base = state.positions.len() as u32;
            state
                .positions
                .extend((base..base + t as u32).map(|p| [p; 3]));
        }
        let lasts = crate::families::draft_batch::last_rows(counts);
        let m = lasts.len();
        let last = ops.row_runs(&x, d, &lasts)?;
        let normed = self.shared_norm.forward(ops, &last)?;
        let logits = self
            .head
            .as_ref()
            .unwrap_or(lm_head)
            .forward(ops, &normed, m)?;
        Ok(NextNOutput {
            logits,
            hidden: last,
        })
    }
}
