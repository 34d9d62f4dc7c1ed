//! Typed reads of a Hugging Face `config.json`: every error names the file
//! and the field (with its scope, e.g. `text_config.`), so a bad model file
//! says what to fix.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{EngineError, Result};

pub struct Fields<'a> {
    pub path: &'a Path,
    pub json: &'a Json,
    /// `text_config.` for VL checkpoints, for error messages.
    pub scope: &'static str,
}

impl Fields<'_> {
    pub fn err(&self, field: &str, message: impl Into<String>) -> EngineError {
        EngineError::Config {
            path: self.path.to_path_buf(),
            field: format!("{}{field}", self.scope),
            message: message.into(),
        }
    }
    pub fn get(&self, field: &str) -> Option<&Json> {
        self.json.get(field).filter(|v| !v.is_null())
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
    pub fn usize(&self, field: &str) -> Result<usize> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing"))
    }
    pub fn usize_or(&self, field: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(field)?.unwrap_or(default))
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
    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }
    pub fn opt_str(&self, field: &str) -> Result<Option<&str>> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }
}
