//! [`Sampler`]: a law, its resolved parameters and the request's stream.

use crate::counts::TokenCounts;
use crate::distribution::Distribution;
use crate::error::SampleError;
use crate::params::{Law, ParamError, SamplingParams};
use crate::stream::{NumpyPcg64, XorShift64Star};
use crate::{ds4, nucleus, speculative};

/// One token from a law.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampled {
    pub token: u32,
    /// The ds4 law answered a row with no finite logit (or a degenerate sum)
    /// by its argmax scan: not a real sample, the engine must report it.
    pub argmax_fallback: bool,
}

#[derive(Clone, Debug)]
enum Stream {
    Pcg(NumpyPcg64),
    Xor(XorShift64Star),
}

/// A request's sampler. The stream advances only when a draw is taken;
/// [`Sampler::draws_taken`] counts them.
#[derive(Clone, Debug)]
pub struct Sampler {
    law: Law,
    params: SamplingParams,
    seed: u64,
    stream: Stream,
    draws: u64,
    nucleus: nucleus::Scratch,
    ds4: ds4::Scratch,
}

impl Sampler {
    /// A sampler for `law` with resolved `params`. `seed` seeds
    /// `numpy.random.default_rng(seed)` for the nucleus law and is the
    /// initial xorshift64* state for the ds4 law.
    pub fn new(law: Law, params: SamplingParams, seed: u64) -> Result<Self, ParamError> {
        params.validate()?;
        let stream = match law {
            Law::Nucleus => Stream::Pcg(NumpyPcg64::from_seed(seed)),
            Law::Ds4 => Stream::Xor(XorShift64Star::new(seed)),
        };
        Ok(Self {
            law,
            params,
            seed,
            stream,
            draws: 0,
            nucleus: nucleus::Scratch::default(),
            ds4: ds4::Scratch::default(),
        })
    }

