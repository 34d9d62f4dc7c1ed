//! Replay of JSONL sampling cases (`ds4server debug sample --law L --cases F`).
//!
//! Input: one case per line,
//! `{"id", "logits": [number | "inf" | "-inf" | "nan"], "seed", "draws",
//!   "temperature", "top_p", "top_k", "min_p", "presence_penalty",
//!   "frequency_penalty", "counts": {"<token id>": count}}`.
//! `id`, `logits` and `seed` are required; `draws` defaults to 1, a missing
//! parameter takes the law's default, `counts` defaults to empty. Blank
//! lines are skipped; unknown keys are an error. For each case a fresh
//! stream is created from `seed` (the ds4 law's seed is the initial
//! xorshift state) and `draws` tokens are sampled from the same row, with
//! the same `counts` for every draw.
//!
//! Output: one line per case, `{"id", "tokens": [...], "draws": n}` where
//! `draws` is the number of uniforms consumed (plus `"argmax_fallback":
//! true` when the ds4 law could only answer by its argmax fallback), or
//! `{"id", "error": "non_finite_logits"}` for a row the law rejects.
//! A malformed line stops the replay with an error naming the line and field.

use std::io::{BufRead, Write};

use serde_json::{Map, Value, json};

use crate::counts::TokenCounts;
use crate::params::{Law, SamplingParams};
use crate::sampler::Sampler;

/// Keys a case may carry; anything else is rejected so that a typo
/// ("temprature") cannot silently fall back to a default.
const KNOWN_KEYS: [&str; 11] = [
    "id",
    "logits",
    "seed",
    "draws",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "counts",
];

/// Most draws one case may ask for (a guard against a typo'd huge number).
pub const MAX_DRAWS: u64 = 1_000_000;

/// Totals over a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    pub cases: u64,
    /// Tokens produced over all cases.
    pub tokens: u64,
    /// Cases answered with an error line.
    pub errors: u64,
    /// Cases where the ds4 law used its argmax fallback.
    pub fallbacks: u64,
}

/// Why the replay stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("line {line}: {message}")]
    Malformed {
        line: usize,
        field: Option<&'static str>,
        message: String,
    },
    #[error("reading line {line}: {source}")]
    Read { line: usize, source: std::io::Error },
    #[error("writing output: {0}")]
    Write(#[from] std::io::Error),
}

fn malformed(line: usize, field: &'static str, what: impl std::fmt::Display) -> ReplayError {
    ReplayError::Malformed {
        line,
        field: Some(field),
        message: format!("field {field:?}: {what}"),
    }
}

