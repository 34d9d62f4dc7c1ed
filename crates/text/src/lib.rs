//! `ds4-text`: everything between text and token ids.
//!
//! * [`Tokenizer`]: from `tokenizer.json`/a Hugging Face directory, or from GGUF metadata
//!   (byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`), matching
//!   transformers' ids.
//! * [`ChatTemplate`]: Jinja chat templates rendered as transformers' `apply_chat_template` does.
//! * [`Detokenizer`]: incremental decoding that never emits half a UTF-8 character.
//! * [`StopMatcher`]: stop strings matched across token boundaries and never emitted.
//! * [`TextStream`]: detokenizer + stop strings + stop tokens for one streamed turn (what the
//!   server's worker and the CLI's `run` and `chat` share).
//! * [`TextProfile`]: a family's reasoning markers ([`ReasoningSplitter`]), tool-call format
//!   ([`ToolCallParser`]), both incremental, and how its prompt is rendered ([`PromptFormat`]).
//! * [`deepseek_v4`]: the `deepseek_v4` family's prompt, thinking modes and DSML tool calls, as
//!   antirez/ds4 serves DeepSeek-V4.

pub mod chat_template;
pub mod deepseek_v4;
pub mod detokenizer;
pub mod error;
pub mod profile;
pub mod reasoning;
pub mod stop;
pub mod stream;
pub mod tokenizer;
pub mod tool_calls;

pub use chat_template::{ChatTemplate, RenderOptions};
pub use detokenizer::Detokenizer;
pub use error::{Result, TextError};
pub use profile::{PromptFormat, TextProfile};
pub use reasoning::{ReasoningMarkers, ReasoningSplitter, Split};
pub use stop::{StopMatcher, StopOutcome};
pub use stream::{Piece, TextStream};
pub use tokenizer::{SpecialToken, TokenBytes, Tokenizer};
pub use tool_calls::{ToolCallFormat, ToolCallParser, ToolEvent, ToolSchemas};
