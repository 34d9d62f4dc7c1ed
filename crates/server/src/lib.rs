//! `ds4-server`: the OpenAI- and Anthropic-compatible HTTP server.
//!
//! The scheduler (`scheduler`) is the centre: one thread owns the model,
//! the lanes that run turns (`lanes`, a `worker` each with its session
//! cache) and the queue of waiting requests (`queue`'s rule: bounded by
//! the tokens they reserve, first come first served); everything else
//! speaks to it through commands on a `SchedulerHandle`. Handlers parse and
//! validate (`extract`, `params`, `thinking`), render the prompt (`prompt`;
//! `deepseek_prompt` for the family rendered in code), and hand the shared
//! request layer (`request`) the common parameters: it admits the turn
//! (`admission`), turns the lane's events (`events`) into items (`output`)
//! and collects them or drives the route's SSE writer (`sse`); each route
//! (`routes`) only maps its API's shapes. Per-family serving rules
//! (`family`) and the tool-call replay memory (`tool_memory`) are chosen by
//! the family descriptor's name. The module graph has no cycle
//! (`tests/module_graph.rs`). The crate knows nothing of tensors: it sees
//! the engine only through the session cache's `decode_turn` (a
//! `TurnRequest` and a `TurnObserver`).

mod admission;
mod app;
mod config;
mod constraints;
mod deepseek_prompt;
#[cfg(test)]
mod deepseek_tests;
mod error;
mod events;
mod extract;
mod family;
#[cfg(test)]
mod family_isolation_tests;
mod guard;
mod ids;
mod images;
mod lanes;
mod metrics;
mod openapi;
mod output;
mod params;
mod prompt;
mod queue;
#[cfg(test)]
mod qwen_tests;
mod request;
mod routes;
mod scheduler;
mod sse;
mod state;
mod summary;
mod thinking;
mod tokenize;
mod tool_memory;
mod tools;
mod transport;
mod types;
mod vision;
mod vocabulary;
mod web;
mod worker;

pub use app::{Running, ServeError, build_state, router, serve, start};
pub use config::{CheckpointConfig, DEFAULT_MAX_TOKENS, QUEUE_CONTEXTS, ServerConfig};
pub use error::{ApiError, Flavor};
pub use family::Serving;
pub use images::{DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGES, ImageInput, ImageLimits};
pub use openapi::ApiDoc;
pub use state::SharedState;
pub use transport::Limits;
pub use web::embedded_bytes;
