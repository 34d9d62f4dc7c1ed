//! Per-position sampling: the request's sampler, or — where the observer
//! says a position is structure rather than content
//! ([`TurnObserver::greedy_after`]) — its greedy twin: the same law and
//! parameters at temperature 0. The twin answers by the law's argmax and
//! takes no draws, so the request's stream advances only at sampled
//! positions. (ds4 samples the tags of a DSML tool call this way.)
//!
//! [`TurnObserver::greedy_after`]: super::turn::TurnObserver::greedy_after

use std::borrow::Cow;

use ds4_sampling::{Sampler, SamplingParams};

use super::mask::TokenMask;
use crate::error::{EngineError, Result};

/// A position's logits row under its constraint mask: the row itself when
/// there is no mask, the masked copy otherwise (`-inf` where the mask
/// forbids), `None` when the mask allows no entry of the row.
pub(crate) fn constrain<'r>(mask: Option<&TokenMask>, row: &'r [f32]) -> Option<Cow<'r, [f32]>> {
    match mask {
        None => Some(Cow::Borrowed(row)),
        Some(m) => m.apply(row).map(Cow::Owned),
    }
}

/// The request's sampler and, once a position asks for it, its greedy twin.
pub(crate) struct StepSamplers<'a> {
    request: &'a mut Sampler,
    greedy: Option<Sampler>,
}

impl<'a> StepSamplers<'a> {
    pub fn new(request: &'a mut Sampler) -> Self {
        Self {
            request,
            greedy: None,
        }
    }

    /// The sampler for a position: greedy or the request's.
    pub fn pick(&mut self, greedy: bool) -> Result<&mut Sampler> {
        if !greedy {
            return Ok(&mut *self.request);
        }
        if self.greedy.is_none() {
            let params = SamplingParams {
                temperature: 0.0,
                ..*self.request.params()
            };
            let twin = Sampler::new(self.request.law(), params, self.request.seed())
                .map_err(|e| EngineError::State(format!("greedy sampler: {e}")))?;
            self.greedy = Some(twin);
        }
        match self.greedy.as_mut() {
            Some(twin) => Ok(twin),
            None => Err(EngineError::State("greedy sampler missing".into())),
        }
    }
}
