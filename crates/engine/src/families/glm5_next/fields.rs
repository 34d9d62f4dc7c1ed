//! The reads GLM-5's config needs beyond the shared typed reader
//! ([`crate::load::config_fields::Fields`]): explicit `null`s (which select
//! behaviour in transformers: `linear_lower_bound: null` is the softplus
//! gate), sizes that must be positive, signed ids, finite numbers and
//! string lists. Every error names the file and the scoped field.

use crate::error::Result;
use crate::load::config_fields::Fields;

pub(super) trait FieldsExt {
    /// Whether `field` is present with an explicit `null`.
    fn is_null(&self, field: &str) -> bool;
    /// A strictly positive integer (a size), `default` when absent.
    fn positive_or(&self, field: &str, default: usize) -> Result<usize>;
    /// A signed integer (token ids may be negative in the wild).
    fn opt_i64(&self, field: &str) -> Result<Option<i64>>;
    /// A finite number, `default` when absent.
    fn finite_or(&self, field: &str, default: f64) -> Result<f64>;
    /// A list of strings, `None` when absent or `null`.
    fn opt_strings(&self, field: &str) -> Result<Option<Vec<String>>>;
}

impl FieldsExt for Fields<'_> {
    fn is_null(&self, field: &str) -> bool {
        self.json.get(field).is_some_and(|v| v.is_null())
    }

    fn positive_or(&self, field: &str, default: usize) -> Result<usize> {
        let v = self.usize_or(field, default)?;
        if v == 0 {
            return Err(self.err(field, "must be positive"));
        }
        Ok(v)
    }

    fn opt_i64(&self, field: &str) -> Result<Option<i64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected an integer, found {v}"))),
        }
    }

    fn finite_or(&self, field: &str, default: f64) -> Result<f64> {
        let v = self.opt_f64(field)?.unwrap_or(default);
        if !v.is_finite() {
            return Err(self.err(field, format!("{v} is not a finite number")));
        }
        Ok(v)
    }

    fn opt_strings(&self, field: &str) -> Result<Option<Vec<String>>> {
        match self.get(field) {
            None => Ok(None),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        self.err(
                            &format!("{field}[{i}]"),
                            format!("expected a string, found {v}"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.err(field, format!("expected a list of strings, found {v}"))),
        }
    }
}
