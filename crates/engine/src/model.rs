//! The model contract: the only surface the decode loops, the session layer
//! and the CLI see of a family.

use crate::error::Result;
use crate::families::FamilyDescriptor;

/// Which rows of a forward's logits the caller needs. Prefill chunks only
/// need the last row; `debug logits` and speculative verify need all rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsRows {
    Last,
    All,
}

/// Logits on the host, row-major `[rows, vocab]`, f32.
#[derive(Debug, Clone)]
pub struct ForwardOutput {
    pub logits: Vec<f32>,
    pub rows: usize,
    pub vocab: usize,
}

impl ForwardOutput {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }

    pub fn last_row(&self) -> &[f32] {
        self.row(self.rows - 1)
    }
}

/// Everything a model remembers about the tokens it has processed.
pub trait ModelState: Send {
    /// Number of tokens the state covers.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// An independent copy: mutating either afterwards never affects the other.
    fn snapshot(&self) -> Self
    where
        Self: Sized;
    /// Forget everything after the first `n` tokens. Families with recurrent
    /// state return an error instead of a wrong state.
    fn truncate(&mut self, n: usize) -> Result<()>;
    /// Bytes of tensor data held (what a snapshot costs).
    fn byte_size(&self) -> usize;
}

pub trait Model: Send + Sync {
    type State: ModelState;

    fn descriptor(&self) -> &'static FamilyDescriptor;
    fn vocab_size(&self) -> usize;
    /// Longest sequence the model supports (positions).
    fn context_length(&self) -> usize;
    fn new_state(&self) -> Self::State;
    /// Process `tokens` (one prefill chunk, one decode step or a verify
    /// window) after everything `state` covers, extending it.
    fn forward(
        &self,
        tokens: &[u32],
        state: &mut Self::State,
        rows: LogitsRows,
    ) -> Result<ForwardOutput>;
}
