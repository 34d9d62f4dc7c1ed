//! DeepSeek-V4's thinking modes and how a request selects one, as ds4 decides
//! (`think_mode_from_enabled`, `parse_reasoning_effort_name`,
//! `model_alias_*_thinking` in `antirez/ds4:ds4_server.c`;
//! `ds4_think_mode_for_context` in `ds4.c`).
//!
//! * Thinking is on by default (mode High).
//! * An explicit switch (`thinking: {"type": "enabled" | "disabled"}`,
//!   `think: true | false`) wins; without one, the model name `deepseek-chat`
//!   turns thinking off and `deepseek-reasoner` on.
//! * The effort (`reasoning_effort`, `reasoning.effort`,
//!   `output_config.effort`): `max` asks for Think Max, `xhigh`, `high`,
//!   `medium`, `low` and `minimal` are all High (the model has no smaller
//!   non-zero level), `none` turns thinking off.
//! * Think Max is only a prompt prefix; it is applied only when the context is
//!   at least [`THINK_MAX_MIN_CONTEXT`] tokens, below that it is High.

/// The prefix Think Max puts after BOS (`DS4_REASONING_EFFORT_MAX_PREFIX`).
pub const THINK_MAX_PREFIX: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n\
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.\n\
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

/// DeepSeek recommends Think Max only with a context of at least 384K tokens
/// (`DS4_THINK_MAX_MIN_CONTEXT`): below that the prefix would ask for a
/// reasoning budget the context cannot hold.
pub const THINK_MAX_MIN_CONTEXT: usize = 393_216;

/// The model name that selects non-thinking mode when the request does not
/// say otherwise.
pub const NON_THINKING_MODEL: &str = "deepseek-chat";
/// The model name that selects thinking mode when the request does not say
/// otherwise.
pub const THINKING_MODEL: &str = "deepseek-reasoner";

/// How the reply is asked to think.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkMode {
    /// The prompt closes the reasoning block (`</think>`) before the answer.
    None,
    /// The prompt opens it (`<think>`).
    High,
    /// High plus the Think Max prefix.
    Max,
}

impl ThinkMode {
    /// Whether the reply starts inside `<think>`.
    pub fn enabled(self) -> bool {
        self != ThinkMode::None
    }

    /// ds4's name (`ds4_think_mode_name`).
    pub fn name(self) -> &'static str {
        match self {
            ThinkMode::None => "none",
            ThinkMode::High => "high",
            ThinkMode::Max => "max",
        }
    }
}

/// An effort value the family does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected one of max, xhigh, high, medium, low, minimal, none")]
pub struct UnknownEffort(pub String);

/// An effort name as a mode (`parse_reasoning_effort_name`).
pub fn parse_effort(effort: &str) -> Result<ThinkMode, UnknownEffort> {
    match effort {
        "max" => Ok(ThinkMode::Max),
        "xhigh" | "high" | "medium" | "low" | "minimal" => Ok(ThinkMode::High),
        "none" => Ok(ThinkMode::None),
        other => Err(UnknownEffort(other.to_string())),
    }
}

/// What a request said about thinking.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThinkingRequest<'a> {
    /// An explicit on/off switch.
    pub switch: Option<bool>,
    /// The parsed effort ([`parse_effort`]).
    pub effort: Option<ThinkMode>,
    /// The requested model name.
    pub model: Option<&'a str>,
}

impl ThinkingRequest<'_> {
    /// The mode the request selects with a context of `ctx` tokens.
    pub fn resolve(&self, ctx: usize) -> ThinkMode {
        let enabled = self
            .switch
            .unwrap_or(self.model != Some(NON_THINKING_MODEL));
        let mode = match (enabled, self.effort.unwrap_or(ThinkMode::High)) {
            (false, _) | (true, ThinkMode::None) => ThinkMode::None,
            (true, ThinkMode::Max) => ThinkMode::Max,
            (true, ThinkMode::High) => ThinkMode::High,
        };
        if mode == ThinkMode::Max && ctx < THINK_MAX_MIN_CONTEXT {
            ThinkMode::High
        } else {
            mode
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(
        switch: Option<bool>,
        effort: Option<&str>,
        model: Option<&str>,
        ctx: usize,
    ) -> ThinkMode {
        ThinkingRequest {
            switch,
            effort: effort.map(|e| parse_effort(e).unwrap()),
            model,
        }
        .resolve(ctx)
    }

    #[test]
    fn ds4s_rules() {
        let big = THINK_MAX_MIN_CONTEXT;
        assert_eq!(resolve(None, None, None, 1), ThinkMode::High);
        assert_eq!(
            resolve(Some(false), Some("max"), None, big),
            ThinkMode::None
        );
        assert_eq!(
            resolve(None, None, Some("deepseek-chat"), 1),
            ThinkMode::None
        );
        assert_eq!(
            resolve(Some(true), None, Some("deepseek-chat"), 1),
            ThinkMode::High
        );
        assert_eq!(
            resolve(None, None, Some("deepseek-reasoner"), 1),
            ThinkMode::High
        );
        assert_eq!(
            resolve(None, Some("none"), Some("deepseek-reasoner"), 1),
            ThinkMode::None
        );
        assert_eq!(resolve(None, Some("max"), None, big - 1), ThinkMode::High);
        assert_eq!(resolve(None, Some("max"), None, big), ThinkMode::Max);
        for e in ["xhigh", "high", "medium", "low", "minimal"] {
            assert_eq!(resolve(None, Some(e), None, big), ThinkMode::High, "{e}");
        }
        assert!(
            parse_effort("huge")
                .unwrap_err()
                .to_string()
                .contains("minimal")
        );
    }
}
