//! What models remember between forwards: per-layer caches and their
//! snapshots. (Chunked prefill over these lives in [`crate::decode`].)

pub mod bank;
pub mod checkpoint;
pub mod kv_cache;
pub mod mtp;
pub mod rows;
pub mod tail;
pub mod warm;

/// The named-tensor tables now live in [`crate::table`] (a leaf module the
/// model contract, the decode loops and the state all use); this path stays
/// for the families' imports.
pub use crate::table;
