//! What every handler shares: the scheduler's handle, the tokenizer and chat
//! template, the family's text profile, serving rules and sampling law, the
//! tool-call replay memory, limits, metrics.

use std::sync::Arc;

use ds4_engine::families::FamilyDescriptor;
use ds4_text::{ChatTemplate, TextProfile, Tokenizer};

use crate::config::ServerConfig;
use crate::error::ApiError;
use crate::family::Serving;
use crate::metrics::Metrics;
use crate::scheduler::SchedulerHandle;
use crate::tool_memory::ToolMemory;

pub struct AppState {
    pub config: ServerConfig,
    /// The only way to the engine: routes submit and cancel through it.
    pub scheduler: SchedulerHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// The template renders `tools` itself; otherwise the server describes
    /// them in the system message, in the family's tool-call format.
    pub template_has_tools: bool,
    pub profile: TextProfile,
    /// The family's serving rules (aliases, forced thinking sampling,
    /// greedy tool-call structure, exact replay).
    pub serving: Serving,
    /// Sampled tool-call blocks by call id (used when
    /// `serving.exact_tool_replay`).
    pub tool_memory: ToolMemory,
    /// The vocabulary structured outputs compile against (built on first use).
    pub vocabulary: crate::vocabulary::LazyVocabulary,
    pub descriptor: &'static FamilyDescriptor,
    /// The backend id of the loaded model (`cpu-avx512`, `cpu-avx512-fast`,
    /// `cuda-sm_90a`): where it runs and with which kernels.
    pub backend: String,
    /// The kernel set the model's products run (`reference`, `fast`).
    pub kernel_set: &'static str,
    /// The KV cache element type of the model's sessions (`f32`, `f16`).
    pub kv_cache: &'static str,
    /// Effective context: `--ctx`, capped at the model's.
    pub ctx: usize,
    /// The vision tower, processor and prompt ids of a model that reads
    /// images (`serving.accepts_images` is set exactly then).
    pub vision: Option<Arc<crate::vision::Vision>>,
    /// The model's MTP head, if it has one.
    pub mtp: Option<ds4_engine::model::MtpContract>,
    pub metrics: Arc<Metrics>,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    /// Whether `model` names the served model: its id, a `--model-alias`
    /// or one of the family's aliases (`deepseek-chat`, ...).
    pub fn is_listed_model(&self, model: &str) -> bool {
        model == self.config.model_id
            || self.config.model_aliases.iter().any(|a| a == model)
            || self.serving.model_aliases.contains(&model)
    }

    /// By default any model name is served by the loaded model (responses
    /// report the served id); with `--strict-model-names` a name that is not
    /// listed is refused. Naming none is always fine.
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if self.config.strict_model_names && !self.is_listed_model(m) => {
                Err(ApiError::unknown_model(m, &self.config.model_id))
            }
            _ => Ok(()),
        }
    }

    /// A rendered chat prompt's tokens (special-token text parsed). A text
    /// that cannot fit the context is refused as soon as that is certain
    /// (`crate::tokenize`), without encoding the rest of it.
    pub fn count_tokens(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenize(text, |t| self.tokenizer.encode(t, true))
    }

    /// A raw prompt's tokens as transformers' `encode` gives them (BOS when
    /// the tokenizer asks for it), with the same early refusal.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenize(text, |t| self.tokenizer.encode_prompt(t))
    }

    fn tokenize(
        &self,
        text: &str,
        encode: impl Fn(&str) -> ds4_text::Result<Vec<u32>>,
    ) -> Result<Vec<u32>, ApiError> {
        let failed = |e: ds4_text::TextError| {
            ApiError::internal(format!("tokenizing the prompt failed: {e}"))
        };
        let counted = crate::tokenize::count_bounded(text, self.ctx, |piece| {
            self.tokenizer.encode(piece, true).map(|ids| ids.len())
        })
        .map_err(failed)?;
        if let crate::tokenize::Count::AtLeast(n) = counted {
            self.metrics.rejected_context();
            return Err(ApiError::context_exceeded_at_least(n, self.ctx));
        }
        encode(text).map_err(failed)
    }
}

#[cfg(test)]
pub mod testing {
    //! Shared state without a model (the scheduler refuses every job): for
    //! tests of a family's rendering and admission rules.

    use std::net::SocketAddr;
    use std::sync::Arc;

    use ds4_engine::families::FamilyDescriptor;
    use ds4_text::{ChatTemplate, TextProfile, Tokenizer};

    use super::{AppState, SharedState};
    use crate::config::ServerConfig;
    use crate::family::Serving;
    use crate::scheduler::SchedulerHandle;
    use crate::tool_memory::ToolMemory;

    pub fn state(
        descriptor: &'static FamilyDescriptor,
        tokenizer: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        model_id: &str,
        ctx: usize,
    ) -> SharedState {
        Arc::new(AppState {
            config: ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), model_id),
            scheduler: SchedulerHandle::detached(),
            template_has_tools: tokenizer
                .chat_template()
                .is_some_and(|t| t.contains("tools")),
            tokenizer,
            template,
            profile: TextProfile::for_family(descriptor.name),
            serving: Serving::for_family(descriptor.name),
            tool_memory: ToolMemory::default(),
            vocabulary: Default::default(),
            descriptor,
            backend: "cpu-test".into(),
            kernel_set: "reference",
            kv_cache: "f32",
            ctx,
            vision: None,
            mtp: None,
            metrics: Arc::default(),
            created: 0,
        })
    }
}
