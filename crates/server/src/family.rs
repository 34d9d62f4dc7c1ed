//! How the server serves each family, beyond its text conventions
//! ([`ds4_text::TextProfile`]) and its sampling law (the engine's
//! `FamilyDescriptor`): model-name aliases, sampling a thinking reply must
//! use, DSML structure sampled greedily, exact tool-call replay. Keyed by the
//! family descriptor's `name`; a family without rules here gets none of
//! them, so nothing of one family's serving reaches another.

use ds4_sampling::SamplingParams;

/// A family's serving rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Serving {
    /// The family descriptor name these rules belong to.
    pub family: &'static str,
    /// Model names accepted besides the served model id (they may select a
    /// thinking mode: [`crate::thinking`]).
    pub model_aliases: &'static [&'static str],
    /// Sampling a reply that starts thinking must use, whatever the request
    /// asked (the request's knobs are reported as ignored).
    pub thinking_sampling: Option<SamplingParams>,
    /// In chat with tools, tool-call structure is sampled at temperature 0
    /// and payload with the request's sampling
    /// (`ds4_text::deepseek_v4::StructuralSampling`).
    pub structural_greedy: bool,
    /// Remember each sampled tool-call block under its call ids and replay
    /// it byte for byte when a later request carries those ids
    /// ([`crate::tool_memory`]).
    pub exact_tool_replay: bool,
    /// The model reads images (its engine side takes them with the prompt).
    /// False in every family's rules: it depends on the checkpoint, so
    /// `build_state` sets it when a `qwen4_exp` checkpoint has a vision
    /// tower ([`crate::vision::Vision::load`]). An image to any other model
    /// is refused ([`ApiError::image_unsupported`]).
    ///
    /// [`ApiError::image_unsupported`]: crate::error::ApiError::image_unsupported
    pub accepts_images: bool,
}

/// ds4's sampling defaults (`DS4_DEFAULT_TEMPERATURE`, `_TOP_P`, `_MIN_P`;
/// `top_k` 0), which its server forces on thinking replies (`generate_job`).
const DS4_THINKING: SamplingParams = SamplingParams {
    temperature: 1.0,
    top_p: 1.0,
    top_k: 0,
    min_p: 0.05,
    presence_penalty: 0.0,
    frequency_penalty: 0.0,
};

/// DeepSeek-V4 as antirez/ds4 serves it.
const DEEPSEEK_V4: Serving = Serving {
    family: "deepseek_v4",
    model_aliases: &[
        ds4_text::deepseek_v4::thinking::NON_THINKING_MODEL,
        ds4_text::deepseek_v4::thinking::THINKING_MODEL,
    ],
    thinking_sampling: Some(DS4_THINKING),
    structural_greedy: true,
    exact_tool_replay: true,
    accepts_images: false,
};

impl Serving {
    /// The rules of the family named `family` (a `FamilyDescriptor::name`).
    pub fn for_family(family: &str) -> Serving {
        match family {
            "deepseek_v4" => DEEPSEEK_V4,
            _ => Serving {
                family: "default",
                model_aliases: &[],
                thinking_sampling: None,
                structural_greedy: false,
                exact_tool_replay: false,
                accepts_images: false,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_deepseek_v4_has_ds4_rules() {
        let ds = Serving::for_family("deepseek_v4");
        assert_eq!(ds.model_aliases, ["deepseek-chat", "deepseek-reasoner"]);
        assert_eq!(
            ds.thinking_sampling
                .map(|p| (p.temperature, p.top_p, p.top_k, p.min_p)),
            Some((1.0, 1.0, 0, 0.05))
        );
        assert!(ds.structural_greedy && ds.exact_tool_replay);
        for other in ["llama", "qwen4_exp", "glm5_next", ""] {
            let s = Serving::for_family(other);
            assert!(
                s.model_aliases.is_empty() && s.thinking_sampling.is_none(),
                "{other}"
            );
            assert!(!s.structural_greedy && !s.exact_tool_replay, "{other}");
            assert!(
                !s.accepts_images,
                "{other}: set per checkpoint, not per family"
            );
        }
    }
}
