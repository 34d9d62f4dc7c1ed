//! Request and response types of each API (serde + OpenAPI schemas).

pub mod anthropic;
pub mod chat;
pub mod common;
pub mod completions;
pub mod responses;
