//! Validation shared by every API: ranges of the sampling fields, `n`,
//! `mtp_depth`, stop strings. One place, so the same field is judged the
//! same way whichever API carries it.

use ds4_sampling::SamplingRequest;
use serde::Deserialize;
use utoipa::ToSchema;

use crate::error::ApiError;

/// A stop field: one string or a list.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

/// At most this many stop strings (OpenAI allows 4; Anthropic more).
pub const MAX_STOPS: usize = 16;

pub fn stops(field: &str, stop: Option<StopField>) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            field,
            format!(
                "{field}: at most {MAX_STOPS} stop sequences (got {})",
                list.len()
            ),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            field,
            format!("{field}: stop sequences must not be empty"),
        ));
    }
    Ok(list)
}

fn range(field: &str, v: Option<f64>, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match v {
        Some(x) if !(lo..=hi).contains(&x) => Err(ApiError::invalid(
            field,
            format!("{field} = {x} is out of range: it must be between {lo} and {hi}"),
        )),
        other => Ok(other),
    }
}

/// The sampling fields every API shares, as the request gave them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
}

impl SamplingFields {
    /// API-level ranges (OpenAI's documented ones; `temperature` up to
    /// `max_temperature`, which is 1 for Anthropic); the family's law then
    /// checks its own and reports what it ignores.
    pub fn validate(self, max_temperature: f64) -> Result<SamplingRequest, ApiError> {
        let top_k = match self.top_k {
            Some(k) if k < -1 => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!(
                        "top_k = {k} is out of range: use -1 or 0 to disable, or a positive count"
                    ),
                ));
            }
            other => other,
        };
        Ok(SamplingRequest {
            temperature: range("temperature", self.temperature, 0.0, max_temperature)?,
            top_p: range("top_p", self.top_p, 0.0, 1.0)?,
            top_k,
            min_p: range("min_p", self.min_p, 0.0, 1.0)?,
            presence_penalty: range("presence_penalty", self.presence_penalty, -2.0, 2.0)?,
            frequency_penalty: range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?,
        })
    }
}

/// Only one choice per request: the worker runs one turn at a time and
/// several samples of one prompt are several requests.
pub fn n(n: Option<u64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(other) => Err(ApiError::invalid(
            "n",
            format!("n = {other} is not supported: this server returns exactly one choice (n = 1)"),
        )),
    }
}

/// `mtp_depth` (extension) against the model's MTP contract: `None` keeps
/// the server's default, 0 is plain AR decoding, and a depth the model
/// cannot run (no MTP head, or above the family's maximum) is refused
/// rather than silently ignored.
pub fn mtp_depth(
    contract: Option<ds4_engine::model::MtpContract>,
    depth: Option<u64>,
) -> Result<Option<usize>, ApiError> {
    match (depth, contract) {
        (None, _) => Ok(None),
        (Some(0), _) => Ok(Some(0)),
        (Some(d), None) => Err(ApiError::invalid(
            "mtp_depth",
            format!("mtp_depth = {d}: this model family has no MTP head (only 0 is accepted)"),
        )),
        (Some(d), Some(c)) if d > c.max_depth as u64 => Err(ApiError::invalid(
            "mtp_depth",
            format!(
                "mtp_depth = {d} is above this family's maximum draft depth {}",
                c.max_depth
            ),
        )),
        (Some(d), Some(_)) => Ok(Some(d as usize)),
    }
}

/// A requested output limit: at least 1.
pub fn max_tokens(field: &str, v: Option<u64>) -> Result<Option<u64>, ApiError> {
    match v {
        Some(0) => Err(ApiError::invalid(
            field,
            format!("{field} must be at least 1"),
        )),
        other => Ok(other),
    }
}

/// `top_logprobs`: at most 20 alternatives (OpenAI's limit).
pub fn top_logprobs(field: &str, v: Option<u64>) -> Result<usize, ApiError> {
    match v {
        Some(k) if k > 20 => Err(ApiError::invalid(
            field,
            format!("{field} = {k} is out of range: at most 20"),
        )),
        other => Ok(other.unwrap_or(0) as usize),
    }
}

