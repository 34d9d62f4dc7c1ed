//! HTTP handlers: thin functions over typed extractors. Each validates its
//! request into a [`crate::admission::Generation`], admits it, and turns the
//! worker's events into its API's response or SSE stream.

pub mod chat;
pub mod completions;
pub mod info;
pub mod messages;
pub mod responses;
pub mod status;
