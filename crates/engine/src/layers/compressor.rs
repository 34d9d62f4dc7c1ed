//! Token compression by gated pooling (DeepSeek-V4's CSA and HCA
//! compressors and its indexer's): every complete window of `m` tokens
//! becomes one entry.
//!
//! ```text
//! c_t = W_kv·x_t,  z_t = W_gate·x_t + ape[t mod m]          [w·d] each (w = 2 with overlap)
//! HCA (no overlap):   e_w = Σ_{j<m} softmax_j(z_{wm+j}) ⊙ c_{wm+j}            per channel
//! CSA (overlap):      e_w = softmax over 2m slots of [Ca of window w−1 ; Cb of window w]
//!                     (Ca = first d channels, Cb = last d; window −1 is empty: zero kv, −∞ gate)
//! entry_w = RoPE_compress( RMSNorm(e_w) , position w·m )   on the trailing rotary dims
//! ```
//!
//! The cache keeps the raw projections of recent tokens ([`Tail`]: the open
//! window, the previous one for the overlap, and a slack for stepping back)
//! and the entries. An entry depends only on its own tokens, so it is the
//! same whichever forward completed its window.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::layers::linear::{BindLinear, Linear};
use crate::layers::norms::RmsNorm;
use crate::layers::rope::RopeFreqs;
use crate::load::binder::Binder;
use crate::state::rows::RowCache;
use crate::state::tail::Tail;
use crate::table::{NamedTensor, TableReader};

/// How many tokens a state can step back past (a verify window's rejected
/// rows, a short rewind): the caches keep this many tokens of raw rows
/// beyond what the next forward needs.
pub const STEP_BACK: usize = 128;

#[derive(Debug)]
pub struct Compressor<B: Backend> {
    kv: Linear<B>,
    gate: Linear<B>,
    /// `ape` `[m, w·d]` as a table read by `t mod m`.
    ape: B::Table,
    norm: RmsNorm<B>,
    /// Entry width `d`.
    pub dim: usize,
    /// Window `m`.
    pub ratio: usize,
    /// CSA's two overlapping series.
    pub overlap: bool,
    /// Rotated trailing dims of an entry.
    rope_dim: usize,
}

/// A compressor's cache.
#[derive(Debug, Clone)]
pub struct CompressorCache<B: Backend> {
    /// Raw `c_t` and `z_t + ape`, `[·, w·d]`.
    pub kv: Tail<B>,
    pub gate: Tail<B>,
    /// `[⌊len/m⌋, d]`.
    pub entries: RowCache<B>,
    ratio: usize,
    overlap: bool,
}

impl<B: Backend> Compressor<B> {
    /// Bound under `w`'s scope (`…attn.compressor`: `wkv`, `wgate`, `ape`,
    /// `norm`) for inputs of width `h`.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &mut Binder<'_, B>,
        h: usize,
        dim: usize,
        ratio: usize,
        overlap: bool,
        rope_dim: usize,
        eps: f32,
    ) -> Result<Self> {
        let width = if overlap { 2 * dim } else { dim };
        let ape = w.raw("ape", &[ratio, width])?;
        Ok(Self {
            kv: w.linear("wkv", width, h)?,
            gate: w.linear("wgate", width, h)?,
            ape: w.ops().table(ape, ratio, width)?,
            norm: RmsNorm::load(w, "norm.weight", dim, eps as f64)?,
            dim,
            ratio,
            overlap,
            rope_dim,
        })
    }

    pub fn new_cache(&self, ops: &B) -> Result<CompressorCache<B>> {
        let width = if self.overlap { 2 * self.dim } else { self.dim };
        Ok(CompressorCache {
            kv: Tail::new(ops, width)?,
            gate: Tail::new(ops, width)?,
            entries: RowCache::new(ops, self.dim)?,
            ratio: self.ratio,
            overlap: self.overlap,
        })
    }

    /// Append the new tokens `x: [rows, h]` (tokens `cache.len() ..`) and
    /// every entry they complete.
    pub fn forward(
        &self,
        ops: &B,
        x: &B::Buf,
        rows: usize,
        cache: &mut CompressorCache<B>,
        rope: &RopeFreqs,
    ) -> Result<()> {
        let (m, d) = (self.ratio, self.dim);
        let base = cache.kv.len();
        let slots: Vec<u32> = (base..base + rows).map(|t| (t % m) as u32).collect();
        let kv = self.kv.forward(ops, x, rows)?;
        let gate = ops.add(
            &self.gate.forward(ops, x, rows)?,
            &ops.gather_rows(&self.ape, &slots)?,
        )?;
        cache.kv.append(ops, &kv)?;
        cache.gate.append(ops, &gate)?;
        let (e0, e1) = (cache.entries.rows(), cache.kv.len() / m);
        if e1 > e0 {
            let (kv, gate) = if self.overlap {
                self.overlap_slots(ops, cache, e0, e1)?
            } else {
                (
                    cache.kv.range(ops, e0 * m, e1 * m)?,
                    cache.gate.range(ops, e0 * m, e1 * m)?,
                )
            };
            let slots = if self.overlap { 2 * m } else { m };
            let pooled = ops.softmax_pool(&kv, &gate, slots, d)?;
            let mut e = self.norm.forward(ops, &pooled)?;
            rope.tables(ops, (e0..e1).map(|w| w * m), false)?
                .apply_trailing(ops, &mut e, d, self.rope_dim)?;
            cache.entries.append(ops, &e)?;
        }
        cache.trim(ops)
    }

    /// `[n·2m, d]` kv and gate slots of entries `e0 .. e1`: window `w−1`'s
    /// first half-channels (empty for `w = 0`) then window `w`'s second.
    fn overlap_slots(
        &self,
        ops: &B,
        cache: &CompressorCache<B>,
        e0: usize,
        e1: usize,
    ) -> Result<(B::Buf, B::Buf)> {
        let (m, d) = (self.ratio, self.dim);
        if e0 == 0 {
            return Ok((
                slots_with_empty(ops, &cache.kv, m, d, e0, e1, 0.0)?,
                slots_with_empty(ops, &cache.gate, m, d, e0, e1, f32::NEG_INFINITY)?,
            ));
        }
        Ok((
            slots_in_place(ops, &cache.kv, m, d, e0, e1)?,
            slots_in_place(ops, &cache.gate, m, d, e0, e1)?,
        ))
    }
}

