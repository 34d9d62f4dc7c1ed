//! What every family's batched MTP head ([`crate::Model::mtp_forward_batch`])
//! does around its own layer: which draft steps share the pass (those the
//! head alone would accept), the pass's inputs (every call's tokens and
//! hidden rows one after another), each call's last row, and each call's
//! [`MtpStep`] from one head over those rows.

use crate::backend::Backend;
use crate::error::Result;
use crate::families::batch_split::{accepts, concat_rows, download_logits};
use crate::model::{DeviceRows, HiddenRows, MtpCall, MtpHistory, MtpStep};

/// One session's draft step in a batch of a head's calls.
pub(crate) type DraftCall<'a, B, Hist> = MtpCall<'a, DeviceRows<B>, Hist>;

/// Whether the head alone would accept `c`: tokens in the vocabulary, one
/// hidden row of `width` per token, room in the history's context.
pub(crate) fn draft_accepts<B: Backend, Hist: MtpHistory>(
    c: &DraftCall<'_, B, Hist>,
    width: usize,
    context: usize,
    vocab: usize,
) -> bool {
    c.hidden.rows() == c.tokens.len()
        && c.hidden.width() == width
        && accepts(c.tokens, c.history.len(), context, vocab)
}

/// A shared pass's inputs: every call's tokens and hidden rows, one call
/// after another, and each call's row count.
pub(crate) struct DraftInputs<B: Backend> {
    pub tokens: Vec<u32>,
    pub hidden: B::Buf,
    pub counts: Vec<usize>,
}

pub(crate) fn draft_inputs<B: Backend, Hist>(
    ops: &B,
    calls: &[&mut DraftCall<'_, B, Hist>],
) -> Result<DraftInputs<B>> {
    Ok(DraftInputs {
        tokens: calls
            .iter()
            .flat_map(|c| c.tokens.iter().copied())
            .collect(),
        hidden: concat_rows(ops, calls.iter().map(|c| c.hidden.buf().clone()).collect())?,
        counts: calls.iter().map(|c| c.tokens.len()).collect(),
    })
}

/// `(row, 1)`: each call's last row in a pass of `counts[i]` rows a call.
pub(crate) fn last_rows(counts: &[usize]) -> Vec<(usize, usize)> {
    let mut at = 0;
    counts
        .iter()
        .map(|&t| {
            at += t;
            (at - 1, 1)
        })
        .collect()
}

/// Each call's step from one head's `logits: [m, vocab]` over the calls'
/// last rows and those rows `last: [m, width]` (the next depth's input).
pub(crate) fn draft_steps<B: Backend>(
    ops: &B,
    logits: &B::Buf,
    vocab: usize,
    last: &B::Buf,
    width: usize,
) -> Result<Vec<MtpStep<DeviceRows<B>>>> {
    let m = ops.len(last) / width.max(1);
    download_logits(ops, logits, vocab, &vec![1; m])?
        .into_iter()
        .enumerate()
        .map(|(i, out)| {
            Ok(MtpStep {
                logits: out.logits,
                hidden: DeviceRows::new(ops, ops.rows(last, width, i, 1)?, 1, width)?,
            })
        })
        .collect()
}
