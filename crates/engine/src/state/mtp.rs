//! The MTP head's own history, generic over the head's layer cache: what
//! every family's MTP head keeps (the rows it has seen, their positions, and
//! its layer's cache), with the truncate / export / import the decode loop
//! and checkpoints need. A family supplies the cache type through
//! [`HeadCache`].

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::model::MtpHistory;
use crate::table::{NamedTensor, TableReader};

/// A layer cache an MTP head keeps: one entry per row, droppable from the
/// end.
pub trait HeadCache<B: Backend>: Clone + Send + std::fmt::Debug {
    /// Keep the first `n` rows.
    fn truncate(&mut self, ops: &B, n: usize) -> Result<()>;
    fn byte_size(&self) -> usize;
    /// Append this cache's tables under `prefix`.
    fn export(&self, ops: &B, prefix: &str, out: &mut Vec<NamedTensor>) -> Result<()>;
    /// Read back `rows` rows' tables (this is a fresh cache).
    fn import(&mut self, ops: &B, r: &mut TableReader, prefix: &str, rows: usize) -> Result<()>;
}

/// An MTP history: row `t` combines the trunk hidden of position `t` with
/// the token at `t + 1`; `positions[t]` is its (t, h, w) position.
#[derive(Debug, Clone)]
pub struct MtpCache<C, B: Backend> {
    pub(crate) ops: B,
    pub(crate) cache: C,
    pub(crate) positions: Vec<[u32; 3]>,
}

impl<C: HeadCache<B>, B: Backend> MtpCache<C, B> {
    pub fn new(ops: &B, cache: C) -> Self {
        Self {
            ops: ops.clone(),
            cache,
            positions: Vec::new(),
        }
    }

    /// Rows the history covers.
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The head layer's cache.
    pub fn cache(&self) -> &C {
        &self.cache
    }

    /// Drop rows after `n` (drafted rows).
    pub fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.positions.len() {
            return Err(EngineError::State(format!(
                "cannot truncate an MTP history of {} rows to {n}",
                self.positions.len()
            )));
        }
        self.cache.truncate(&self.ops, n)?;
        self.positions.truncate(n);
        Ok(())
    }

    pub fn byte_size(&self) -> usize {
        self.cache.byte_size() + 12 * self.positions.len()
    }
}

/// The `positions` table of a state (`[P, 3]`).
pub fn positions_table(positions: &[[u32; 3]]) -> NamedTensor {
    let flat = positions.iter().flat_map(|p| p.iter().copied()).collect();
    NamedTensor::u32("positions", vec![positions.len(), 3], flat)
}

/// Read a `positions` table written by [`MtpCache`] (or a state using the
/// same layout).
pub fn import_positions(r: &mut TableReader) -> Result<Vec<[u32; 3]>> {
    let n = r.peek_rows("positions")?;
    let flat = r.u32("positions", n.saturating_mul(3))?;
    Ok(flat.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect())
}

impl<C: HeadCache<B>, B: Backend> MtpHistory for MtpCache<C, B> {
    fn len(&self) -> usize {
        self.positions.len()
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        MtpCache::truncate(self, n)
    }

    fn byte_size(&self) -> usize {
        MtpCache::byte_size(self)
    }

    fn export(&self) -> Result<Vec<NamedTensor>> {
        let mut out = vec![positions_table(&self.positions)];
        self.cache.export(&self.ops, "mtp", &mut out)?;
        Ok(out)
    }

    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        if !self.positions.is_empty() {
            return Err(EngineError::State(
                "MTP history: import needs a fresh history".into(),
            ));
        }
        let mut r = TableReader::new(tensors, "MTP history");
        let positions = import_positions(&mut r)?;
        let ops = self.ops.clone();
        self.cache.import(&ops, &mut r, "mtp", positions.len())?;
        r.finish()?;
        self.positions = positions;
        Ok(())
    }
}

/// Equal when the exported tables are equal (a download: for tests and
/// tooling).
impl<C: HeadCache<B>, B: Backend> PartialEq for MtpCache<C, B> {
    fn eq(&self, other: &Self) -> bool {
        match (MtpHistory::export(self), MtpHistory::export(other)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}
