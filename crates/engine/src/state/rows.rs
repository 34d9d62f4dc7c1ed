//! A cache of token rows on the device: `[P, width]`, one row per token,
//! appended per forward, truncated by position, exported and imported as a
//! host table. Attention keys/values, indexer keys and block keys are all
//! row caches; only their geometry differs.

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::state::table::{NamedTensor, TableReader};

#[derive(Debug, Clone)]
pub struct RowCache<B: Backend> {
    buf: B::Buf,
    width: usize,
    rows: usize,
}

impl<B: Backend> RowCache<B> {
    pub fn new(ops: &B, width: usize) -> Result<Self> {
        Ok(Self {
            buf: ops.zeros(0)?,
            width,
            rows: 0,
        })
    }

    /// A cache holding `buf` (`[n, width]`) as its storage.
    pub fn from_rows(ops: &B, buf: B::Buf, width: usize) -> Result<Self> {
        let len = ops.len(&buf);
        let rows = len / width.max(1);
        if rows * width != len {
            return Err(EngineError::State(format!(
                "{len} values are not rows of {width}"
            )));
        }
        Ok(Self { buf, width, rows })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn width(&self) -> usize {
        self.width
    }

    /// The valid rows, `[rows, width]`.
    pub fn buf(&self) -> &B::Buf {
        &self.buf
    }

    /// The storage rows are appended to ([`RowCache::appended`] counts
    /// them): for a backend's several-buffer append
    /// ([`Backend::append_head_rows`]).
    pub(crate) fn storage_mut(&mut self) -> &mut B::Buf {
        &mut self.buf
    }

    /// `n` rows were appended to [`RowCache::storage_mut`].
    pub(crate) fn appended(&mut self, n: usize) {
        self.rows += n;
    }

    /// Drop what [`RowCache::storage_mut`] holds past the recorded rows
    /// (after a several-buffer append that failed part way).
    pub(crate) fn drop_unrecorded(&mut self, ops: &B) -> Result<()> {
        ops.truncate(&mut self.buf, self.rows * self.width)
    }

    /// Append `x: [n, width]`.
    pub fn append(&mut self, ops: &B, x: &B::Buf) -> Result<()> {
        let n = ops.len(x) / self.width.max(1);
        if n * self.width != ops.len(x) {
            return Err(EngineError::State(format!(
                "{} values are not rows of {}",
                ops.len(x),
                self.width
            )));
        }
        ops.append(&mut self.buf, x)?;
        self.rows += n;
        Ok(())
    }

    /// Cover `rows` rows (those past the current ones are written by
    /// [`RowCache::write_step`]) in storage of its own with room for
    /// `capacity` rows, doubled (up to `max_rows`) when it runs out: the
    /// storage of a step's caches changes only at these growth points.
    pub fn resize_rows(&mut self, ops: &B, rows: usize, max_rows: usize) -> Result<()> {
        let grow_to = rows.max(2 * self.rows).max(256).min(max_rows.max(rows));
        ops.resize(&mut self.buf, rows * self.width, grow_to * self.width)?;
        self.rows = rows;
        Ok(())
    }

    /// Write `x: [n, width]` at the step's position (rows already covered
    /// by [`RowCache::resize_rows`]).
    pub fn write_step(&mut self, ops: &B, x: &B::Buf, step: &B::Step) -> Result<()> {
        ops.write_rows_step(&mut self.buf, x, self.width, step)
    }

    /// Keep the first `n` rows.
    pub fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        if n < self.rows {
            ops.truncate(&mut self.buf, n * self.width)?;
            self.rows = n;
        }
        Ok(())
    }

    pub fn byte_size(&self) -> usize {
        4 * self.rows * self.width
    }

    pub fn export(&self, ops: &B, name: String) -> Result<NamedTensor> {
        Ok(NamedTensor::f32(
            name,
            vec![self.rows, self.width],
            ops.download(&self.buf)?,
        ))
    }

    /// Read `rows` rows named `name` (the length is checked).
    pub fn import(&mut self, ops: &B, r: &mut TableReader, name: &str, rows: usize) -> Result<()> {
        let host = r.f32(name, rows * self.width)?;
        self.buf = ops.upload(&host)?;
        self.rows = rows;
        Ok(())
    }
}
