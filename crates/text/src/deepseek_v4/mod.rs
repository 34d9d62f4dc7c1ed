//! The `deepseek_v4` family's text conventions, as antirez/ds4 serves
//! DeepSeek-V4 (`ds4_server.c`, commit 8d57664; fixtures in
//! `tests/fixtures/deepseek_v4/` come from ds4's own code through
//! `tools/oracle/deepseek_v4/`).
//!
//! * [`prompt`]: the chat prompt rendered in code (the model ships no
//!   template): BOS, Think Max prefix, tools block, system text, turns.
//! * [`thinking`]: thinking modes and how a request selects one.
//! * [`dsml`]: the DSML markup of tool calls: literals, entities, the tools
//!   block, canonical DSML for calls that arrive as JSON.
//! * [`tool_stream`]: DSML tool calls parsed out of streamed text.
//! * [`decode_state`] and [`structural`]: which positions of a tool call are
//!   structure (sampled at temperature 0) and which are payload.

pub mod decode_state;
pub mod dsml;
mod json_args;
pub mod prompt;
pub mod structural;
pub mod thinking;
pub mod tool_stream;

pub use decode_state::{DsmlState, DsmlTracker};
pub use prompt::{Call, Message, Role, render};
pub use structural::StructuralSampling;
pub use thinking::{ThinkMode, ThinkingRequest, parse_effort};
