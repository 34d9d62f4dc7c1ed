//! What models remember between forwards: per-layer caches and their
//! snapshots. (Chunked prefill over these lives in [`crate::decode`].)

pub mod bank;
pub mod checkpoint;
pub mod kv_cache;
pub mod rows;
pub mod table;
pub mod warm;
