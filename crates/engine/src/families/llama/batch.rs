//! Continuous batching for the llama family ([`Model::forward_batch`]):
//! several sessions' rows go through every layer together — one norm, one
//! set of projections, one SwiGLU and one head over all of them — while
//! each session attends over its own cache at its own positions. Every op
//! is row-independent (`shared/specs/backend.md`), so each session's logits
//! have the bits of its forward alone; what the batch saves is reading the
//! weights once for all sessions (a decode step is bound by that read).

use super::model::{Block, LlamaModel, LlamaState, LlamaWindow};
use super::mtp::{LlamaMtpHistory, MtpHead};
use crate::backend::Backend;
use crate::error::Result;
use crate::families::batch_split::{batch_outputs, download_logits, split_batch, wanted_rows};
use crate::families::draft_batch;
use crate::layers::attention::AttnPart;
use crate::layers::embedding::embed_tokens;
use crate::layers::rope::RopeRows;
use crate::model::{BatchCall, BatchResult, DeviceRows, Model, ModelState, MtpStep, forward_alone};

impl<B: Backend> Block<B> {
    /// [`Block::forward`] for several sessions' rows (`x` holds each part's
    /// rows one after another; the trunk's layers and the MTP head's).
    pub(super) fn forward_batch(
        &self,
        ops: &B,
        x: B::Buf,
        rope: &RopeRows<B>,
        parts: &mut [AttnPart<'_, B>],
        layer: usize,
    ) -> Result<B::Buf> {
        let total: usize = parts.iter().map(|p| p.t).sum();
        let h =
            self.attn
                .forward_batch(ops, &self.attn_norm.forward(ops, &x)?, rope, parts, layer)?;
        let x = ops.add(&x, &h)?;
        let h = self
            .mlp
            .forward(ops, &self.mlp_norm.forward(ops, &x)?, total)?;
        ops.add(&x, &h)
    }
}

impl<B: Backend> LlamaModel<B> {
    /// [`crate::Model::forward_batch`]: the calls a forward alone would
    /// refuse run one by one (each reports its own error); the others —
    /// decode steps, prefill chunks and verify windows alike — share one
    /// eager pass through the layers — also where the backend replays a
    /// single session's steps as captured graphs (CUDA), whose bits the
    /// eager ops have.
    pub(super) fn run_batch(
        &self,
        calls: &mut [BatchCall<'_, LlamaState<B>>],
    ) -> Vec<Result<BatchResult<Self>>> {
        split_batch(
            calls,
            |c| self.batchable(c),
            |c| forward_alone(self, c),
            |shared| self.run_together(shared),
        )
    }

    /// Whether a call can join a batch: what [`LlamaModel::forward`] would
    /// accept (tokens in range, within the context).
    fn batchable(&self, c: &BatchCall<'_, LlamaState<B>>) -> bool {
        let t = c.tokens.len();
        t > 0
            && c.state.len() + t <= self.cfg.context_length
            && c.state.len() + t <= self.rope.max_positions()
            && c.tokens.iter().all(|&x| (x as usize) < self.cfg.vocab_size)
    }

    /// One pass of every call's rows through the layers and the head. On
    /// an error every cache is as it was.
    fn run_together(
        &self,
        calls: &mut [&mut BatchCall<'_, LlamaState<B>>],
    ) -> Result<Vec<BatchResult<Self>>> {
        let ops = &self.ops;
        let starts: Vec<usize> = calls.iter().map(|c| c.state.len()).collect();
        let (hidden, vocab) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let tokens: Vec<u32> = calls
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let mut x = embed_tokens(ops, &self.embed, &tokens, vocab)?;
        let runs: Vec<(usize, usize)> = calls
            .iter()
            .map(|c| (c.state.len(), c.tokens.len()))
            .collect();
        let rope = self.rope.tables_runs(ops, &runs)?;
        for (i, b) in self.blocks.iter().enumerate() {
            let mut parts: Vec<AttnPart<'_, B>> = calls
                .iter_mut()
                .map(|c| AttnPart {
                    t: c.tokens.len(),
                    cache: &mut c.state.kv,
                })
                .collect();
            let y = b.forward_batch(ops, x, &rope, &mut parts, i);
            drop(parts);
            match y {
                Ok(y) => x = y,
                Err(e) => {
                    for c in calls.iter_mut() {
                        c.state.kv.rollback()?;
                    }
                    return Err(e);
                }
            }
        }
        for c in calls.iter_mut() {
            c.state.kv.advance(c.tokens.len())?;
        }
        // The rows each call wants, one after another, then one head.
        let (wanted, counts) = wanted_rows(ops, &x, hidden, calls)?;
        let total: usize = counts.iter().sum();
        let logits = self
            .head
            .forward(ops, &self.norm.forward(ops, &wanted)?, total)?;
        // The MTP head reads the pre-norm hidden of a window's rows.
        batch_outputs(
            download_logits(ops, &logits, vocab, &counts)?,
            calls,
            |first, t| self.hidden_rows(ops.rows(&x, hidden, first, t)?, t),
            |i| {
                Ok(LlamaWindow {
                    start: starts[i],
                    rows: calls[i].tokens.len(),
                })
            },
        )
    }
}

type DraftCall<'a, B> = draft_batch::DraftCall<'a, B, LlamaMtpHistory<B>>;

impl<B: Backend> LlamaModel<B> {
    /// [`Model::mtp_forward_batch`]: the calls the head alone would refuse
    /// run one by one (each reports its own error); the others share one
    /// pass of the head ([`MtpHead::forward_batch`]).
    pub(super) fn run_mtp_batch(
        &self,
        calls: &mut [DraftCall<'_, B>],
    ) -> Vec<Result<MtpStep<DeviceRows<B>>>> {
        let alone = |c: &mut DraftCall<'_, B>| self.mtp_forward(c.tokens, c.hidden, c.history);
        let Some(head) = self.mtp_head() else {
            return calls.iter_mut().map(alone).collect();
        };
        // The positions the rope tables reach bound the context too.
        let context = self.cfg.context_length.min(self.rope.max_positions());
        let (width, vocab) = (self.cfg.hidden_size, self.cfg.vocab_size);
        split_batch(
            calls,
            |c| draft_batch::draft_accepts(c, width, context, vocab),
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
        let inputs = draft_batch::draft_inputs(ops, calls)?;
        let emb = embed_tokens(ops, &self.embed, &inputs.tokens, self.cfg.vocab_size)?;
        let mut histories: Vec<&mut LlamaMtpHistory<B>> =
            calls.iter_mut().map(|c| &mut *c.history).collect();
        head.forward_batch(
            ops,
            &emb,
            &inputs.hidden,
            &inputs.counts,
            &self.rope,
            &mut histories,
        )?
        .into_iter()
        .map(|(logits, last)| {
            Ok(MtpStep {
                logits,
                hidden: self.hidden_rows(last, 1)?,
            })
        })
        .collect()
    }
}
