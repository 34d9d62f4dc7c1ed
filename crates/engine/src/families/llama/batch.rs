//! Continuous batching for the llama family ([`Model::forward_batch`]):
//! several sessions' rows go through every layer together — one norm, one
//! set of projections, one SwiGLU and one head over all of them — while
//! each session attends over its own cache at its own positions. Every op
//! is row-independent (`shared/specs/backend.md`), so each session's logits
//! have the bits of its forward alone; what the batch saves is reading the
//! weights once for all sessions (a decode step is bound by that read).

use super::model::{Block, LlamaModel, LlamaState};
use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::layers::attention::AttnPart;
use crate::layers::embedding::embed_tokens;
use crate::layers::rope::RopeRows;
use crate::model::{BatchCall, ForwardOutput, LogitsRows, Model, ModelState};

impl<B: Backend> Block<B> {
    /// [`Block::forward`] for several sessions' rows (`x` holds each part's
    /// rows one after another).
    fn forward_batch(
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
    /// [`Model::forward_batch`]: the calls a forward alone would refuse run
    /// one by one (each reports its own error); the others share one eager
    /// pass through the layers — also where the backend replays a single
    /// session's steps as captured graphs (CUDA), whose bits the eager ops
    /// have.
    pub(super) fn run_batch(
        &self,
        calls: &mut [BatchCall<'_, LlamaState<B>>],
    ) -> Vec<Result<ForwardOutput>> {
        let valid: Vec<bool> = calls.iter().map(|c| self.batchable(c)).collect();
        if valid.iter().filter(|&&v| v).count() < 2 {
            return calls
                .iter_mut()
                .map(|c| self.forward(c.tokens, c.state, c.rows))
                .collect();
        }
        let mut together: Vec<&mut BatchCall<'_, LlamaState<B>>> = Vec::new();
        let mut results: Vec<Option<Result<ForwardOutput>>> = Vec::new();
        let mut slots = Vec::new();
        for (i, (c, ok)) in calls.iter_mut().zip(&valid).enumerate() {
            if *ok {
                slots.push(i);
                together.push(c);
                results.push(None);
            } else {
                // Alone: it reports its own error and leaves its state.
                results.push(Some(self.forward(c.tokens, c.state, c.rows)));
            }
        }
        match self.run_together(&mut together) {
            Ok(outs) => {
                for (slot, out) in slots.iter().zip(outs) {
                    results[*slot] = Some(Ok(out));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for slot in &slots {
                    results[*slot] = Some(Err(EngineError::State(format!(
                        "a batched forward failed: {msg}"
                    ))));
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every call has a result"))
            .collect()
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
    ) -> Result<Vec<ForwardOutput>> {
        let ops = &self.ops;
        let (hidden, vocab) = (self.cfg.hidden_size, self.cfg.vocab_size);
        let tokens: Vec<u32> = calls
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect();
        let mut x = embed_tokens(ops, &self.embed, &tokens, vocab)?;
        let ropes: Vec<RopeRows<B>> = calls
            .iter()
            .map(|c| self.rope.tables(ops, c.state.len(), c.tokens.len()))
            .collect::<Result<_>>()?;
        let rope = RopeRows::concat(ops, &ropes)?;
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
        // The rows each call wants, one after another, then one head.
        let mut wanted: Option<B::Buf> = None;
        let mut counts = Vec::with_capacity(calls.len());
        let mut at = 0;
        for c in calls.iter_mut() {
            let t = c.tokens.len();
            c.state.kv.advance(t)?;
            let (first, n) = match c.rows {
                LogitsRows::Last => (at + t - 1, 1),
                LogitsRows::All => (at, t),
            };
            let rows = ops.rows(&x, hidden, first, n)?;
            wanted = Some(match wanted {
                None => rows,
                Some(mut all) => {
                    ops.append(&mut all, &rows)?;
                    all
                }
            });
            counts.push(n);
            at += t;
        }
        let wanted = wanted.ok_or_else(|| EngineError::State("an empty batch".into()))?;
        let total: usize = counts.iter().sum();
        let logits = ops.download(&self.head.forward(
            ops,
            &self.norm.forward(ops, &wanted)?,
            total,
        )?)?;
        let mut outs = Vec::with_capacity(counts.len());
        let mut from = 0;
        for n in counts {
            outs.push(ForwardOutput {
                logits: logits[from * vocab..(from + n) * vocab].to_vec(),
                rows: n,
                vocab,
            });
            from += n;
        }
        Ok(outs)
    }
}
