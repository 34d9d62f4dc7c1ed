//! Sampling parameters, their per-law defaults, request resolution and seeds.
//!
//! A family descriptor names one [`Law`] and holds its default
//! [`SamplingParams`]. A request's [`SamplingRequest`] overrides them through
//! [`Law::resolve`], which validates ranges and reports every parameter the
//! law does not know as an [`IgnoredParameter`] instead of reinterpreting it.

use std::fmt;
use std::str::FromStr;

/// The sampling law bound to a model family (spec: sampling.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Law {
    /// MTPLX host sampler over a NumPy-compatible PCG64 stream.
    Nucleus,
    /// antirez/ds4 sampler over xorshift64*.
    Ds4,
}

impl Law {
    /// Stable name used on the CLI and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            Law::Nucleus => "nucleus",
            Law::Ds4 => "ds4",
        }
    }

    /// The law's reference defaults (a family descriptor may override them).
    pub const fn default_params(self) -> SamplingParams {
        match self {
            Law::Nucleus => SamplingParams {
                temperature: 0.6,
                top_p: 0.95,
                top_k: 20,
                min_p: 0.0,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
            },
            Law::Ds4 => SamplingParams {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
                min_p: 0.05,
                presence_penalty: 0.0,
                frequency_penalty: 0.0,
            },
        }
    }

    /// Whether this law reads `field` at all.
    const fn knows(self, field: Field) -> bool {
        !matches!(
            (self, field),
            (Law::Nucleus, Field::MinP)
                | (Law::Ds4, Field::PresencePenalty | Field::FrequencyPenalty)
        )
    }

    /// Merge a request over `defaults`, validate, and list what was ignored.
    ///
    /// A parameter the law does not know is reported when the request sets
    /// it to anything but 0 (0 is the neutral value of min_p and of both
    /// penalties, so setting it changes nothing and is not worth a warning).
    /// The resolved value of an unknown parameter is always 0 so that no
    /// downstream code can pick it up by accident.
    pub fn resolve(
        self,
        defaults: &SamplingParams,
        request: &SamplingRequest,
    ) -> Result<Resolved, ParamError> {
        let mut params = *defaults;
        let mut ignored = Vec::new();
        let overrides = [
            (Field::Temperature, request.temperature),
            (Field::TopP, request.top_p),
            (Field::MinP, request.min_p),
            (Field::PresencePenalty, request.presence_penalty),
            (Field::FrequencyPenalty, request.frequency_penalty),
        ];
        for (field, value) in overrides {
            let Some(value) = value else { continue };
            if !self.knows(field) {
                if value != 0.0 {
                    ignored.push(IgnoredParameter {
                        law: self,
                        field,
                        value,
                    });
                }
                continue;
            }
            if let Some(slot) = params.slot(field) {
                *slot = value;
            }
        }
        if let Some(k) = request.top_k {
            params.top_k = k;
        }
        for field in [Field::MinP, Field::PresencePenalty, Field::FrequencyPenalty] {
            if let (false, Some(slot)) = (self.knows(field), params.slot(field)) {
                *slot = 0.0;
            }
        }
        params.validate()?;
        Ok(Resolved { params, ignored })
    }
}

impl fmt::Display for Law {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Unknown law name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sampling law {0:?} (expected \"nucleus\" or \"ds4\")")]
pub struct UnknownLaw(pub String);

impl FromStr for Law {
    type Err = UnknownLaw;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "nucleus" => Ok(Law::Nucleus),
            "ds4" => Ok(Law::Ds4),
            other => Err(UnknownLaw(other.to_owned())),
        }
    }
}

/// Fully resolved parameters of one request (or a family's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// <= 0 means greedy.
    pub temperature: f64,
    /// Nucleus mass; 0 and 1 both mean "off" in the nucleus law.
    pub top_p: f64,
    /// <= 0 means "off".
    pub top_k: i64,
    /// ds4 law only.
    pub min_p: f64,
    /// Nucleus law only; clamped to [-2, 2] when applied.
    pub presence_penalty: f64,
    /// Nucleus law only; clamped to [-2, 2] when applied.
    pub frequency_penalty: f64,
}

