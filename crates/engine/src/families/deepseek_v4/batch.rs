//! Continuous batching for DeepSeek-V4 ([`Model::forward_batch`]): several
//! sessions' rows go through each layer together — the hyper-connection
//! mixes and combines, the norms, the attention's query and K = V
//! projections, norms and rotations, the indexer's queries and head
//! weights, the output's inverse rotation and projections (each row
//! rotated at its own position: the batch's tables, every session's rows
//! one after another), and the whole MoE (routing, shared and routed
//! experts: one weight read for every session's rows) over all of them,
//! then one head over the rows each call wants — while each session runs
//! its window append, compressors, indexer scores and selection and sparse
//! attention over its own caches. Every op is row-independent, so each
//! session's logits have the bits of its forward alone
//! (`tests/batching.rs`).

use super::attention::{AttnCache, Rotations, RowTables};
use super::model::{DecoderLayer, DeepseekV4Model, MTP_LAYER, MtpHead};
use super::state::{DeepseekV4State, MtpState, WindowMark};
use crate::backend::Backend;
use crate::error::Result;
use crate::families::batch_split::{
    accepts, batch_outputs, concat_rows, download_logits, split_batch, split_rows, wanted_rows,
};
use crate::families::draft_batch;
use crate::model::{BatchCall, BatchResult, DeviceRows, LogitsRows, Model, MtpStep, forward_alone};

/// One session's part of a batched layer: its rows, caches and rotations.
struct Part<'a, 'r, B: Backend> {
    rows: usize,
    cache: &'a mut AttnCache<B>,
    rot: &'a Rotations<'r, B>,
}

impl<B: Backend> DecoderLayer<B> {
    /// [`DecoderLayer::forward`] for several sessions' rows (`xs` holds
    /// each part's streams one after another; `tokens` their ids).
    fn forward_batch(
        &self,
        ops: &B,
        xs: &B::Buf,
        tokens: &[u32],
        parts: &mut [Part<'_, '_, B>],
        tables: &RowTables<B>,
        unit: [u64; 2],
    ) -> Result<B::Buf> {
        let rows = tokens.len();
        let attn = &self.attn;
        let [rotate, inverse] = attn.kind_tables(
            [&tables.main[0], &tables.main[1]],
            [&tables.compress[0], &tables.compress[1]],
        );
        // The mix, norm, query and K = V projections, norms and rotations
        // and the indexer's queries and head weights over every row; each
        // session's caches, compressors, selection and attention on its own
        // rows (split and joined in one launch a buffer on a device:
        // `Backend::split_rows` / `concat_rows`); the output's inverse
        // rotation and projections and the MoE half over every row.
        let counts: Vec<usize> = parts.iter().map(|p| p.rows).collect();
        let (normed, mix, projected) =
            self.attn_rows_in(ops, xs, rows, [rotate, &tables.compress[0]], unit)?;
        let (xis, each) = (
            split_rows(ops, &normed, rows, counts.iter().copied())?,
            projected.split(ops, rows, &counts)?,
        );
        drop((normed, projected));
        let mut os = Vec::with_capacity(parts.len());
        for ((p, xi), pi) in parts.iter_mut().zip(&xis).zip(&each) {
            let (oi, _) = attn.attend_cached(ops, xi, pi, p.rows, p.cache, p.rot)?;
            os.push(oi);
        }
        drop((xis, each));
        for p in parts.iter_mut() {
            p.cache.trim(ops)?;
        }
        self.out_and_ffn(ops, xs, concat_rows(ops, os)?, &mix, inverse, tokens, unit)
    }
}

