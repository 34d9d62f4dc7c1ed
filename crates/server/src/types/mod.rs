//! Request and response types of each API (serde + OpenAPI schemas).

pub mod chat;
pub mod common;
