//! Continuous batching for GLM-5 ([`Model::forward_batch`]): several
//! sessions' rows go through each layer together while each session's own
//! state is touched only by its own rows.
//!
//! Shared over every session's rows (one weight read for all): the token
//! embedding, the mHC mixes and combines, the input and post-attention
//! norms, KDA's projections, gates and gated output (`layers::kda`'s
//! `project` / `output`), MLA's query and latent projections, the query
//! absorption and the value / output projections (`layers::mla`'s
//! `queries`, `latents`, `absorb`, `output`), the pooled indexer's keys,
//! gates, queries and head weights (`project_rows`), the whole FFN (dense
//! SwiGLU, or router, routed and shared experts), and the final mean,
//! norm and head over the rows each call wants. Up to `PURE_MAX_ROWS` rows
//! the shared parts of a layer run as the forward alone's two pure units
//! (`DecoderLayer::mixer_rows`, `out_and_ffn`: on CUDA, replayed graphs).
//!
//! Per session, on its rows: KDA's conv window, q / k norms and
//! recurrence (`recur`), the MLA latent append, the pooled indexer's
//! appends, pools and selection over its own cache (`select_rows`; or, on
//! a shared-indexer layer, the session's selection from the layer before)
//! and the gathered attention over its own latents (`attend_latent`).
//! NoPE: nothing else depends on positions.
//!
//! Every op is row-independent (`shared/specs/backend.md`), so each
//! session's logits have the bits of its forward alone
//! (`tests/batching.rs`). Verify windows share the pass too, each KDA
//! layer recording the window's replay from the session's own recurrence
//! (as alone); the NextN head never comes through here. Calls a forward
//! alone would refuse run alone through `split_batch`, each reporting its
//! own error.

use super::layer::{DecoderLayer, Mixer, MixerRows, mismatch};
use super::model::Glm5NextModel;
use super::state::{Glm5NextState, LayerCache, MtpState, WindowCapture};
use crate::backend::{Backend, PURE_MAX_ROWS};
use crate::error::{EngineError, Result};
use crate::families::batch_split::{
    accepts, batch_outputs, concat_rows as concat, download_logits, split_batch, split_rows,
    wanted_rows,
};
use crate::families::draft_batch;
use crate::layers::delta_rule::DeltaReplay;
use crate::model::{BatchCall, BatchResult, BatchWant, DeviceRows, Model, MtpStep, forward_alone};

/// One session's part of a batched layer: its rows, the layer's cache,
/// its selection from the layer before (replaced by this layer's) and,
/// for a verify window on a KDA layer, where its replay goes.
struct Part<'a, B: Backend> {
    rows: usize,
    cache: &'a mut LayerCache<B>,
    selection: &'a mut Option<B::Selection>,
    capture: Option<&'a mut Option<DeltaReplay<B>>>,
}