/// [`Compressor::overlap_slots`]' one side for entries `e0 ≥ 1`, read from
/// the tail as it is: its `[·, 2d]` rows are rows of `d` (token `t`'s first
/// half row `2(t − first)`, its second `2(t − first) + 1`), picked by one
/// [`Backend::row_runs`]. The same values as [`slots_with_empty`] with no
/// copies before: on CUDA one launch a side, where the range, the column
/// split, the joins and the runs were 10 launches for the two sides (run
/// 47's profiled step), on every entry of each CSA compressor (every 4
/// tokens).
fn slots_in_place<B: Backend>(
    ops: &B,
    tail: &Tail<B>,
    m: usize,
    d: usize,
    e0: usize,
    e1: usize,
) -> Result<B::Buf> {
    let first = tail.first();
    if e0 == 0 || (e0 - 1) * m < first {
        return Err(EngineError::State(format!(
            "compressor overlap: entry {e0} needs token {} of a cache from {first}",
            e0.saturating_sub(1) * m
        )));
    }
    if e1 * m > tail.len() {
        return Err(EngineError::State(format!(
            "compressor overlap: entries to {e1} need {} tokens of {}",
            e1 * m,
            tail.len()
        )));
    }
    let row = |t: usize, half: usize| (2 * (t - first) + half, 1);
    let mut runs = Vec::with_capacity(2 * m * (e1 - e0));
    for w in e0..e1 {
        runs.extend((w * m - m..w * m).map(|t| row(t, 0)));
        runs.extend((w * m..w * m + m).map(|t| row(t, 1)));
    }
    ops.row_runs(tail.buf(), d, &runs)
}

/// [`Compressor::overlap_slots`]' one side from a joined source: the
/// first halves' rows, the second halves', and for window 0 the empty
/// window (every value `empty`: kv 0, gate −∞), read as two runs of rows a
/// window by one [`Backend::row_runs`]. Used where window 0 is among the
/// entries (the empty window is no row of the tail).
fn slots_with_empty<B: Backend>(
    ops: &B,
    tail: &Tail<B>,
    m: usize,
    d: usize,
    e0: usize,
    e1: usize,
    empty: f32,
) -> Result<B::Buf> {
    let from = e0.saturating_sub(1) * m;
    let span = e1 * m - from;
    let mut halves = ops
        .split_cols(&tail.range(ops, from, e1 * m)?, span, &[d, d], 1)?
        .into_iter();
    let (Some(mut src), Some(second)) = (halves.next(), halves.next()) else {
        return Err(EngineError::State("compressor overlap: two halves".into()));
    };
    ops.append(&mut src, &second)?;
    let with_empty = e0 == 0;
    if with_empty {
        ops.append(&mut src, &ops.upload(&vec![empty; m * d])?)?;
    }
    let mut runs = Vec::with_capacity(2 * (e1 - e0));
    for w in e0..e1 {
        runs.push(if w == 0 {
            (2 * span, m)
        } else {
            ((w - 1) * m - from, m)
        });
        runs.push((span + w * m - from, m));
    }
    ops.row_runs(&src, d, &runs)
}

