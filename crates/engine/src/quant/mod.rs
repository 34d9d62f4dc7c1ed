//! Stored weight types: what a weight file keeps (GGUF block types, 16-bit
//! floats, FP8 and FP4 with separate scale tensors), read in place and
//! dequantized row by row exactly as each format defines.
//!
//! Every backend takes weights through [`QuantTensor`]: the type, the
//! row-major shape (the last dimension is the reduction), and the stored
//! bytes, as one or more row ranges ([`QuantPart`]) — a view into a memory
//! map or an owned buffer — so fused weights (a shared expert's gate and up,
//! an expert stack's `[gate | up]` rows) need no copy. Formats whose scales
//! live in a separate tensor (safetensors FP8 with 128×128 block scales,
//! DeepSeek-V4's MXFP4 experts) carry a [`ScaleGrid`] per part.
//!
//! The reference kernel sets compute with these values and nothing else:
//! [`QuantTensor::dequantize_rows`] is the definition every product follows
//! (the CPU's reference product dequantizes a strip of rows and runs the f32
//! kernel over it, so its bits equal the f32 product of the dequantized
//! matrix).

pub mod bytes;
pub mod dequant;
pub mod quantize;
pub mod random;
pub mod tensor;
pub mod types;

pub use bytes::WeightBytes;
pub use tensor::{LayoutError, QuantPart, QuantTensor, ScaleGrid, from_candle};
pub use types::{WeightType, ggml_type_name};
