//! Building blocks shared by families, written against the op inventory
//! ([`crate::backend::Backend`]). A layer is a plain struct holding its
//! weights (bound through [`crate::load::binder::Binder`]); `forward`
//! documents its shapes; caches are passed in, never stored in the layer.

pub mod attention;
pub mod compressor;
pub mod delta_rule;
pub mod embedding;
pub mod hyper_connections;
pub mod indexer;
pub mod kda;
pub mod linear;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod norms;
pub mod pooled_indexer;
pub mod rope;
