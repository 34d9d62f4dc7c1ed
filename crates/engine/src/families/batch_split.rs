//! What every family's batched forward ([`crate::Model::forward_batch`])
//! does around its own layers: split the calls into those a forward alone
//! would refuse (run one by one, each reporting its own error) and those
//! that share one pass; and, after the pass, gather the rows each call
//! wants, split the one head's logits back per call and hand each call the
//! hidden rows and window record it asked for.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::model::{BatchCall, BatchOutput, BatchWant, ForwardOutput, LogitsRows};

/// Run `calls` (trunk forwards or MTP head calls): those `joins` accepts
/// together through `together` when at least two do, every other one
/// through `alone`. An error of the shared
/// pass is each of its calls' error.
pub(crate) fn split_batch<C, O>(
    calls: &mut [C],
    joins: impl Fn(&C) -> bool,
    mut alone: impl FnMut(&mut C) -> Result<O>,
    together: impl FnOnce(&mut [&mut C]) -> Result<Vec<O>>,
) -> Vec<Result<O>> {
    let ok: Vec<bool> = calls.iter().map(&joins).collect();
    if ok.iter().filter(|&&v| v).count() < 2 {
        return calls.iter_mut().map(alone).collect();
    }
    let mut shared = Vec::new();
    let mut slots = Vec::new();
    let mut results: Vec<Option<Result<O>>> = Vec::new();
    for (i, (c, ok)) in calls.iter_mut().zip(&ok).enumerate() {
        if *ok {
            slots.push(i);
            shared.push(c);
            results.push(None);
        } else {
            results.push(Some(alone(c)));
        }
    }
    match together(&mut shared) {
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
        .map(|r| r.unwrap_or_else(|| Err(EngineError::State("a call got no result".into()))))
        .collect()
}

/// Each call's result of a shared pass: its logits (from
/// [`download_logits`]), with `hidden(first, t)` — the hidden of its rows
/// `first .. first + t` of the pass — when it wants hidden rows, and
/// `record(i)` — call `i`'s window record — when it is a verify window.
pub(crate) fn batch_outputs<S, W, H>(
    logits: Vec<ForwardOutput>,
    calls: &[&mut BatchCall<'_, S>],
    mut hidden: impl FnMut(usize, usize) -> Result<H>,
    mut record: impl FnMut(usize) -> Result<W>,
) -> Result<Vec<BatchOutput<W, H>>> {
    let mut at = 0;
    calls
        .iter()
        .zip(logits)
        .enumerate()
        .map(|(i, (c, logits))| {
            let t = c.tokens.len();
            let first = at;
            at += t;
            let wants_hidden = c.want != BatchWant::Logits;
            Ok(BatchOutput {
                logits,
                hidden: if wants_hidden {
                    Some(hidden(first, t)?)
                } else {
                    None
                },
                record: if c.want == BatchWant::Window {
                    Some(record(i)?)
                } else {
                    None
                },
            })
        })
        .collect()
}

/// The rows of `x: [Σt, width]` each call wants (its last, or all of its
/// `t`), one call after another, and how many per call.
pub(crate) fn wanted_rows<B: Backend, S>(
    ops: &B,
    x: &B::Buf,
    width: usize,
    calls: &[&mut BatchCall<'_, S>],
) -> Result<(B::Buf, Vec<usize>)> {
    if calls.is_empty() {
        return Err(EngineError::State("an empty batch".into()));
    }
    let mut runs = Vec::with_capacity(calls.len());
    let mut at = 0;
    for c in calls {
        let t = c.tokens.len();
        runs.push(match c.rows {
            LogitsRows::Last => (at + t - 1, 1),
            LogitsRows::All => (at, t),
        });
        at += t;
    }
    let counts = runs.iter().map(|r| r.1).collect();
    // Every row, in order (a batch of decode steps): `x` itself.
    let every = runs
        .iter()
        .try_fold(0, |next, &(first, n)| (first == next).then_some(first + n));
    let wanted = if every == Some(at) {
        x.clone()
    } else {
        ops.row_runs(x, width, &runs)?
    };
    Ok((wanted, counts))
}

/// A batch's logits `[Σ counts, vocab]` read back straight into each
/// call's output (`counts[i]` rows each): one host copy of the values
/// ([`Backend::download_parts`]).
pub(crate) fn download_logits<B: Backend>(
    ops: &B,
    logits: &B::Buf,
    vocab: usize,
    counts: &[usize],
) -> Result<Vec<ForwardOutput>> {
    let lens: Vec<usize> = counts.iter().map(|&n| n * vocab).collect();
    Ok(ops
        .download_parts(logits, &lens)?
        .into_iter()
        .zip(counts)
        .map(|(logits, &rows)| ForwardOutput {
            logits,
            rows,
            vocab,
        })
        .collect())
}

/// Whether a forward alone would accept `tokens` after `len` tokens of
/// context: some tokens, all within the vocabulary, and room for them.
pub(crate) fn accepts(tokens: &[u32], len: usize, context: usize, vocab: usize) -> bool {
    !tokens.is_empty()
        && len + tokens.len() <= context
        && tokens.iter().all(|&t| (t as usize) < vocab)
}

/// `parts` (rows of one width) one after another ([`Backend::concat_rows`],
/// one launch on a device). Its unit is the largest length every part is
/// a multiple of: a concatenation is the same copy whatever whole unit it
/// moves, and the parts need not say their width.
pub(crate) fn concat_rows<B: Backend>(ops: &B, parts: Vec<B::Buf>) -> Result<B::Buf> {
    if parts.is_empty() {
        return Err(EngineError::State("an empty batch".into()));
    }
    let unit = parts.iter().map(|p| ops.len(p)).fold(0, gcd).max(1);
    ops.concat_rows(parts, unit)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `x: [rows, width]` cut into consecutive parts of `counts` rows.
pub(crate) fn split_rows<B: Backend>(
    ops: &B,
    x: &B::Buf,
    rows: usize,
    counts: impl IntoIterator<Item = usize>,
) -> Result<Vec<B::Buf>> {
    let width = ops.len(x) / rows.max(1);
    let counts: Vec<usize> = counts.into_iter().collect();
    ops.split_rows(x, width, &counts)
}
