//! Per-family text conventions: how a family marks its reasoning and how it
//! writes tool calls. Keyed by the engine family descriptor's `name`, so the
//! server picks a family's parsers without reading any model-specific flag.

use crate::reasoning::ReasoningMarkers;
use crate::tool_calls::ToolCallFormat;

/// What the text layer knows about a family's output conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextProfile {
    /// The family descriptor name this profile belongs to.
    pub family: &'static str,
    /// Reasoning markers, when the family reasons in its output.
    pub reasoning: Option<ReasoningMarkers>,
    /// How the family writes tool calls, when it can call tools.
    pub tool_calls: Option<ToolCallFormat>,
}

/// The Qwen families: `<think>…</think>` and Hermes-style tool calls.
const QWEN: TextProfile = TextProfile {
    family: "qwen4_exp",
    reasoning: Some(ReasoningMarkers {
        open: "<think>",
        close: "</think>",
    }),
    tool_calls: Some(ToolCallFormat::Hermes),
};

/// Llama-family instruct models do not reason in markers; their tool calls
/// follow the llama-3 convention of a bare JSON object.
const LLAMA: TextProfile = TextProfile {
    family: "llama",
    reasoning: None,
    tool_calls: Some(ToolCallFormat::Llama3Json),
};

/// GLM-5 (`glm5_next`) reasons in `<think>…</think>`. Its own tool-call
/// format (`<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value>
/// </tool_call>`) has no parser yet; Hermes shares its `<tool_call>`
/// markers and is the closest existing format.
const GLM5: TextProfile = TextProfile {
    family: "glm5_next",
    reasoning: Some(ReasoningMarkers {
        open: "<think>",
        close: "</think>",
    }),
    tool_calls: Some(ToolCallFormat::Hermes),
};

impl TextProfile {
    /// The profile of the family named `family` (a `FamilyDescriptor::name`).
    /// Families without a profile yet get plain text: no reasoning split and
    /// no tool-call parsing (the server then refuses `tools`).
    pub fn for_family(family: &str) -> TextProfile {
        match family {
            "llama" => LLAMA,
            "qwen4_exp" => QWEN,
            "glm5_next" => GLM5,
            _ => TextProfile {
                family: "unknown",
                reasoning: None,
                tool_calls: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_keyed_by_family_name() {
        assert_eq!(TextProfile::for_family("llama").reasoning, None);
        assert_eq!(
            TextProfile::for_family("llama").tool_calls,
            Some(ToolCallFormat::Llama3Json)
        );
        let qwen = TextProfile::for_family("qwen4_exp");
        assert_eq!(qwen.reasoning.map(|m| m.open), Some("<think>"));
        assert_eq!(qwen.tool_calls, Some(ToolCallFormat::Hermes));
        let glm = TextProfile::for_family("glm5_next");
        assert_eq!(glm.family, "glm5_next");
        assert_eq!(
            glm.reasoning.map(|m| (m.open, m.close)),
            Some(("<think>", "</think>"))
        );
        assert_eq!(TextProfile::for_family("nope").tool_calls, None);
    }
}
