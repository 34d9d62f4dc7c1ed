//! Sampling laws for ds4server (normative spec: `shared/specs/sampling.md`).
//!
//! Every model family is bound to one [`Law`]:
//!
//! - the **nucleus law** (MTPLX host sampler: penalties, temperature, top-k,
//!   nucleus against the full-vocabulary distribution, f64) over a
//!   NumPy-compatible PCG64 stream ([`NumpyPcg64`]);
//! - the **ds4 law** (antirez/ds4: temperature, top-k, min_p, top_p, f32)
//!   over xorshift64* ([`XorShift64Star`]).
//!
//! The two laws share no sampling code path beyond the speculative
//! primitives, so a change to one cannot move the other's tokens or draws.
//! [`Sampler`] bundles a law, its parameters and the request's stream;
//! [`replay`] runs JSONL cases for `ds4server debug sample`.

mod counts;
mod distribution;
mod ds4;
mod error;
mod exp_lanes;
mod nucleus;
mod params;
pub mod replay;
mod row_scan;
mod sampler;
pub mod speculative;
pub mod stream;

pub use counts::TokenCounts;
pub use distribution::{Distribution, DistributionError};
pub use error::SampleError;
pub use params::{
    Field, IgnoredParameter, Law, ParamError, Resolved, SamplingParams, SamplingRequest,
    UnknownLaw, resolve_seed,
};
pub use sampler::{Sampled, Sampler};
pub use stream::{NumpyPcg64, XorShift64Star};
