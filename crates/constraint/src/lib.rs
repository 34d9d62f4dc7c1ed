//! `ds4-constraint`: structured outputs. A request's JSON schema, regex,
//! Lark grammar or forced tool call is compiled by `llguidance` against the
//! model's vocabulary into a [`Constraint`], which answers, for every
//! position the decode loops sample, which tokens may come next
//! ([`ds4_engine::decode::TokenMask`]). The loops apply the mask to the
//! logits before the family's sampling law (a masked token has probability
//! 0); the laws themselves never see it.
//!
//! * [`Vocabulary`]: the token environment (every id's bytes as a trie, the
//!   stop ids that end a text the grammar accepts), built once per model
//!   from any family's [`ds4_text::Tokenizer`].
//! * [`Grammar`]: what a request asks for; [`Vocabulary::compile`] turns it
//!   into a [`Constraint`] or says what in it is unsupported
//!   ([`ConstraintError`]).
//! * [`Constraint`]: one request's grammar state. It is told each emitted
//!   token and asked for the mask after `emitted + pending`; when `pending`
//!   no longer extends what it consumed (an MTP draft was rejected) it rolls
//!   the matcher back to the common prefix first, so its answer is a
//!   function of the tokens alone. It lives for one request: never in a
//!   session or a checkpoint.
//! * [`tool_call_grammar`]: a forced tool call in the family's own format,
//!   its arguments constrained by the tool's schema.

mod constraint;
mod env;
mod error;
mod grammar;
mod tools;

pub use constraint::{Constraint, MaskTimings};
pub use env::Vocabulary;
pub use error::ConstraintError;
pub use grammar::{Grammar, JSON_OBJECT_SCHEMA, SUPPORTED_SCHEMA_KEYWORDS};
pub use tools::{ForcedTool, tool_call_grammar};
