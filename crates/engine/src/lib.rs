//! Numeric core of ds4server: model loading, layers, model families, state
//! (caches and snapshots) and the decode loops. It knows nothing of HTTP or
//! text: tokens in, logits out.

pub mod backend;
pub mod batching;
pub mod decode;
pub mod error;
pub mod families;
pub mod inspect;
pub mod layers;
pub mod load;
pub mod model;
pub mod observe;
pub mod quant;
pub mod state;
pub mod table;

pub use error::EngineError;
pub use model::{
    BatchCall, BatchOutput, BatchResult, BatchWant, DeviceRows, ForwardOutput, HiddenRows,
    LogitsRows, MediaChunk, Model, ModelState, MtpCall, MtpContract, MtpHistory, MtpStep, NoMtp,
    VerifyWindow, forward_alone,
};
