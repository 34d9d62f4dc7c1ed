//! Building blocks shared by families. A layer is a plain struct holding its
//! tensors; `forward` documents its shapes; caches are passed in, never
//! stored in the layer.

pub mod attention;
pub mod linear;
pub mod mlp;
pub mod rms_norm;
pub mod rope;
