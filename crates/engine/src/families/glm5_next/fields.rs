//! Typed reads of one JSON object of a `config.json`, every error naming
//! the file and the field (with its scope, e.g. `text_config.`), the way
//! transformers' strict dataclasses refuse a value of the wrong type.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{EngineError, Result};

pub(super) struct Fields<'a> {
    pub path: &'a Path,
    pub json: &'a Json,
    /// Prefix of every field name in errors (`""` or `text_config.`).
    pub scope: String,
}

impl<'a> Fields<'a> {
    pub fn err(&self, field: &str, message: impl Into<String>) -> EngineError {
        EngineError::Config {
            path: self.path.to_path_buf(),
            field: format!("{}{field}", self.scope),
            message: message.into(),
        }
    }

    /// The value of `field`, `None` when absent or `null`.
    pub fn get(&self, field: &str) -> Option<&'a Json> {
        self.json.get(field).filter(|v| !v.is_null())
    }

    /// Whether `field` is present with an explicit `null`.
    pub fn is_null(&self, field: &str) -> bool {
        self.json.get(field).is_some_and(|v| v.is_null())
    }

    pub fn opt_usize(&self, field: &str) -> Result<Option<usize>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(field, format!("expected a non-negative integer, found {v}"))
                }),
        }
    }

    pub fn usize_or(&self, field: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(field)?.unwrap_or(default))
    }

    /// A strictly positive integer (a size), `default` when absent.
    pub fn positive_or(&self, field: &str, default: usize) -> Result<usize> {
        let v = self.usize_or(field, default)?;
        if v == 0 {
            return Err(self.err(field, "must be positive"));
        }
        Ok(v)
    }

    /// A signed integer (token ids may be negative in the wild).
    pub fn opt_i64(&self, field: &str) -> Result<Option<i64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected an integer, found {v}"))),
        }
    }

    pub fn opt_f64(&self, field: &str) -> Result<Option<f64>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    /// A finite number, `default` when absent.
    pub fn finite_or(&self, field: &str, default: f64) -> Result<f64> {
        let v = self.opt_f64(field)?.unwrap_or(default);
        if !v.is_finite() {
            return Err(self.err(field, format!("{v} is not a finite number")));
        }
        Ok(v)
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    /// A list of strings, `None` when absent or `null`.
    pub fn opt_strings(&self, field: &str) -> Result<Option<Vec<&'a str>>> {
        match self.get(field) {
            None => Ok(None),
            Some(Json::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().ok_or_else(|| {
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
