//! Decode state of a DeepSeek-V4 trunk (and of its MTP head), batch 1.
//!
//! | layer | what | layout | growth |
//! |---|---|---|---|
//! | all | K=V rows, normed and rotated | `[W−1 + slack, d]` | bounded |
//! | CSA | compressor raw `c`, `z + ape` of the open and previous window | `[≤ 2m + slack, 2d]` ×2 | bounded |
//! | CSA | compressed entries, normed and rotated | `[⌊T/4⌋, d]` | +1 per 4 tokens |
//! | CSA | indexer compressor raw rows / entries | `[·, 2di]` ×2 / `[⌊T/4⌋, di]` | bounded / +1 per 4 |
//! | HCA | compressor raw rows | `[≤ m + slack, d]` ×2 | bounded |
//! | HCA | compressed entries | `[⌊T/128⌋, d]` | +1 per 128 tokens |
//!
//! transformers keeps the same information as a window of `W − 1` rows,
//! compressor buffers of `T mod m` rows plus the CSA overlap (the previous
//! window's first-half channels), and the entries. Here raw rows are kept a
//! little longer ([`crate::layers::compressor::STEP_BACK`] tokens) so a
//! state can step back over a verify window's rejected rows:
//! [`ModelState::truncate`] works down to [`ModelState::truncate_floor`],
//! and a checkpoint stores only the canonical rows (what the next token
//! needs), so it depends on the tokens alone.

use super::attention::AttnCache;
use crate::backend::{Backend, CpuOps};
use crate::error::{EngineError, Result};
use crate::model::ModelState;
use crate::state::mtp::{HeadCache, MtpCache};
use crate::table::{NamedTensor, TableReader};

#[derive(Debug, Clone)]
pub struct DeepseekV4State<B: Backend = CpuOps> {
    pub(crate) ops: B,
    pub(crate) layers: Vec<AttnCache<B>>,
    pub(crate) len: usize,
}

/// A verify window's record: the length before it (every cache steps back
/// to any prefix of the window by truncation).
#[derive(Debug, Clone, Copy)]
pub struct WindowMark {
    pub base: usize,
    pub rows: usize,
}

impl<B: Backend> DeepseekV4State<B> {
    pub fn layers(&self) -> &[AttnCache<B>] {
        &self.layers
    }
}

impl<B: Backend> ModelState for DeepseekV4State<B> {
    type Window = WindowMark;

    fn len(&self) -> usize {
        self.len
    }

    fn snapshot(&self) -> Self {
        self.clone()
    }

    fn truncate_floor(&self) -> usize {
        self.layers.iter().map(|l| l.floor()).max().unwrap_or(0)
    }

    fn truncate(&mut self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(EngineError::State(format!(
                "cannot truncate {} tokens to {n}",
                self.len
            )));
        }
        if n == self.len {
            return Ok(());
        }
        let floor = self.truncate_floor();
        if n < floor {
            return Err(EngineError::State(format!(
                "deepseek_v4: the sliding-window and compressor caches keep only recent raw rows; \
                 {} tokens can step back to {floor} at the earliest, not {n}",
                self.len
            )));
        }
        let ops = self.ops.clone();
        for l in &mut self.layers {
            l.truncate(&ops, n)?;
        }
        self.len = n;
        Ok(())
    }

    fn commit(&mut self, window: &WindowMark, accepted: usize) -> Result<()> {
        if self.len != window.base + window.rows || accepted > window.rows {
            return Err(EngineError::State(format!(
                "window {}..{} (accepting {accepted}) is not the last forward of a state of {}",
                window.base,
                window.base + window.rows,
                self.len
            )));
        }
        self.truncate(window.base + accepted)
    }

    fn export(&self) -> Result<Vec<NamedTensor>> {
        let mut out = vec![NamedTensor::u32("len", vec![1], vec![self.len as u32])];
        for (i, l) in self.layers.iter().enumerate() {
            l.export(&self.ops, &format!("l{i}"), &mut out)?;
        }
        Ok(out)
    }

    fn import(&mut self, tensors: Vec<NamedTensor>) -> Result<()> {
        if self.len != 0 {
            return Err(EngineError::State(
                "deepseek_v4: import needs a fresh state".into(),
            ));
        }
        let ops = self.ops.clone();
        let mut r = TableReader::new(tensors, "deepseek_v4 state");
        let n = r.u32("len", 1)?[0] as usize;
        for (i, l) in self.layers.iter_mut().enumerate() {
            l.import(&ops, &mut r, &format!("l{i}"), n)?;
        }
        r.finish()?;
        self.len = n;
        Ok(())
    }

    fn byte_size(&self) -> usize {
        self.layers.iter().map(|l| l.byte_size()).sum()
    }
}

/// Equal when the exported (canonical) tables are equal.
impl<B: Backend> PartialEq for DeepseekV4State<B> {
    fn eq(&self, other: &Self) -> bool {
        match (self.export(), other.export()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

/// The MTP head's history: its one sliding layer's cache.
pub type MtpState<B = CpuOps> = MtpCache<AttnCache<B>, B>;

impl<B: Backend> HeadCache<B> for AttnCache<B> {
    fn truncate(&mut self, ops: &B, n: usize) -> Result<()> {
        if n < self.floor() {
            return Err(EngineError::State(format!(
                "the MTP window can step back to {} rows at the earliest, not {n}",
                self.floor()
            )));
        }
        AttnCache::truncate(self, ops, n)
    }

    fn byte_size(&self) -> usize {
        AttnCache::byte_size(self)
    }

    fn export(&self, ops: &B, prefix: &str, out: &mut Vec<NamedTensor>) -> Result<()> {
        AttnCache::export(self, ops, prefix, out)
    }

    fn import(&mut self, ops: &B, r: &mut TableReader, prefix: &str, rows: usize) -> Result<()> {
        AttnCache::import(self, ops, r, prefix, rows)
    }
}