impl<B: Backend> DeepseekV4Model<B> {
    /// [`crate::Model::forward_batch`]: calls a forward alone would refuse
    /// run one by one (each reports its own error); the others (decode
    /// steps, prefill chunks, verify windows) share one pass. On an error
    /// the batch's states are partly advanced, as a failed forward leaves
    /// one (the decode loops reset such a session).
    pub(super) fn run_batch(
        &self,
        calls: &mut [BatchCall<'_, DeepseekV4State<B>>],
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
        calls: &mut [&mut BatchCall<'_, DeepseekV4State<B>>],
    ) -> Result<Vec<BatchResult<Self>>> {
        let ops = &self.ops;
        let (c, h, vocab) = (self.cfg.hc_mult, self.cfg.hidden_size, self.cfg.vocab_size);
        let bases: Vec<usize> = calls.iter().map(|c| c.state.len).collect();
        let tokens: Vec<u32> = calls
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let x = self.embed(&tokens)?;
        let mut xs = ops.tile_streams(&x, c, h)?;
        let rots: Vec<Rotations<'_, B>> = calls
            .iter()
            .map(|call| self.ropes.for_rows(ops, call.state.len, call.tokens.len()))
            .collect::<Result<_>>()?;
        let positions: Vec<usize> = calls
            .iter()
            .flat_map(|c| c.state.len..c.state.len + c.tokens.len())
            .collect();
        let tables = self.ropes.for_positions(ops, &positions)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut parts: Vec<Part<'_, '_, B>> = calls
                .iter_mut()
                .zip(&rots)
                .map(|(call, rot)| Part {
                    rows: call.tokens.len(),
                    cache: &mut call.state.layers[l],
                    rot,
                })
                .collect();
            xs = layer.forward_batch(
                ops,
                &xs,
                &tokens,
                &mut parts,
                &tables,
                [self.scope, l as u64],
            )?;
        }
        for call in calls.iter_mut() {
            call.state.len += call.tokens.len();
        }
        // The streams each call wants, one after another, then one head.
        let (wanted, counts) = wanted_rows(ops, &xs, c * h, calls)?;
        let total: usize = counts.iter().sum();
        let (all, _) =
            self.logits_on_device(&wanted, total, &self.hc_head, &self.norm, LogitsRows::All)?;
        // The MTP head reads a window's pre-head streams.
        batch_outputs(
            download_logits(&self.ops, &all, vocab, &counts)?,
            calls,
            |first, t| self.hidden(ops.rows(&xs, c * h, first, t)?, t),
            |i| {
                Ok(WindowMark {
                    base: bases[i],
                    rows: calls[i].tokens.len(),
                })
            },
        )
    }
}

type DraftCall<'a, B> = draft_batch::DraftCall<'a, B, MtpState<B>>;

impl<B: Backend> DeepseekV4Model<B> {
    /// [`Model::mtp_forward_batch`]: the calls the head alone would refuse
    /// run one by one (each reports its own error); the others share one
    /// pass of the head — the e/h projections, the layer's
    /// hyper-connections and MoE and the head over every session's rows,
    /// each session's sliding attention on its own cache. On an error the
    /// histories are partly advanced, as a failed call leaves one.
    pub(super) fn run_mtp_batch(
        &self,
        calls: &mut [DraftCall<'_, B>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        let alone =
            |c: &mut DraftCall<'_, B>| Model::mtp_forward(self, c.tokens, c.hidden, c.history);
        let Some(head) = self.mtp.as_deref() else {
            return calls.iter_mut().map(alone).collect();
        };
        let (nd, context, vocab) = (
            self.cfg.hc_mult * self.cfg.hidden_size,
            self.cfg.context_length,
            self.cfg.vocab_size,
        );
        split_batch(
            calls,
            |c| draft_batch::draft_accepts(c, nd, context, vocab),
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
        let (c, h) = (self.cfg.hc_mult, self.cfg.hidden_size);
        let inputs = draft_batch::draft_inputs(ops, calls)?;
        let n = inputs.tokens.len();
        let e = head.e_proj.forward(
            ops,
            &head.enorm.forward(ops, &self.embed(&inputs.tokens)?)?,
            n,
        )?;
        let hs = head
            .h_proj
            .forward(ops, &head.hnorm.forward(ops, &inputs.hidden)?, n * c)?;
        let x0 = ops.add(&hs, &ops.tile_streams(&e, c, h)?)?;
        let mut rots = Vec::with_capacity(calls.len());
        let mut positions = Vec::with_capacity(n);
        for call in calls.iter_mut() {
            let t = call.tokens.len();
            let base = call.history.positions.len() as u32;
            rots.push(self.ropes.for_rows(ops, base as usize, t)?);
            positions.extend(base as usize..base as usize + t);
            call.history
                .positions
                .extend((base..base + t as u32).map(|p| [p; 3]));
        }
        let mut parts: Vec<Part<'_, '_, B>> = calls
            .iter_mut()
            .zip(&rots)
            .map(|(call, rot)| Part {
                rows: call.tokens.len(),
                cache: &mut call.history.cache,
                rot,
            })
            .collect();
        let tables = self.ropes.for_positions(ops, &positions)?;
        let x1 = head.layer.forward_batch(
            ops,
            &x0,
            &inputs.tokens,
            &mut parts,
            &tables,
            [self.scope, MTP_LAYER],
        )?;
        drop(parts);
        // Each call's last row, then one head over them.
        let lasts = draft_batch::last_rows(&inputs.counts);
        let last = ops.row_runs(&x1, c * h, &lasts)?;
        let (all, _) = self.logits_on_device(
            &last,
            lasts.len(),
            &head.hc_head,
            &head.norm,
            LogitsRows::All,
        )?;
        draft_batch::draft_steps(ops, &all, self.cfg.vocab_size, &last, c * h)
    }
}