    pub fn law(&self) -> Law {
        self.law
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed this sampler's stream started from (reported back so an
    /// answer can be replayed).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Uniforms consumed so far.
    pub fn draws_taken(&self) -> u64 {
        self.draws
    }

    /// Whether the law answers by argmax without drawing (ds4 judges the
    /// temperature in f32, like its reference).
    pub fn is_greedy(&self) -> bool {
        match self.law {
            Law::Nucleus => self.params.temperature <= 0.0,
            Law::Ds4 => ds4::is_greedy(&self.params),
        }
    }

    /// One uniform in [0, 1) from the stream, as f64 (the ds4 law's 24-bit
    /// f32 uniform is exact in f64).
    fn uniform(&mut self) -> f64 {
        self.draws += 1;
        match &mut self.stream {
            Stream::Pcg(s) => s.random(),
            Stream::Xor(s) => f64::from(s.uniform_f32()),
        }
    }

    fn uniform_f32(&mut self) -> f32 {
        self.draws += 1;
        match &mut self.stream {
            // Not reached: only the ds4 law draws f32 uniforms.
            Stream::Pcg(s) => s.random() as f32,
            Stream::Xor(s) => s.uniform_f32(),
        }
    }

    /// Sample one token from a logits row. `counts` are the completion's
    /// token counts (penalties; ignored by the ds4 law).
    pub fn sample(&mut self, logits: &[f32], counts: &TokenCounts) -> Result<Sampled, SampleError> {
        match self.law {
            Law::Nucleus => match nucleus::plan(logits, &self.params, counts, &mut self.nucleus)? {
                nucleus::Plan::Greedy(token) => Ok(Sampled {
                    token,
                    argmax_fallback: false,
                }),
                nucleus::Plan::Draw => {
                    let u = self.uniform();
                    let i = nucleus::categorical_index(&self.nucleus.weights, u);
                    Ok(Sampled {
                        token: self.nucleus.ids[i],
                        argmax_fallback: false,
                    })
                }
            },
            Law::Ds4 => {
                if logits.is_empty() {
                    return Err(SampleError::EmptyRow);
                }
                match ds4::plan(logits, &self.params, &mut self.ds4) {
                    ds4::Plan::Fixed { token, fallback } => Ok(Sampled {
                        token,
                        argmax_fallback: fallback,
                    }),
                    ds4::Plan::Draw { sum, exhausted } => {
                        let u = self.uniform_f32();
                        let s = &self.ds4;
                        let token = ds4::draw(&s.ids, &s.weights, sum, exhausted, u);
                        Ok(Sampled {
                            token,
                            argmax_fallback: false,
                        })
                    }
                }
            }
        }
    }

    /// The law's distribution over its support (ascending ids, f64). Greedy
    /// gives a one-hot on the argmax. No draw is taken.
    pub fn distribution(
        &mut self,
        logits: &[f32],
        counts: &TokenCounts,
    ) -> Result<Distribution, SampleError> {
        match self.law {
            Law::Nucleus => match nucleus::plan(logits, &self.params, counts, &mut self.nucleus)? {
                nucleus::Plan::Greedy(token) => Ok(Distribution::one_hot(token)),
                nucleus::Plan::Draw => Ok(Distribution::from_parts(
                    self.nucleus.ids.clone(),
                    self.nucleus.weights.clone(),
                    false,
                )),
            },
            Law::Ds4 => {
                if logits.is_empty() {
                    return Err(SampleError::EmptyRow);
                }
                match ds4::plan(logits, &self.params, &mut self.ds4) {
                    ds4::Plan::Fixed { token, fallback } => {
                        Ok(Distribution::from_parts(vec![token], vec![1.0], fallback))
                    }
                    ds4::Plan::Draw { .. } => {
                        // Probabilities are the f32 weights over their f64
                        // sum; the f32 draw realises them up to f32 rounding.
                        let s = &self.ds4;
                        let mut pairs: Vec<(u32, f64)> = s
                            .ids
                            .iter()
                            .copied()
                            .zip(s.weights.iter().map(|&w| f64::from(w)))
                            .collect();
                        pairs.sort_unstable_by_key(|&(id, _)| id);
                        pairs.retain(|&(_, w)| w > 0.0);
                        if pairs.is_empty() {
                            // Every kept weight underflowed: the draw would
                            // return the first kept id (r = 0 <= 0).
                            return Ok(Distribution::from_parts(vec![s.ids[0]], vec![1.0], false));
                        }
                        let total: f64 = pairs.iter().fold(0.0, |a, &(_, w)| a + w);
                        let (ids, probs) = pairs.into_iter().map(|(id, w)| (id, w / total)).unzip();
                        Ok(Distribution::from_parts(ids, probs, false))
                    }
                }
            }
        }
    }

    /// Speculative acceptance of `draft` given target `p` and draft `q`.
    /// Greedy: accept iff `draft` is the target argmax, no draw. Otherwise
    /// one uniform `u` from the stream and accept iff `u <= min(1, p/q)`.
    pub fn accept(&mut self, p: &Distribution, q: &Distribution, draft: u32) -> bool {
        if self.is_greedy() {
            return draft == p.argmax();
        }
        let a = speculative::acceptance_probability(p.prob(draft), q.prob(draft));
        self.uniform() <= a
    }

    /// The correction distribution after a rejection (no draw).
    pub fn residual(p: &Distribution, q: &Distribution) -> Distribution {
        speculative::residual(p, q)
    }

    /// One draw from `dist` with this law's categorical rule: nucleus as
    /// `Generator.choice` (cdf, `searchsorted` right); ds4 as its inverse
    /// CDF (`r = u*total`, subtract in ascending id order, first `r <= 0`,
    /// else the last id). Greedy samplers take no draw and return the
    /// distribution's argmax, so greedy decoding never touches the stream.
    pub fn sample_from(&mut self, dist: &Distribution) -> u32 {
        if self.is_greedy() {
            return dist.argmax();
        }
        let ids = dist.ids();
        let probs = dist.probs();
        match self.law {
            Law::Nucleus => {
                let u = self.uniform();
                ids[nucleus::categorical_index(probs, u)]
            }
            Law::Ds4 => {
                let u = self.uniform();
                let total: f64 = probs.iter().fold(0.0, |a, &w| a + w);
                let mut r = u * total;
                for (&id, &w) in ids.iter().zip(probs) {
                    r -= w;
                    if r <= 0.0 {
                        return id;
                    }
                }
                ids[ids.len() - 1]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::NumpyPcg64;

    /// Nucleus law: `sample` is exactly `sample_from(distribution(..))`,
    /// draw for draw, so speculative and plain decoding share one law.
    #[test]
    fn nucleus_sample_equals_sample_from_distribution() {
        let mut rng = NumpyPcg64::from_seed(3);
        let mut counts = TokenCounts::new();
        counts.add(2);
        counts.add(2);
        for (i, top_k) in [0i64, 3, 20].into_iter().enumerate() {
            let params = SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                top_k,
                min_p: 0.0,
                presence_penalty: 0.4,
                frequency_penalty: 0.2,
            };
            let mut a = Sampler::new(Law::Nucleus, params, i as u64).unwrap();
            let mut b = Sampler::new(Law::Nucleus, params, i as u64).unwrap();
            for _ in 0..300 {
                let row: Vec<f32> = (0..12).map(|_| (rng.random() * 4.0) as f32).collect();
                let x = a.sample(&row, &counts).unwrap();
                let d = b.distribution(&row, &counts).unwrap();
                assert_eq!(x.token, b.sample_from(&d));
            }
            assert_eq!(a.draws_taken(), 300);
            assert_eq!(a.draws_taken(), b.draws_taken());
            assert_eq!(a.seed(), i as u64);
        }
    }
}
