//! Per-family text conventions: how a family marks its reasoning, how it
//! writes tool calls and how its prompt is rendered. Keyed by the engine
//! family descriptor's `name`, so the server picks a family's parsers and
//! renderer without reading any model-specific flag.

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
    /// How a conversation becomes the prompt.
    pub prompt: PromptFormat,
}

/// How a family's conversations become prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptFormat {
    /// The chat template the tokenizer ships (Jinja).
    Template,
    /// DeepSeek-V4, rendered in code as ds4 does ([`crate::deepseek_v4::prompt`]).
    DeepSeekV4,
}

/// Qwen3.5/3.6 (`qwen4_exp`): `<think>…</think>` and the XML tool calls
/// of its chat template (`<tool_call>\n<function=NAME>…`).
const QWEN: TextProfile = TextProfile {
    family: "qwen4_exp",
    reasoning: Some(ReasoningMarkers {
        open: "<think>",
        close: "</think>",
        skip_blank_after_close: true,
    }),
    tool_calls: Some(ToolCallFormat::QwenXml),
    prompt: PromptFormat::Template,
};

/// Llama-family instruct models do not reason in markers; their tool calls
/// follow the llama-3 convention of a bare JSON object.
const LLAMA: TextProfile = TextProfile {
    family: "llama",
    reasoning: None,
    tool_calls: Some(ToolCallFormat::Llama3Json),
    prompt: PromptFormat::Template,
};

/// DeepSeek-V4 as antirez/ds4 serves it: `<think>…</think>` (everything after
/// `</think>` is the answer, kept byte for byte), DSML tool calls, the prompt
/// rendered in code.
const DEEPSEEK_V4: TextProfile = TextProfile {
    family: "deepseek_v4",
    reasoning: Some(ReasoningMarkers {
        open: "<think>",
        close: "</think>",
        skip_blank_after_close: false,
    }),
    tool_calls: Some(ToolCallFormat::Dsml),
    prompt: PromptFormat::DeepSeekV4,
};

/// GLM-5 (`glm5_next`) reasons in `<think>…</think>` and writes tool calls
/// as `<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value>
/// </tool_call>`.
const GLM5: TextProfile = TextProfile {
    family: "glm5_next",
    reasoning: Some(ReasoningMarkers {
        open: "<think>",
        close: "</think>",
        skip_blank_after_close: true,
    }),
    tool_calls: Some(ToolCallFormat::Glm),
    prompt: PromptFormat::Template,
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
            "deepseek_v4" => DEEPSEEK_V4,
            _ => TextProfile {
                family: "unknown",
                reasoning: None,
                tool_calls: None,
                prompt: PromptFormat::Template,
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
        assert_eq!(qwen.tool_calls, Some(ToolCallFormat::QwenXml));
        let glm = TextProfile::for_family("glm5_next");
        assert_eq!(glm.family, "glm5_next");
        assert_eq!(
            glm.reasoning.map(|m| (m.open, m.close)),
            Some(("<think>", "</think>"))
        );
        assert_eq!(glm.tool_calls, Some(ToolCallFormat::Glm));
        assert_eq!(TextProfile::for_family("nope").tool_calls, None);
        let ds = TextProfile::for_family("deepseek_v4");
        assert_eq!(ds.family, "deepseek_v4");
        assert_eq!(ds.tool_calls, Some(ToolCallFormat::Dsml));
        assert_eq!(ds.prompt, PromptFormat::DeepSeekV4);
        assert_eq!(
            ds.reasoning.map(|m| (m.open, m.close)),
            Some(("<think>", "</think>"))
        );
        assert_eq!(qwen.prompt, PromptFormat::Template);
    }
}