/// Each part's rows of `x: [Σt, width]`.
fn split<B: Backend>(
    ops: &B,
    x: &B::Buf,
    rows: usize,
    parts: &[Part<'_, B>],
) -> Result<Vec<B::Buf>> {
    split_rows(ops, x, rows, parts.iter().map(|p| p.rows))
}

impl<B: Backend> DecoderLayer<B> {
    /// `DecoderLayer::forward` for several sessions' rows (`xs` holds each
    /// part's streams one after another), without trace: the mixer's
    /// row-wise inputs and its output rows with the FFN half run over every
    /// row (as pure units keyed by `unit` up to [`PURE_MAX_ROWS`] rows, as
    /// a forward alone runs them), each session's cache ops on its own rows.
    fn forward_batch(
        &self,
        ops: &B,
        xs: &B::Buf,
        parts: &mut [Part<'_, B>],
        unit: [u64; 2],
    ) -> Result<B::Buf> {
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let unit = (rows <= PURE_MAX_ROWS).then_some(unit);
        let (mix, projected) = self.mixer_rows(ops, xs, rows, unit)?;
        let (o, z) = match (&self.mixer, projected) {
            (Mixer::Kda(kda), MixerRows::Kda([u, g, beta, z])) => {
                let (u, g, beta) = (
                    split(ops, &u, rows, parts)?,
                    split(ops, &g, rows, parts)?,
                    split(ops, &beta, rows, parts)?,
                );
                // Each session's inputs (its conv window), then every
                // session's scan over its own state in one op, then each
                // verify window's replay record.
                let mut pending = Vec::with_capacity(parts.len());
                for (((p, u), g), beta) in parts.iter_mut().zip(u).zip(g).zip(beta) {
                    let LayerCache::Kda(c) = &mut *p.cache else {
                        return Err(mismatch());
                    };
                    let before = p.capture.is_some().then(|| c.clone());
                    let inputs = kda.scan_inputs(ops, &u, g, beta, p.rows, c)?;
                    pending.push((inputs, u, before));
                    *p.selection = None;
                }
                let o = {
                    let mut caches = Vec::with_capacity(parts.len());
                    for p in parts.iter_mut() {
                        let LayerCache::Kda(c) = &mut *p.cache else {
                            return Err(mismatch());
                        };
                        caches.push(c);
                    }
                    let inputs: Vec<_> = pending.iter().map(|x| &x.0).collect();
                    kda.shape().scan_parts(ops, &inputs, &mut caches)?
                };
                for (p, (inputs, u, before)) in parts.iter_mut().zip(pending) {
                    if let (Some(cap), Some(before)) = (p.capture.as_deref_mut(), before) {
                        *cap = Some(kda.shape().replay(before, u, inputs));
                    }
                }
                (o, Some(z))
            }
            (Mixer::Mla { mla, indexer }, MixerRows::Mla { q, latents, index }) => {
                // The indexer's rows split by session: each session's pools
                // and selection on its own cache.
                let index: Vec<Option<[B::Buf; 4]>> = match index {
                    Some([k, g, iq, w]) => {
                        let (k, g) = (split(ops, &k, rows, parts)?, split(ops, &g, rows, parts)?);
                        let (iq, w) = (split(ops, &iq, rows, parts)?, split(ops, &w, rows, parts)?);
                        k.into_iter()
                            .zip(g)
                            .zip(iq)
                            .zip(w)
                            .map(|(((k, g), q), w)| Some([k, g, q, w]))
                            .collect()
                    }
                    None => parts.iter().map(|_| None).collect(),
                };
                let (q, latents) = (
                    split(ops, &q, rows, parts)?,
                    split(ops, &latents, rows, parts)?,
                );
                let mut os = Vec::with_capacity(parts.len());
                for (((p, ixi), qi), li) in parts.iter_mut().zip(index).zip(&q).zip(&latents) {
                    let LayerCache::Mla(c) = &mut *p.cache else {
                        return Err(mismatch());
                    };
                    c.latent.append(ops, li)?;
                    let sel = match (indexer, c.indexer.as_mut(), ixi) {
                        (Some(ix), Some(ic), Some(ixi)) => ix.select_rows(ops, &ixi, p.rows, ic)?,
                        (None, None, None) => p.selection.clone().ok_or_else(|| {
                            EngineError::State(
                                "a shared-indexer layer got no selection from the layer before"
                                    .into(),
                            )
                        })?,
                        _ => return Err(mismatch()),
                    };
                    os.push(mla.attend_latent(ops, qi, c.latent.buf(), &sel)?);
                    *p.selection = Some(sel);
                }
                (concat(ops, os)?, None)
            }
            _ => return Err(mismatch()),
        };
        let (xs, _) = self.out_and_ffn(ops, xs, &o, z.as_ref(), &mix, rows, unit)?;
        Ok(xs)
    }
}

impl<B: Backend> Glm5NextModel<B> {
    /// [`crate::Model::forward_batch`]: calls a forward alone would refuse
    /// (no tokens, past the context, a token outside the vocabulary) run
    /// one by one, each reporting its own error; the others share one
    /// pass. On an error the batch's states are partly advanced, as a
    /// failed forward leaves one (the decode loops reset such a session).
    pub(super) fn run_batch(
        &self,
        calls: &mut [BatchCall<'_, Glm5NextState<B>>],
    ) -> Vec<Result<BatchResult<Self>>> {
        split_batch(
            calls,
            |c| {
                accepts(
                    c.tokens,
                    c.state.len,
                    self.cfg.context_length,
                    self.cfg.vocab_size,
                )
            },
            |c| forward_alone(self, c),
            |shared| self.run_together(shared),
        )
    }

    fn run_together(
        &self,
        calls: &mut [&mut BatchCall<'_, Glm5NextState<B>>],
    ) -> Result<Vec<BatchResult<Self>>> {
        let ops = &self.ops;
        let (n, d, vocab) = (self.cfg.hc_mult, self.cfg.hidden_size, self.cfg.vocab_size);
        let bases: Vec<usize> = calls.iter().map(|c| c.state.len).collect();
        // Each verify window's KDA replays, one per KDA layer.
        let mut replays: Vec<Vec<DeltaReplay<B>>> = calls.iter().map(|_| Vec::new()).collect();
        let tokens: Vec<u32> = calls
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let mut xs = ops.tile_streams(&self.embed_from(None, &tokens)?, n, d)?;
        let mut selections: Vec<Option<B::Selection>> = calls.iter().map(|_| None).collect();
        for (l, layer) in self.layers.iter().enumerate() {
            let kda = matches!(layer.mixer, Mixer::Kda(_));
            let mut slots: Vec<Option<DeltaReplay<B>>> = calls.iter().map(|_| None).collect();
            let mut parts: Vec<Part<'_, B>> = calls
                .iter_mut()
                .zip(selections.iter_mut())
                .zip(slots.iter_mut())
                .map(|((call, selection), slot)| Part {
                    rows: call.tokens.len(),
                    capture: (kda && call.want == BatchWant::Window).then_some(slot),
                    cache: &mut call.state.layers[l],
                    selection,
                })
                .collect();
            xs = layer.forward_batch(ops, &xs, &mut parts, [self.scope, l as u64])?;
            drop(parts);
            for ((call, slot), r) in calls.iter().zip(slots).zip(replays.iter_mut()) {
                if kda && call.want == BatchWant::Window {
                    r.push(slot.ok_or_else(|| {
                        EngineError::State("a KDA layer recorded no window replay".into())
                    })?);
                }
            }
        }
        for call in calls.iter_mut() {
            call.state.len += call.tokens.len();
        }
        // The final hidden of every row (mean and norm are per row), then
        // one head over the rows each call wants.
        let hidden = self.norm.forward(ops, &ops.mean_streams(&xs, n, d)?)?;
        let (wanted, counts) = wanted_rows(ops, &hidden, d, calls)?;
        let total: usize = counts.iter().sum();
        let all = self.logits_on_device(&wanted, total)?;
        // The NextN head reads the final hidden of a window's rows.
        batch_outputs(
            download_logits(ops, &all, vocab, &counts)?,
            calls,
            |first, t| self.hidden_rows(ops.rows(&hidden, d, first, t)?, t),
            |i| {
                Ok(WindowCapture {
                    base: bases[i],
                    rows: calls[i].tokens.len(),
                    kda: std::mem::take(&mut replays[i]),
                })
            },
        )
    }
}

type DraftCall<'a, B> = draft_batch::DraftCall<'a, B, MtpState<B>>;

impl<B: Backend> Glm5NextModel<B> {
    /// [`Model::mtp_forward_batch`]: the calls the head alone would refuse
    /// run one by one (each reports its own error); the others share one
    /// pass of the NextN head ([`super::mtp::NextN::forward_batch`]).
    pub(super) fn run_mtp_batch(
        &self,
        calls: &mut [DraftCall<'_, B>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        let alone =
            |c: &mut DraftCall<'_, B>| Model::mtp_forward(self, c.tokens, c.hidden, c.history);
        let Some(head) = self.mtp.as_deref() else {
            return calls.iter_mut().map(alone).collect();
        };
        let (d, context, vocab) = (
            self.cfg.hidden_size,
            self.cfg.context_length,
            self.cfg.vocab_size,
        );
        split_batch(
            calls,
            |c| draft_batch::draft_accepts(c, d, context, vocab),
            alone,
            |shared| {
                let ops = &self.ops;
                let inputs = draft_batch::draft_inputs(ops, shared)?;
                let emb = self.embed_from(head.embed.as_ref(), &inputs.tokens)?;
                let mut states: Vec<&mut MtpState<B>> =
                    shared.iter_mut().map(|c| &mut *c.history).collect();
                let out = head.forward_batch(
                    ops,
                    &emb,
                    &inputs.hidden,
                    &inputs.counts,
                    &mut states,
                    &self.lm_head,
                )?;
                draft_batch::draft_steps(ops, &out.logits, vocab, &out.hidden, d)
            },
        )
    }
}
