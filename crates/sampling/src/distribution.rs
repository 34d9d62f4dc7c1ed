//! Sparse categorical distributions: what a law would sample from.

/// Probabilities over a support in ascending token-id order. Construction
/// guarantees a non-empty support, strictly ascending ids, finite
/// non-negative probabilities and positive mass, so drawing from one never
/// fails.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    ids: Vec<u32>,
    probs: Vec<f64>,
    argmax_fallback: bool,
}

/// Why a [`Distribution`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DistributionError {
    #[error("a distribution needs at least one token")]
    Empty,
    #[error("ids and probabilities have different lengths")]
    LengthMismatch,
    #[error("token ids must be strictly ascending")]
    NotAscending,
    #[error("probabilities must be finite and non-negative with positive total mass")]
    BadMass,
}

impl Distribution {
    /// A distribution from parallel ids/probs (probs need not sum to 1; they
    /// are used as given, which is what the laws' draws do).
    pub fn new(ids: Vec<u32>, probs: Vec<f64>) -> Result<Self, DistributionError> {
        if ids.is_empty() {
            return Err(DistributionError::Empty);
        }
        if ids.len() != probs.len() {
            return Err(DistributionError::LengthMismatch);
        }
        if ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err(DistributionError::NotAscending);
        }
        if probs.iter().any(|p| !p.is_finite() || *p < 0.0) || probs.iter().sum::<f64>() <= 0.0 {
            return Err(DistributionError::BadMass);
        }
        Ok(Self {
            ids,
            probs,
            argmax_fallback: false,
        })
    }

    /// Used by the laws, which produce valid data by construction.
    pub(crate) fn from_parts(ids: Vec<u32>, probs: Vec<f64>, argmax_fallback: bool) -> Self {
        debug_assert!(Self::new(ids.clone(), probs.clone()).is_ok());
        Self {
            ids,
            probs,
            argmax_fallback,
        }
    }

    /// All mass on `token`.
    pub fn one_hot(token: u32) -> Self {
        Self {
            ids: vec![token],
            probs: vec![1.0],
            argmax_fallback: false,
        }
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn probs(&self) -> &[f64] {
        &self.probs
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Never true (construction forbids it); provided for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Probability of `token` (0 outside the support).
    pub fn prob(&self, token: u32) -> f64 {
        self.ids
            .binary_search(&token)
            .map_or(0.0, |i| self.probs[i])
    }

    /// Highest-probability token, lowest id on ties.
    pub fn argmax(&self) -> u32 {
        let mut best = 0;
        for i in 1..self.probs.len() {
            if self.probs[i] > self.probs[best] {
                best = i;
            }
        }
        self.ids[best]
    }

    /// True when the ds4 law could only answer this row by its argmax
    /// fallback (no finite logit): the engine must surface it.
    pub fn argmax_fallback(&self) -> bool {
        self.argmax_fallback
    }
}
