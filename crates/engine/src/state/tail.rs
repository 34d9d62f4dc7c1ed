//! The most recent rows of a per-token cache: rows of tokens `first ..
//! len`, older rows dropped. A sliding-window attention needs only its last
//! `W − 1` keys and a compressor only the tokens of its open window; keeping
//! a bounded slack beyond that lets a state step back (a verify window's
//! rejected rows, a short rewind) without keeping the whole history.
//!
//! What is kept is a function of `len` alone ([`Tail::trim`] with a
//! `keep_from(len)` rounded to [`TRIM_GRAIN`]), so two states of the same
//! tokens hold the same rows however they were built.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::state::rows::RowCache;
use crate::table::{NamedTensor, TableReader};

/// Rows are dropped in steps of this many tokens (a copy every `GRAIN`
/// tokens, not every token).
pub const TRIM_GRAIN: usize = 64;

#[derive(Debug, Clone)]
pub struct Tail<B: Backend> {
    rows: RowCache<B>,
    /// Token index of row 0.
    first: usize,
}

impl<B: Backend> Tail<B> {
    pub fn new(ops: &B, width: usize) -> Result<Self> {
        Ok(Self {
            rows: RowCache::new(ops, width)?,
            first: 0,
        })
    }

    /// Token index of the first kept row.
    pub fn first(&self) -> usize {
        self.first
    }

    /// Tokens covered (`first + rows`).
    pub fn len(&self) -> usize {
        self.first + self.rows.rows()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn width(&self) -> usize {
        self.rows.width()
    }

    /// The kept rows `[len − first, width]`.
    pub fn buf(&self) -> &B::Buf {
        self.rows.buf()
    }

    pub fn append(&mut self, ops: &B, x: &B::Buf) -> Result<()> {
        self.rows.append(ops, x)
    }

    /// Rows of tokens `from .. to` (copied).
    pub fn range(&self, ops: &B, from: usize, to: usize) -> Result<B::Buf> {
        if from < self.first || to > self.len() || from > to {
            return Err(EngineError::State(format!(
                "rows {from}..{to} of a cache holding {}..{}",
                self.first,
                self.len()
            )));
        }
        ops.rows(self.rows.buf(), self.width(), from - self.first, to - from)
    }

    /// Drop rows before `keep_from` rounded down to [`TRIM_GRAIN`].
    pub fn trim(&mut self, ops: &B, keep_from: usize) -> Result<()> {
        let k = keep_from / TRIM_GRAIN * TRIM_GRAIN;
        if k <= self.first {
            return Ok(());
        }
        let k = k.min(self.len());
        // The kept rows' copy becomes the storage itself (one copy, where
        // appending it to a new cache copied them a second time).
        let kept = self.range(ops, k, self.len())?;
        self.rows = RowCache::from_rows(ops, kept, self.width())?;
        self.first = k;
        Ok(())
    }

    /// Keep tokens `..n` (`n ≥ first`, else an error: those rows are gone).
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        if n < self.first {
            return Err(EngineError::State(format!(
                "cannot step back to token {n}: rows before {} were dropped",
                self.first
            )));
        }
        self.rows.truncate(ops, n - self.first)
    }

    pub fn byte_size(&self) -> usize {
        self.rows.byte_size()
    }

    /// Rows of tokens `from .. len` as a table (the canonical part a
    /// checkpoint stores).
    pub fn export(&self, ops: &B, name: String, from: usize) -> Result<NamedTensor> {
        let buf = self.range(ops, from, self.len())?;
        Ok(NamedTensor::f32(
            name,
            vec![self.len() - from, self.width()],
            ops.download(&buf)?,
        ))
    }

    /// Become rows of tokens `from .. to` read from `r`.
    pub fn import(
        &mut self,
        ops: &B,
        r: &mut TableReader,
        name: &str,
        from: usize,
        to: usize,
    ) -> Result<()> {
        let host = r.f32(name, (to - from) * self.width())?;
        let mut rows = RowCache::new(ops, self.width())?;
        rows.append(ops, &ops.upload(&host)?)?;
        self.rows = rows;
        self.first = from;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuOps;

    #[test]
    fn trims_by_grain_and_refuses_dropped_rows() {
        let ops = CpuOps;
        let mut t = Tail::new(&ops, 2).unwrap();
        let x: Vec<f32> = (0..2 * 200).map(|i| i as f32).collect();
        t.append(&ops, &x).unwrap();
        t.trim(&ops, 150).unwrap();
        assert_eq!((t.first(), t.len()), (128, 200));
        assert_eq!(t.range(&ops, 128, 129).unwrap(), vec![256.0, 257.0]);
        assert_eq!(
            t.buf().len(),
            2 * 72,
            "the storage holds the kept rows only"
        );
        // Appends after a trim land after the kept rows.
        t.append(&ops, &vec![-1.0, -2.0]).unwrap();
        assert_eq!(t.len(), 201);
        assert_eq!(
            t.range(&ops, 199, 201).unwrap(),
            vec![398.0, 399.0, -1.0, -2.0]
        );
        t.truncate(&ops, 200).unwrap();
        assert!(t.truncate(&ops, 100).is_err());
        t.truncate(&ops, 130).unwrap();
        assert_eq!(t.len(), 130);
        assert!(t.range(&ops, 127, 130).is_err());
    }
}