/// A reasoning switch (`reasoning_effort`, `reasoning.effort`, Anthropic
/// `thinking`): passed to the template for families that reason; for the
/// others a request to reason is reported as ignored, not silently dropped.
pub fn reasoning(
    profile: &ds4_text::TextProfile,
    field: &str,
    on: Option<bool>,
    warnings: &mut Vec<String>,
) -> Option<bool> {
    match (profile.reasoning, on) {
        (Some(_), on) => on,
        (None, Some(true)) => {
            warnings.push(format!(
                "{field} was ignored: the {} family does not produce separate reasoning",
                profile.family
            ));
            None
        }
        (None, _) => None,
    }
}

/// Anthropic's smallest thinking budget.
pub const MIN_THINKING_BUDGET: u64 = 1024;

/// Anthropic `thinking.budget_tokens`: at least 1024 and below `max_tokens`
/// (Anthropic's rules). `None` when thinking is not enabled.
pub fn thinking_budget(
    budget: Option<u64>,
    enabled: bool,
    max_tokens: u64,
) -> Result<Option<usize>, ApiError> {
    let field = "thinking.budget_tokens";
    match (enabled, budget) {
        (false, _) => Ok(None),
        (true, None) => Err(ApiError::invalid(
            field,
            format!("{field}: field required when thinking.type is \"enabled\""),
        )),
        (true, Some(b)) if b < MIN_THINKING_BUDGET => Err(ApiError::invalid(
            field,
            format!("{field} = {b} is out of range: it must be at least {MIN_THINKING_BUDGET}"),
        )),
        (true, Some(b)) if b >= max_tokens => Err(ApiError::invalid(
            field,
            format!("{field} = {b} must be less than max_tokens ({max_tokens})"),
        )),
        (true, Some(b)) => Ok(Some(b as usize)),
    }
}

/// `reasoning_effort` / `reasoning.effort` values: on or off.
pub fn effort(field: &str, effort: Option<&str>) -> Result<Option<bool>, ApiError> {
    match effort {
        None => Ok(None),
        Some("none" | "minimal") => Ok(Some(false)),
        Some("low" | "medium" | "high") => Ok(Some(true)),
        Some(other) => Err(ApiError::invalid(
            field,
            format!("{field} = {other:?}: expected one of none, minimal, low, medium, high"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_name_the_field() {
        let e = SamplingFields {
            temperature: Some(1e300),
            ..Default::default()
        }
        .validate(2.0)
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let anthropic = SamplingFields {
            temperature: Some(1.5),
            ..Default::default()
        };
        assert!(anthropic.validate(2.0).is_ok());
        let e = anthropic.validate(1.0).unwrap_err();
        assert!(e.message.contains("temperature") && e.message.contains("between 0 and 1"));
        let e = SamplingFields {
            top_p: Some(-0.5),
            ..Default::default()
        }
        .validate(2.0)
        .unwrap_err();
        assert!(e.message.contains("top_p"), "{}", e.message);
        assert!(SamplingFields::default().validate(2.0).is_ok());
        assert!(n(Some(2)).is_err() && n(Some(1)).is_ok());
        assert!(
            mtp_depth(None, Some(2))
                .unwrap_err()
                .message
                .contains("MTP")
        );
        assert_eq!(mtp_depth(None, Some(0)).unwrap(), Some(0));
        let head = ds4_engine::model::MtpContract {
            default_depth: 1,
            max_depth: 3,
            hidden: "h",
            min_draft_confidence: None,
        };
        assert_eq!(mtp_depth(Some(head), Some(3)).unwrap(), Some(3));
        assert!(
            mtp_depth(Some(head), Some(4))
                .unwrap_err()
                .message
                .contains("maximum")
        );
        assert!(max_tokens("max_tokens", Some(0)).is_err());
        assert!(stops("stop", Some(StopField::Many(vec![String::new()]))).is_err());
        assert_eq!(thinking_budget(Some(5), false, 10).unwrap(), None);
        for (b, needle) in [
            (None, "required"),
            (Some(1023), "at least 1024"),
            (Some(4096), "less than max_tokens"),
        ] {
            let e = thinking_budget(b, true, 4096).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"));
            assert!(e.message.contains(needle), "{}", e.message);
        }
        assert_eq!(thinking_budget(Some(1024), true, 4096).unwrap(), Some(1024));
    }
}
