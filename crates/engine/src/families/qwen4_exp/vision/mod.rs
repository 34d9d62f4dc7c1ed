//! Qwen3.8-Flash-Next's vision input (`qwen4_exp` VL checkpoints).
//!
//! [`processor`]: encoded image bytes → patch rows, grid and placeholder
//! count, equal to transformers' `Qwen2VLImageProcessor` (PIL backend) —
//! the public entry a server calls is [`process_image`] (errors:
//! [`ImageError`], all of them the client's input) and
//! [`expand_placeholders`]. [`resample`] is Pillow's bicubic resize on
//! bytes, reproduced exactly. [`tower`]: the vision tower and merger on the
//! op inventory (so every backend runs it).

pub mod positions;
pub mod processor;
pub mod resample;
pub mod tower;

pub use positions::{ImageSpan, SpanError, mrope_positions};
pub use processor::{
    ImageError, ProcessedImage, ProcessorConfig, expand_placeholders, process_image, process_rgb,
    smart_resize,
};
pub use resample::{Rgb8, resize_bicubic};
pub use tower::{VisionConfig, VisionTower};