impl SamplingParams {
    /// The f64 field named `field` (top_k is an integer: `None`).
    fn slot(&mut self, field: Field) -> Option<&mut f64> {
        match field {
            Field::Temperature => Some(&mut self.temperature),
            Field::TopP => Some(&mut self.top_p),
            Field::MinP => Some(&mut self.min_p),
            Field::PresencePenalty => Some(&mut self.presence_penalty),
            Field::FrequencyPenalty => Some(&mut self.frequency_penalty),
            Field::TopK => None,
        }
    }

    /// Range checks shared by the API and the replay tool.
    ///
    /// Penalties only need to be finite: the nucleus law clamps them to
    /// [-2, 2] itself (spec section 2), so rejecting e.g. 3.0 here would
    /// contradict the law.
    pub fn validate(&self) -> Result<(), ParamError> {
        let check = |field: Field, value: f64, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(ParamError::OutOfRange { field, value })
            }
        };
        let t = self.temperature;
        check(Field::Temperature, t, t.is_finite() && t >= 0.0)?;
        let p = self.top_p;
        check(Field::TopP, p, (0.0..=1.0).contains(&p))?;
        let m = self.min_p;
        check(Field::MinP, m, (0.0..=1.0).contains(&m))?;
        let pp = self.presence_penalty;
        check(Field::PresencePenalty, pp, pp.is_finite())?;
        let fp = self.frequency_penalty;
        check(Field::FrequencyPenalty, fp, fp.is_finite())?;
        if self.top_k < -1 {
            return Err(ParamError::TopK(self.top_k));
        }
        Ok(())
    }
}

/// What a request asked for; `None` keeps the family default.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingRequest {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
}

/// Output of [`Law::resolve`].
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub params: SamplingParams,
    /// Parameters the request set that this law does not have.
    pub ignored: Vec<IgnoredParameter>,
}

/// A sampling parameter name, as the API spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    Temperature,
    TopP,
    TopK,
    MinP,
    PresencePenalty,
    FrequencyPenalty,
}

impl Field {
    /// The API field name.
    pub const fn name(self) -> &'static str {
        match self {
            Field::Temperature => "temperature",
            Field::TopP => "top_p",
            Field::TopK => "top_k",
            Field::MinP => "min_p",
            Field::PresencePenalty => "presence_penalty",
            Field::FrequencyPenalty => "frequency_penalty",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request parameter that the family's law does not have (a warning the
/// API surfaces; the value was not applied).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IgnoredParameter {
    pub law: Law,
    pub field: Field,
    pub value: f64,
}

impl fmt::Display for IgnoredParameter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is not part of the {} law used by this model family; it was ignored",
            self.field, self.law
        )
    }
}

/// A parameter outside its legal range.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
pub enum ParamError {
    #[error("{field} = {value} is out of range ({})", range(*.field))]
    OutOfRange { field: Field, value: f64 },
    #[error("top_k = {0} is out of range (use -1 or 0 to disable top-k, or a positive count)")]
    TopK(i64),
}

impl ParamError {
    /// The offending field.
    pub const fn field(&self) -> Field {
        match self {
            ParamError::OutOfRange { field, .. } => *field,
            ParamError::TopK(_) => Field::TopK,
        }
    }
}

const fn range(field: Field) -> &'static str {
    match field {
        Field::Temperature => "must be finite and >= 0",
        Field::TopP | Field::MinP => "must be in [0, 1]",
        Field::PresencePenalty | Field::FrequencyPenalty => "must be finite",
        Field::TopK => "must be >= -1",
    }
}

/// Seed resolution (spec section 1): the request's seed, else the server's,
/// else a fresh seed in [0, 2^31 - 1). The caller reports the result back so
/// any sampled answer can be replayed.
///
/// The same rule serves the ds4 law: its seed is the initial xorshift state,
/// and a resolved 0 is legal there (the stream's zero guard handles it), so
/// unlike ds4's server a seed of 0 is replayable rather than "pick one".
pub fn resolve_seed(request: Option<u64>, server: Option<u64>) -> u64 {
    request.or(server).unwrap_or_else(fresh_seed)
}

/// A fresh seed from std only: `RandomState` is randomly keyed per process
/// and per instance; mixing in the time and a counter keeps successive calls
/// distinct even if the keys repeated.
fn fresh_seed() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    // 2^31 - 1 values: [0, 2^31 - 1), like `secrets.randbelow(2**31 - 1)`.
    h.finish() % ((1 << 31) - 1)
}
