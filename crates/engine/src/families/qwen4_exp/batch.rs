//! Continuous batching for Qwen4-Exp ([`Model::forward_batch`]): several
//! sessions' rows go through each layer together while each session's own
//! state is touched only by its own rows.
//!
//! Shared over every session's rows (one weight read for all, one launch
//! for the row-wise ops): the token embedding, the hyper-connection mixes,
//! combines and norms, the Gated DeltaNet projections
//! (`in_proj_qkv/z/b/a`), its gated norm and `out_proj`, the QSA
//! indexer's projection, q norm and RoPE, the gated attention's q / k / v
//! projections, q / k norms, RoPE, output gate and `o_proj`, the whole MoE
//! half (router, experts, shared expert), the final mixer and the head over
//! the rows each call wants. The RoPE tables of every new row are built
//! once (a row's table depends on its position alone).
//!
//! Per session, on its rows: its M-RoPE positions (a text token continues
//! after the largest position so far, so a session that saw an image keeps
//! its offset), the PLE n-gram ids and value conv (its gather,
//! projections, norms and gate are shared), the DeltaNet conv window and
//! recurrence (the scans of every session as one op), the indexer's keys,
//! block keys and selection, the KV cache append and the gathered
//! attention.
//!
//! Every op is row-independent (`shared/specs/backend.md`), so each
//! session's logits have the bits of its forward alone
//! (`tests/batching.rs`). Verify windows share the pass too, each linear
//! layer recording the window's PLE and DeltaNet replay from the session's
//! own caches (as alone). The MTP head's draft steps have a batched pass
//! of their own (below: the head's projections, its QSA layer's shared
//! work and the mixer and head over every session's rows). Media forwards
//! never come through here (the batching model runs them alone); calls a
//! forward alone would refuse run alone through `split_batch`, each
//! reporting its own error.

use super::model::{DecoderLayer, LayerCapture, MTP_LAYER, Mixer, MtpHead, Qwen4ExpModel};
use super::state::{LayerCache, MtpState, Qwen4ExpState};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::families::batch_split::{
    accepts, batch_outputs, concat_rows as concat, download_logits, split_batch, split_rows,
    wanted_rows,
};
use crate::families::draft_batch;
use crate::layers::hyper_connections::Streams;
use crate::layers::rope::{MRope, RopeRows};
use crate::model::{BatchCall, BatchResult, BatchWant, DeviceRows, Model, MtpStep, forward_alone};

/// One session's part of a batched layer: its tokens, the layer's cache,
/// its positions (every cached one and the new rows') and, for a verify
/// window on a linear layer, the layer's record. (The new rows' RoPE
/// tables are the batch's, every part's rows at once.)
struct Part<'a, B: Backend> {
    tokens: &'a [u32],
    cache: &'a mut LayerCache<B>,
    positions: &'a [[u32; 3]],
    capture: Option<&'a mut LayerCapture<B>>,
}

/// A batch's RoPE: the model's tables (for the indexer's block keys) and
/// the tables of every new row, the parts' rows one after another (a
/// table row depends on its position alone, so each part's rows are its
/// tables alone).
struct BatchRope<'a, B: Backend> {
    tables: &'a MRope,
    rows: RopeRows<B>,
}