/// Run every case of `input` under `law`, writing one result line each.
pub fn replay_cases(
    law: Law,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<ReplayStats, ReplayError> {
    let mut stats = ReplayStats::default();
    for (index, line) in input.lines().enumerate() {
        let n = index + 1;
        let line = line.map_err(|source| ReplayError::Read { line: n, source })?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line).map_err(|e| ReplayError::Malformed {
            line: n,
            field: None,
            message: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(obj) = value else {
            return Err(ReplayError::Malformed {
                line: n,
                field: None,
                message: "a case must be a JSON object".into(),
            });
        };
        let case = Case::parse(law, &obj, n)?;
        let result = run_case(law, &case, n)?;
        stats.cases += 1;
        let out = match result {
            Ok((tokens, draws, fallback)) => {
                stats.tokens += tokens.len() as u64;
                let mut o = json!({"id": case.id, "tokens": tokens, "draws": draws});
                if fallback {
                    stats.fallbacks += 1;
                    o["argmax_fallback"] = Value::Bool(true);
                }
                o
            }
            Err(code) => {
                stats.errors += 1;
                json!({"id": case.id, "error": code})
            }
        };
        serde_json::to_writer(&mut output, &out).map_err(std::io::Error::from)?;
        output.write_all(b"\n")?;
    }
    output.flush()?;
    Ok(stats)
}

/// One parsed case.
struct Case {
    id: Value,
    logits: Vec<f32>,
    seed: u64,
    draws: u64,
    params: SamplingParams,
    counts: TokenCounts,
}

type CaseResult = Result<(Vec<u32>, u64, bool), &'static str>;

fn run_case(law: Law, case: &Case, line: usize) -> Result<CaseResult, ReplayError> {
    let mut sampler = Sampler::new(law, case.params, case.seed)
        .map_err(|e| malformed(line, e.field().name(), e))?;
    let mut tokens = Vec::with_capacity(case.draws as usize);
    let mut fallback = false;
    for _ in 0..case.draws {
        match sampler.sample(&case.logits, &case.counts) {
            Ok(s) => {
                tokens.push(s.token);
                fallback |= s.argmax_fallback;
            }
            Err(e) => return Ok(Err(e.code())),
        }
    }
    Ok(Ok((tokens, sampler.draws_taken(), fallback)))
}

impl Case {
    fn parse(law: Law, obj: &Map<String, Value>, line: usize) -> Result<Self, ReplayError> {
        if let Some(key) = obj.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(ReplayError::Malformed {
                line,
                field: None,
                message: format!("unknown field {key:?} (known: {})", KNOWN_KEYS.join(", ")),
            });
        }
        let id = obj
            .get("id")
            .cloned()
            .ok_or_else(|| malformed(line, "id", "missing"))?;
        let logits = parse_logits(obj.get("logits"), line)?;
        let seed = match obj.get("seed") {
            Some(v) => v
                .as_u64()
                .ok_or_else(|| malformed(line, "seed", "expected an integer in [0, 2^64)"))?,
            None => return Err(malformed(line, "seed", "missing")),
        };
        let draws = match obj.get("draws") {
            None => 1,
            Some(v) => v.as_u64().filter(|&d| d <= MAX_DRAWS).ok_or_else(|| {
                malformed(
                    line,
                    "draws",
                    format!("expected an integer in [0, {MAX_DRAWS}]"),
                )
            })?,
        };
        let mut params = law.default_params();
        for (field, slot) in [
            ("temperature", &mut params.temperature),
            ("top_p", &mut params.top_p),
            ("min_p", &mut params.min_p),
            ("presence_penalty", &mut params.presence_penalty),
            ("frequency_penalty", &mut params.frequency_penalty),
        ] {
            if let Some(v) = obj.get(field) {
                *slot = v
                    .as_f64()
                    .ok_or_else(|| malformed(line, field, "expected a number"))?;
            }
        }
        if let Some(v) = obj.get("top_k") {
            params.top_k = v
                .as_i64()
                .ok_or_else(|| malformed(line, "top_k", "expected an integer"))?;
        }
        let counts = parse_counts(obj.get("counts"), line)?;
        Ok(Self {
            id,
            logits,
            seed,
            draws,
            params,
            counts,
        })
    }
}

fn parse_logits(v: Option<&Value>, line: usize) -> Result<Vec<f32>, ReplayError> {
    let Some(Value::Array(items)) = v else {
        return Err(malformed(line, "logits", "expected an array"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            match x {
                // JSON numbers are f64; logits are f32 rows, so round once.
                Value::Number(num) => num.as_f64().map(|f| f as f32),
                Value::String(s) => match s.to_ascii_lowercase().as_str() {
                    "inf" | "+inf" | "infinity" | "+infinity" => Some(f32::INFINITY),
                    "-inf" | "-infinity" => Some(f32::NEG_INFINITY),
                    "nan" => Some(f32::NAN),
                    _ => None,
                },
                _ => None,
            }
            .ok_or_else(|| {
                malformed(
                    line,
                    "logits",
                    format!("entry {i} is not a number, \"inf\", \"-inf\" or \"nan\""),
                )
            })
        })
        .collect()
}

fn parse_counts(v: Option<&Value>, line: usize) -> Result<TokenCounts, ReplayError> {
    let mut counts = TokenCounts::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, c) in map {
                let token: u32 = k.parse().map_err(|_| {
                    malformed(line, "counts", format!("key {k:?} is not a token id"))
                })?;
                let count = c
                    .as_u64()
                    .and_then(|c| u32::try_from(c).ok())
                    .ok_or_else(|| {
                        malformed(line, "counts", format!("count of {k} is not a u32"))
                    })?;
                counts.set(token, count);
            }
        }
        Some(_) => return Err(malformed(line, "counts", "expected an object")),
    }
    Ok(counts)
}
