//! Whether (and how) a reply reasons, from what a request says, per family.
//!
//! Routes collect the request's reasoning controls as they are
//! ([`Controls`]); [`resolve`] reads them by the family's prompt format:
//!
//! * template families: an effort (`reasoning_effort`, `reasoning.effort`)
//!   is on/off (`params::effort`) and the API's switch (Anthropic
//!   `thinking.type`) passes through; the template gets `enable_thinking`;
//! * `deepseek_v4`: ds4's rules ([`ds4_text::deepseek_v4::thinking`]): on by
//!   default, efforts `max` / `xhigh`…`minimal` / `none`, the extension
//!   switches `thinking: {type}` and `think` on chat, the model aliases
//!   `deepseek-chat` / `deepseek-reasoner`, Think Max only with a context of
//!   at least 384K tokens.

use ds4_text::PromptFormat;
use ds4_text::deepseek_v4::{ThinkMode, ThinkingRequest, parse_effort};

use crate::error::ApiError;
use crate::params;
use crate::state::AppState;

/// A request's reasoning controls, with the field names the API uses.
#[derive(Debug, Clone, Default)]
pub struct Controls {
    /// (field, value) of an effort.
    pub effort: Option<(&'static str, String)>,
    /// (field, on) of the API's own switch (Anthropic `thinking.type`).
    pub switch: Option<(&'static str, bool)>,
    /// (field, on) of an extension switch only some families define (chat
    /// `thinking: {type}` / `think` for `deepseek_v4`); others ignore it,
    /// as they ignore any unknown field.
    pub extension: Option<(&'static str, bool)>,
    /// (field, value) of an extension effort only some families define
    /// (Anthropic `output_config.effort` for `deepseek_v4`).
    pub extension_effort: Option<(&'static str, String)>,
    /// The requested model name (aliases select a mode).
    pub model: Option<String>,
}

/// What the prompt is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// A template family: `enable_thinking` for the template (`None`: the
    /// template's default).
    Template(Option<bool>),
    /// DeepSeek-V4's mode.
    DeepSeekV4(ThinkMode),
}

impl Thinking {
    /// Whether the request asked for reasoning (`None`: it did not say).
    pub fn requested(self) -> Option<bool> {
        match self {
            Thinking::Template(on) => on,
            Thinking::DeepSeekV4(mode) => Some(mode.enabled()),
        }
    }
}

impl Default for Thinking {
    fn default() -> Self {
        Thinking::Template(None)
    }
}

/// The family's reading of `controls`; ignored controls become `warnings`.
pub fn resolve(
    state: &AppState,
    controls: &Controls,
    warnings: &mut Vec<String>,
) -> Result<Thinking, ApiError> {
    match state.profile.prompt {
        PromptFormat::Template => {
            let effort = match &controls.effort {
                Some((field, value)) => params::effort(field, Some(value))?,
                None => None,
            };
            let (field, on) = match (controls.switch, &controls.effort) {
                (Some((field, on)), _) => (field, Some(on)),
                (None, Some((field, _))) => (*field, effort),
                (None, None) => ("reasoning", None),
            };
            Ok(Thinking::Template(params::reasoning(
                &state.profile,
                field,
                on,
                warnings,
            )))
        }
        PromptFormat::DeepSeekV4 => Ok(Thinking::DeepSeekV4(deepseek(controls, state.ctx)?)),
    }
}

/// ds4's mode for `controls` with a context of `ctx` tokens.
pub fn deepseek(controls: &Controls, ctx: usize) -> Result<ThinkMode, ApiError> {
    let effort = match controls
        .effort
        .as_ref()
        .or(controls.extension_effort.as_ref())
    {
        Some((field, value)) => Some(
            parse_effort(value).map_err(|e| ApiError::invalid(*field, format!("{field} = {e}")))?,
        ),
        None => None,
    };
    Ok(ThinkingRequest {
        switch: controls.switch.or(controls.extension).map(|(_, on)| on),
        effort,
        model: controls.model.as_deref(),
    }
    .resolve(ctx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls(effort: Option<&str>, ext: Option<bool>, model: Option<&str>) -> Controls {
        Controls {
            effort: effort.map(|e| ("reasoning_effort", e.to_string())),
            switch: None,
            extension: ext.map(|on| ("think", on)),
            extension_effort: None,
            model: model.map(str::to_string),
        }
    }

    #[test]
    fn deepseek_reads_ds4s_controls() {
        let big = 393_216;
        assert_eq!(
            deepseek(&controls(None, None, None), 1).unwrap(),
            ThinkMode::High
        );
        assert_eq!(
            deepseek(&controls(Some("max"), None, None), big).unwrap(),
            ThinkMode::Max
        );
        assert_eq!(
            deepseek(&controls(Some("max"), None, None), big - 1).unwrap(),
            ThinkMode::High
        );
        assert_eq!(
            deepseek(&controls(Some("minimal"), None, None), 1).unwrap(),
            ThinkMode::High
        );
        assert_eq!(
            deepseek(&controls(Some("none"), None, None), 1).unwrap(),
            ThinkMode::None
        );
        assert_eq!(
            deepseek(&controls(None, Some(false), None), 1).unwrap(),
            ThinkMode::None
        );
        assert_eq!(
            deepseek(&controls(None, None, Some("deepseek-chat")), 1).unwrap(),
            ThinkMode::None
        );
        assert_eq!(
            deepseek(&controls(None, Some(true), Some("deepseek-chat")), 1).unwrap(),
            ThinkMode::High
        );
        let e = deepseek(&controls(Some("extreme"), None, None), 1).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
    }
}