/// Each part's rows of `x: [Σt, width]`.
fn split<B: Backend>(
    ops: &B,
    x: &B::Buf,
    rows: usize,
    parts: &[Part<'_, B>],
) -> Result<Vec<B::Buf>> {
    split_rows(ops, x, rows, parts.iter().map(|p| p.tokens.len()))
}

fn mismatch() -> EngineError {
    EngineError::State("layer cache does not match the layer kind".into())
}

impl<B: Backend> DecoderLayer<B> {
    /// `DecoderLayer::forward` for several sessions' rows (`input` holds
    /// each part's streams one after another), without trace.
    fn forward_batch<'m>(
        &'m self,
        ops: &B,
        input: Streams<'_, B>,
        parts: &mut [Part<'_, B>],
        rope: &BatchRope<'_, B>,
        unit: [u64; 2],
    ) -> Result<Streams<'m, B>> {
        let rows: usize = parts.iter().map(|p| p.tokens.len()).sum();
        let (xs, y, inj) = match &self.mixer {
            Mixer::Gdn(gdn) => {
                for p in parts.iter_mut() {
                    if let (Some(cap), LayerCache::Linear { ple: pc, .. }) =
                        (p.capture.as_deref_mut(), &*p.cache)
                    {
                        cap.ple_before = pc.clone();
                    }
                }
                let mut input = input;
                if let Some(ple) = &self.ple {
                    // Each session's n-gram ids (its id window) and conv
                    // (its value window); the gather, projections, norms
                    // and gate over every row.
                    let xs = input.into_buf(ops)?;
                    let mut ids = Vec::with_capacity(rows);
                    let mut ids_rows = Vec::with_capacity(parts.len());
                    for p in parts.iter_mut() {
                        let LayerCache::Linear { ple: Some(pc), .. } = &mut *p.cache else {
                            return Err(mismatch());
                        };
                        let (part_ids, rows_ids) = ple.ids(p.tokens, pc, p.capture.is_some());
                        ids.extend(part_ids);
                        ids_rows.push(rows_ids);
                    }
                    let [gv, gvn] = ple.gated(ops, &xs, &ids, rows)?;
                    let (gv, gvn) = (
                        split(ops, &gv, rows, parts)?,
                        split(ops, &gvn, rows, parts)?,
                    );
                    let mut adds = Vec::with_capacity(parts.len());
                    for (((p, gv), gvn), ids_rows) in
                        parts.iter_mut().zip(gv).zip(gvn).zip(ids_rows)
                    {
                        let LayerCache::Linear { ple: Some(pc), .. } = &mut *p.cache else {
                            return Err(mismatch());
                        };
                        let capture = p.capture.as_deref_mut().map(|c| &mut c.ple);
                        adds.push(ple.conv(ops, gv, gvn, pc, capture, ids_rows)?);
                    }
                    input = Streams::ready(ops.add(&xs, &concat(ops, adds)?)?);
                }
                let (xs, x, inj) = input.mix(ops, &self.attn_hc, rows)?;
                let [u, z, beta, a] = gdn.project(ops, &x, rows)?;
                let (u, beta, a) = (
                    split(ops, &u, rows, parts)?,
                    split(ops, &beta, rows, parts)?,
                    split(ops, &a, rows, parts)?,
                );
                // Each session's inputs (its conv window), then every
                // session's scan over its own state in one op, then each
                // verify window's replay record.
                let mut pending = Vec::with_capacity(parts.len());
                for (((p, u), beta), a) in parts.iter_mut().zip(u).zip(beta).zip(&a) {
                    let LayerCache::Linear { gdn: gc, .. } = &mut *p.cache else {
                        return Err(mismatch());
                    };
                    let before = p.capture.is_some().then(|| gc.clone());
                    let inputs = gdn.scan_inputs(ops, &u, beta, a, gc)?;
                    pending.push((inputs, u, before));
                }
                let o = {
                    let mut caches = Vec::with_capacity(parts.len());
                    for p in parts.iter_mut() {
                        let LayerCache::Linear { gdn: gc, .. } = &mut *p.cache else {
                            return Err(mismatch());
                        };
                        caches.push(gc);
                    }
                    let inputs: Vec<_> = pending.iter().map(|x| &x.0).collect();
                    gdn.shape().scan_parts(ops, &inputs, &mut caches)?
                };
                for (p, (inputs, u, before)) in parts.iter_mut().zip(pending) {
                    if let (Some(cap), Some(before)) = (p.capture.as_deref_mut(), before) {
                        cap.gdn = Some(gdn.shape().replay(before, u, inputs));
                    }
                }
                let y = gdn.output(ops, &o, &z, rows)?;
                (xs, y, inj)
            }
            Mixer::Attn(attn) => {
                let (xs, x, inj) = input.mix(ops, &self.attn_hc, rows)?;
                // Each session's selection first (its indexer), as alone:
                // the indexer's projection, q norm and RoPE over every row,
                // then each session's keys and selection on its own cache.
                let (iq, ik) = attn.indexer.project_rows(ops, &x, rows, &rope.rows)?;
                let (iq, ik) = (split(ops, &iq, rows, parts)?, split(ops, &ik, rows, parts)?);
                let mut sels = Vec::with_capacity(parts.len());
                for ((p, iq), ik) in parts.iter_mut().zip(&iq).zip(&ik) {
                    let LayerCache::Attn(ac) = &mut *p.cache else {
                        return Err(mismatch());
                    };
                    let (t, ic) = (p.tokens.len(), &mut ac.indexer);
                    let sel =
                        attn.indexer
                            .select_rows(ops, [iq, ik], t, ic, p.positions, rope.tables);
                    sels.push(sel?);
                }
                // The projections, the q / gate split, the q / k norms and
                // RoPE over every row; each session's cache append and
                // attention; the gate over every row.
                let [qg, k, v] = attn.project(ops, &x, rows)?;
                let [q, gate, k] = attn.attend_rows(ops, &qg, k, rows, &rope.rows)?;
                let (q, k, v) = (
                    split(ops, &q, rows, parts)?,
                    split(ops, &k, rows, parts)?,
                    split(ops, &v, rows, parts)?,
                );
                let mut os = Vec::with_capacity(parts.len());
                for ((((p, q), k), v), sel) in parts.iter_mut().zip(&q).zip(&k).zip(&v).zip(&sels) {
                    let LayerCache::Attn(ac) = &mut *p.cache else {
                        return Err(mismatch());
                    };
                    os.push(attn.attend_cached(ops, [q, k, v], ac, sel)?);
                }
                let y = attn.output(ops, &attn.gated(ops, &concat(ops, os)?, &gate)?, rows)?;
                (xs, y, inj)
            }
        };
        let inj = inj.ok_or_else(|| {
            EngineError::State("the mixer's hyper-connection does not combine".into())
        })?;
        let (out, _) = self.moe_half(ops, xs, y, inj, rows, None, false, unit)?;
        Ok(out)
    }
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// [`crate::Model::forward_batch`]: calls a forward alone would refuse
    /// (no tokens, past the context, a token outside the vocabulary) run
    /// one by one, each reporting its own error; the others share one
    /// pass. On an error the batch's states are partly advanced, as a
    /// failed forward leaves one (the decode loops reset such a session).
    pub(super) fn run_batch(
        &self,
        calls: &mut [BatchCall<'_, Qwen4ExpState<B>>],
    ) -> Vec<Result<BatchResult<Self>>> {
        split_batch(
            calls,
            |c| {
                accepts(
                    c.tokens,
                    c.state.positions.len(),
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
        calls: &mut [&mut BatchCall<'_, Qwen4ExpState<B>>],
    ) -> Result<Vec<BatchResult<Self>>> {
        let ops = &self.ops;
        let (c, h, vocab) = (self.cfg.hc_count, self.cfg.hidden_size, self.cfg.vocab_size);
        let bases: Vec<usize> = calls.iter().map(|c| c.state.positions.len()).collect();
        // Each verify window's records, one per linear layer.
        let mut caps: Vec<Vec<LayerCapture<B>>> = calls.iter().map(|_| Vec::new()).collect();
        let tokens: Vec<u32> = calls
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let x = self.embed(&tokens)?;
        // Each session's text positions (after the largest so far, as
        // alone) and their tables.
        let mut every = Vec::with_capacity(tokens.len());
        for call in calls.iter_mut() {
            let st = &mut *call.state;
            let base = st.positions.len();
            let next = st.next_text_position();
            st.positions
                .extend((0..call.tokens.len() as u32).map(|i| [next + i; 3]));
            every.extend_from_slice(&st.positions[base..]);
        }
        let rope = BatchRope {
            tables: &self.rope,
            rows: self.rope.tables(ops, &every)?,
        };
        let mut xs = Streams::ready(ops.tile_streams(&x, c, h)?);
        for (l, layer) in self.layers.iter().enumerate() {
            let linear = matches!(layer.mixer, Mixer::Gdn(_));
            let mut slots: Vec<LayerCapture<B>> =
                calls.iter().map(|_| LayerCapture::default()).collect();
            let mut parts: Vec<Part<'_, B>> = calls
                .iter_mut()
                .zip(slots.iter_mut())
                .map(|(call, slot)| {
                    let tokens = call.tokens;
                    let window = call.want == BatchWant::Window;
                    let st = &mut *call.state;
                    Part {
                        tokens,
                        cache: &mut st.layers[l],
                        positions: &st.positions,
                        capture: (linear && window).then_some(slot),
                    }
                })
                .collect();
            xs = layer.forward_batch(ops, xs, &mut parts, &rope, [self.scope, l as u64])?;
            drop(parts);
            for ((call, slot), cap) in calls.iter().zip(slots).zip(caps.iter_mut()) {
                if linear && call.want == BatchWant::Window {
                    cap.push(slot);
                }
            }
        }
        // The final mixer's norm over every row, then the mixer and one
        // head over the rows each call wants (the norm and the mix are per
        // row, as in the head alone).
        let [streams, normed] = xs.normed(ops, &self.mixer)?;
        let (wanted, counts) = wanted_rows(ops, &normed, c * h, calls)?;
        let total: usize = counts.iter().sum();
        let (x, _) = self.mixer.mix_normed(ops, &wanted, total)?;
        let logits = self.lm_head.forward(ops, &x, total)?;
        // The MTP head reads a window's pre-mixer streams.
        batch_outputs(
            download_logits(ops, &logits, vocab, &counts)?,
            calls,
            |first, t| self.hidden(ops.rows(&streams, c * h, first, t)?, t),
            |i| {
                LayerCapture::window(
                    bases[i],
                    calls[i].tokens.len(),
                    std::mem::take(&mut caps[i]),
                )
            },
        )
    }
}

type DraftCall<'a, B> = draft_batch::DraftCall<'a, B, MtpState<B>>;

impl<B: Backend> Qwen4ExpModel<B> {
    /// [`Model::mtp_forward_batch`]: the calls the head alone would refuse
    /// run one by one (each reports its own error); the others share one
    /// pass of the head — its norms and projections, its QSA layer's
    /// hyper-connections, projections and MoE, the mixer and the head over
    /// every session's rows; each session's positions, indexer and
    /// attention on its own history. On an error the histories are partly
    /// advanced, as a failed call leaves one.
    pub(super) fn run_mtp_batch(
        &self,
        calls: &mut [DraftCall<'_, B>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        let alone =
            |c: &mut DraftCall<'_, B>| Model::mtp_forward(self, c.tokens, c.hidden, c.history);
        let Some(head) = self.mtp.as_deref() else {
            return calls.iter_mut().map(alone).collect();
        };
        let (ch, context, vocab) = (
            self.cfg.hc_count * self.cfg.hidden_size,
            self.cfg.context_length,
            self.cfg.vocab_size,
        );
        split_batch(
            calls,
            |c| draft_batch::draft_accepts(c, ch, context, vocab),
            alone,
            |shared| self.drafts_together(head, shared),
        )
    }

    fn drafts_together(
        &self,
        head: &MtpHead<B>,
        calls: &mut [&mut DraftCall<'_, B>],
    ) -> Result<Vec<MtpStep<DeviceRows<B>>>> {
        let ops = &self.ops;
        let (c, h) = (self.cfg.hc_count, self.cfg.hidden_size);
        let inputs = draft_batch::draft_inputs(ops, calls)?;
        let n = inputs.tokens.len();
        let e = head.fc_e.forward(
            ops,
            &head.pre_e.forward(ops, &self.embed(&inputs.tokens)?)?,
            n,
        )?;
        let fh = head
            .fc_h
            .forward(ops, &head.pre_h.forward(ops, &inputs.hidden)?, n * c)?;
        let x0 = ops.add(&fh, &ops.tile_streams(&e, c, h)?)?;
        // Each history's rows at its next positions (as alone: the
        // history's length onwards) and their tables.
        let mut every = Vec::with_capacity(n);
        for call in calls.iter_mut() {
            let st = &mut *call.history;
            let base = st.positions.len();
            let first = base as u32;
            st.positions
                .extend((first..first + call.tokens.len() as u32).map(|p| [p; 3]));
            every.extend_from_slice(&st.positions[base..]);
        }
        let rope = BatchRope {
            tables: &self.rope,
            rows: self.rope.tables(ops, &every)?,
        };
        let mut parts: Vec<Part<'_, B>> = calls
            .iter_mut()
            .map(|call| {
                let tokens = call.tokens;
                let st = &mut *call.history;
                Part {
                    tokens,
                    cache: &mut st.cache,
                    positions: &st.positions,
                    capture: None,
                }
            })
            .collect();
        let x1 = head.layer.forward_batch(
            ops,
            Streams::ready(x0),
            &mut parts,
            &rope,
            [self.scope, MTP_LAYER],
        )?;
        drop(parts);
        // Each call's last row through the mixer and one head.
        let [streams, normed] = x1.normed(ops, &head.mixer)?;
        let lasts = draft_batch::last_rows(&inputs.counts);
        let (x, _) =
            head.mixer
                .mix_normed(ops, &ops.row_runs(&normed, c * h, &lasts)?, lasts.len())?;
        let logits = self.lm_head.forward(ops, &x, lasts.len())?;
        let last = ops.row_runs(&streams, c * h, &lasts)?;
        draft_batch::draft_steps(ops, &logits, self.cfg.vocab_size, &last, c * h)
    }
}