impl<B: Backend> CompressorCache<B> {
    /// Tokens covered.
    pub fn len(&self) -> usize {
        self.kv.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first token whose raw rows the next entries need at length `n`
    /// (the open window, and the previous one for the overlap).
    fn needed_from(&self, n: usize) -> usize {
        let open = n / self.ratio * self.ratio;
        if self.overlap {
            open.saturating_sub(self.ratio)
        } else {
            open
        }
    }

    fn trim(&mut self, ops: &B) -> Result<()> {
        let keep = self.needed_from(self.len().saturating_sub(STEP_BACK));
        self.kv.trim(ops, keep)?;
        self.gate.trim(ops, keep)
    }

    /// The shortest length this cache can step back to.
    pub fn floor(&self) -> usize {
        if self.kv.first() == 0 {
            0
        } else {
            // needed_from(n) >= first: the first window start at or after
            // `first`, plus one window for the overlap.
            let w = self.kv.first().div_ceil(self.ratio) * self.ratio;
            if self.overlap { w + self.ratio } else { w }
        }
    }

    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        if n > self.len() {
            return Err(EngineError::State(format!(
                "cannot truncate a compressor of {} tokens to {n}",
                self.len()
            )));
        }
        if self.needed_from(n) < self.kv.first() {
            return Err(EngineError::State(format!(
                "a compressor can step back to {} tokens at the earliest, not {n}",
                self.floor()
            )));
        }
        self.kv.truncate(ops, n)?;
        self.gate.truncate(ops, n)?;
        self.entries.truncate(ops, n / self.ratio)
    }

    pub fn byte_size(&self) -> usize {
        self.kv.byte_size() + self.gate.byte_size() + self.entries.byte_size()
    }

    /// The canonical tables: raw rows the next entries need, and entries.
    pub fn export(&self, ops: &B, p: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        let from = self.needed_from(self.len());
        out.push(self.kv.export(ops, format!("{p}.raw_kv"), from)?);
        out.push(self.gate.export(ops, format!("{p}.raw_gate"), from)?);
        out.push(self.entries.export(ops, format!("{p}.entries"))?);
        Ok(())
    }

    /// Read the tables of a state of `n` tokens (this cache is fresh).
    pub fn import(&mut self, ops: &B, r: &mut TableReader, p: &str, n: usize) -> Result<()> {
        let from = self.needed_from(n);
        self.kv.import(ops, r, &format!("{p}.raw_kv"), from, n)?;
        self.gate
            .import(ops, r, &format!("{p}.raw_gate"), from, n)?;
        self.entries
            .import(ops, r, &format!("{p}.entries"), n / self.ratio)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuOps;

    /// The tail read in place gives the joined source's slots value for
    /// value: windows of 4 and 3 tokens, channels of 5, a tail whose first
    /// rows were trimmed (first = 64), one and several entries at once.
    #[test]
    fn overlap_slots_in_place_equal_the_joined_source() {
        let ops = CpuOps;
        for (m, d) in [(4, 5), (3, 2)] {
            let mut tail = Tail::new(&ops, 2 * d).unwrap();
            let rows = 200;
            let x: Vec<f32> = (0..rows * 2 * d).map(|i| (i as f32).sin()).collect();
            tail.append(&ops, &x).unwrap();
            tail.trim(&ops, 100).unwrap();
            assert_eq!(tail.first(), 64);
            let low = 64usize.div_ceil(m) + 1;
            for (e0, e1) in [(low, low + 1), (low, low + 5), (rows / m - 2, rows / m)] {
                let joined = slots_with_empty(&ops, &tail, m, d, e0, e1, 0.0).unwrap();
                let in_place = slots_in_place(&ops, &tail, m, d, e0, e1).unwrap();
                assert_eq!(in_place.len(), (e1 - e0) * 2 * m * d);
                assert_eq!(in_place, joined, "m {m}, entries {e0}..{e1}");
            }
            // Entry `low − 1` needs a dropped row (or its window's): refused.
            assert!(slots_in_place(&ops, &tail, m, d, low - 2, low).is_err());
            assert!(slots_in_place(&ops, &tail, m, d, low, rows / m + 1).is_err());
        }
    }
}
