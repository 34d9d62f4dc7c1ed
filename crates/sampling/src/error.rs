//! Errors of the sampling laws.

/// A logits row the law refuses to sample from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    /// Nucleus law: a NaN or +inf entry, or no entry above -inf. Sampling
    /// such a row would fabricate a token (MTPLX once emitted token 0, `!`,
    /// forever), so it is an error at every temperature, greedy included.
    #[error(
        "logits row is not samplable: {nan} NaN, {pos_inf} +inf and {neg_inf} -inf entries \
         out of {len}"
    )]
    NonFiniteLogits {
        nan: usize,
        pos_inf: usize,
        neg_inf: usize,
        len: usize,
    },
    /// An empty logits row.
    #[error("logits row is empty")]
    EmptyRow,
}

impl SampleError {
    /// Short machine-readable code (the replay tool prints it).
    pub const fn code(&self) -> &'static str {
        match self {
            SampleError::NonFiniteLogits { .. } => "non_finite_logits",
            SampleError::EmptyRow => "empty_row",
        }
    }
}
