//! The image processor: encoded bytes → the vision tower's input, equal to
//! transformers' `Qwen2VLImageProcessor` (PIL backend) that
//! `AutoImageProcessor` gives `qwen4_exp`.
//!
//! Steps, each as the reference does it:
//! 1. decode (PNG, JPEG, WebP, GIF's first frame) and convert to RGB,
//!    compositing transparency onto white (`transformers.image_transforms.
//!    convert_to_rgb`, Pillow's `alpha_composite` arithmetic);
//! 2. `smart_resize`: the size nearest the original on a grid of
//!    `patch · merge` pixels with `min_pixels ≤ h·w ≤ max_pixels` (Python's
//!    round-half-even, then floor/ceil after scaling);
//! 3. bicubic resize on the bytes ([`super::resample`], Pillow's integers);
//! 4. rescale (`u8 as f64 · 1/255`, then to f32) and normalise
//!    (`(x − mean) / std` in f32);
//! 5. patchify into the reference's row order: merge blocks in raster order,
//!    inside a block its `merge × merge` patches in raster order, and each
//!    row `[channel][temporal copy][py][px]` (the Conv3d weight's order, so
//!    the patch embedding is one matmul).

use super::resample::{Rgb8, resize_bicubic};
use serde::Deserialize;
use std::io::Cursor;

/// Why an image was refused. Every variant is the client's input: a server
/// maps them to a 4xx that names the image.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ImageError {
    #[error("the image is empty")]
    Empty,
    #[error("unsupported image type{}: send PNG, JPEG, WebP or GIF", .0.as_deref().map(|t| format!(" ({t})")).unwrap_or_default())]
    UnsupportedType(Option<String>),
    #[error("the image data is truncated or malformed: {0}")]
    Malformed(String),
    #[error("the image is {width}x{height} pixels; at most {limit} pixels are accepted")]
    TooManyPixels { width: u64, height: u64, limit: u64 },
    #[error("the image is {width}x{height}; its aspect ratio must be below 200")]
    AspectRatio { width: u64, height: u64 },
}

/// The processor's parameters (`preprocessor_config.json`), with the
/// family's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessorConfig {
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub merge_size: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    pub rescale_factor: f64,
    /// The largest decoded image accepted (width · height), checked from
    /// the header before any pixel is decoded; not a reference parameter.
    pub max_decoded_pixels: u64,
}

impl Default for ProcessorConfig {
    /// Qwen3.5/3.6's shipped `preprocessor_config.json`.
    fn default() -> Self {
        Self {
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            rescale_factor: 1.0 / 255.0,
            max_decoded_pixels: 64 << 20,
        }
    }
}

#[derive(Deserialize)]
struct RawSize {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
}

#[derive(Deserialize)]
struct RawConfig {
    size: Option<RawSize>,
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    patch_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    merge_size: Option<usize>,
    image_mean: Option<[f64; 3]>,
    image_std: Option<[f64; 3]>,
    rescale_factor: Option<f64>,
}

impl ProcessorConfig {
    /// Reads `preprocessor_config.json`; absent fields keep the defaults.
    /// `size.{shortest,longest}_edge` win over the legacy `min_pixels` /
    /// `max_pixels`, as in the reference's constructor.
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        let raw: RawConfig = serde_json::from_str(text)?;
        let mut c = Self::default();
        if let Some(v) = raw.min_pixels {
            c.min_pixels = v;
        }
        if let Some(v) = raw.max_pixels {
            c.max_pixels = v;
        }
        if let Some(s) = raw.size {
            c.min_pixels = s.shortest_edge.unwrap_or(c.min_pixels);
            c.max_pixels = s.longest_edge.unwrap_or(c.max_pixels);
        }
        c.patch_size = raw.patch_size.unwrap_or(c.patch_size);
        c.temporal_patch_size = raw.temporal_patch_size.unwrap_or(c.temporal_patch_size);
        c.merge_size = raw.merge_size.unwrap_or(c.merge_size);
        // numpy casts the Python floats to the image's f32.
        if let Some(m) = raw.image_mean {
            c.image_mean = m.map(|v| v as f32);
        }
        if let Some(s) = raw.image_std {
            c.image_std = s.map(|v| v as f32);
        }
        c.rescale_factor = raw.rescale_factor.unwrap_or(c.rescale_factor);
        Ok(c)
    }

    /// Values per patch row: `3 · temporal · patch²`.
    pub fn patch_dim(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// One processed image: the tower's input rows and its grid.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessedImage {
    /// `[grid_h · grid_w, patch_dim]` row-major, rows in merge-block order.
    pub pixel_values: Vec<f32>,
    /// `(t, h, w)` in patches; `t` is 1 for an image.
    pub grid_thw: [usize; 3],
    /// Placeholder tokens the image takes in the prompt:
    /// `grid_h · grid_w / merge²`.
    pub merged_tokens: usize,
    /// The resized size in pixels (height, width).
    pub resized: (usize, usize),
}

/// Python's `round()` on a float: half to even.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

/// transformers' `smart_resize(height, width, factor, min_pixels,
/// max_pixels)` → (height, width).
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), ImageError> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if height == 0 || width == 0 {
        return Err(ImageError::Empty);
    }
    if h.max(w) / h.min(w) > 200.0 {
        return Err(ImageError::AspectRatio { width, height });
    }
    let mut h_bar = round_half_even(h / f) * f;
    let mut w_bar = round_half_even(w / f) * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as u64, w_bar as u64))
}

/// Decodes PNG, JPEG, WebP or GIF (first frame) into RGB, transparency
/// composited onto white.
pub fn decode_rgb(bytes: &[u8], max_pixels: u64) -> Result<Rgb8, ImageError> {
    use image::{ImageFormat, ImageReader};
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Malformed(e.to_string()))?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => {}
        Some(other) => return Err(ImageError::UnsupportedType(Some(format!("{other:?}")))),
        None => return Err(ImageError::UnsupportedType(None)),
    }
    // The size from the header first: a huge image is refused before its
    // pixels are allocated.
    let (width, height) = reader
        .into_dimensions()
        .map_err(|e| ImageError::Malformed(e.to_string()))?;
    let (w, h) = (u64::from(width), u64::from(height));
    if w * h > max_pixels {
        return Err(ImageError::TooManyPixels {
            width: w,
            height: h,
            limit: max_pixels,
        });
    }
    let img = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Malformed(e.to_string()))?
        .decode()
        .map_err(|e| match e {
            image::ImageError::Unsupported(u) => ImageError::UnsupportedType(Some(u.to_string())),
            other => ImageError::Malformed(other.to_string()),
        })?;
    if img.width() == 0 || img.height() == 0 {
        return Err(ImageError::Empty);
    }
    let (width, height) = (img.width() as usize, img.height() as usize);
    let data = if img.color().has_alpha() {
        img.to_rgba8()
            .pixels()
            .flat_map(|p| composite_on_white(p.0))
            .collect()
    } else {
        img.to_rgb8().into_raw()
    };
    Ok(Rgb8 {
        width,
        height,
        data,
    })
}

/// Pillow's `alpha_composite(white, src)` for one pixel, then RGB
/// (`libImaging/AlphaComposite.c`: 7 fractional bits, division by 255 as
/// two shifts).
fn composite_on_white([r, g, b, a]: [u8; 4]) -> [u8; 3] {
    if a == 0 {
        return [255, 255, 255];
    }
    const PREC: u32 = 7;
    let shift_div255 = |v: u32| ((v >> 8) + v) >> 8;
    let a = u32::from(a);
    let blend = 255 * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PREC) / outa255;
    let coef2 = 255 * (1 << PREC) - coef1;
    let ch = |s: u8| {
        let t = u32::from(s) * coef1 + 255 * coef2;
        (shift_div255(t + (0x80 << PREC)) >> PREC) as u8
    };
    [ch(r), ch(g), ch(b)]
}

/// Encoded image bytes → the tower's input.
pub fn process_image(bytes: &[u8], cfg: &ProcessorConfig) -> Result<ProcessedImage, ImageError> {
    let rgb = decode_rgb(bytes, cfg.max_decoded_pixels)?;
    process_rgb(&rgb, cfg)
}

/// Decoded RGB → the tower's input (steps 2–5).
pub fn process_rgb(rgb: &Rgb8, cfg: &ProcessorConfig) -> Result<ProcessedImage, ImageError> {
    let factor = (cfg.patch_size * cfg.merge_size) as u64;
    let (h, w) = smart_resize(
        rgb.height as u64,
        rgb.width as u64,
        factor,
        cfg.min_pixels,
        cfg.max_pixels,
    )?;
    let (h, w) = (h as usize, w as usize);
    let img = resize_bicubic(rgb, w, h);
    // Step 4, channel-first: numpy's f64 rescale, the f32 cast, then f32
    // arithmetic against f32 constants.
    let plane = h * w;
    let mut chw = vec![0f32; 3 * plane];
    for (i, px) in img.data.chunks_exact(3).enumerate() {
        for c in 0..3 {
            let x = (f64::from(px[c]) * cfg.rescale_factor) as f32;
            chw[c * plane + i] = (x - cfg.image_mean[c]) / cfg.image_std[c];
        }
    }
    let (ps, m, tp) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let (gh, gw) = (h / ps, w / ps);
    let dim = cfg.patch_dim();
    let mut out = Vec::with_capacity(gh * gw * dim);
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for mh in 0..m {
                for mw in 0..m {
                    let (y0, x0) = ((bh * m + mh) * ps, (bw * m + mw) * ps);
                    for c in 0..3 {
                        // An image is one frame repeated `temporal` times.
                        for _ in 0..tp {
                            for py in 0..ps {
                                let row = c * plane + (y0 + py) * w + x0;
                                out.extend_from_slice(&chw[row..row + ps]);
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(ProcessedImage {
        pixel_values: out,
        grid_thw: [1, gh, gw],
        merged_tokens: gh * gw / (m * m),
        resized: (h, w),
    })
}

/// The prompt tokens an image takes: `<|vision_start|>`, `merged_tokens`
/// image placeholders, `<|vision_end|>`.
pub fn expand_placeholders(
    merged_tokens: usize,
    vision_start: u32,
    image_pad: u32,
    vision_end: u32,
) -> Vec<u32> {
    let mut ids = Vec::with_capacity(merged_tokens + 2);
    ids.push(vision_start);
    ids.extend(std::iter::repeat_n(image_pad, merged_tokens));
    ids.push(vision_end);
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_rounds_like_python() {
        // round(2.5) == 2 and round(3.5) == 4 in Python.
        assert_eq!(smart_resize(80, 112, 32, 0, u64::MAX).unwrap(), (64, 128));
        assert_eq!(smart_resize(13, 20, 32, 2048, 8192).unwrap(), (64, 64));
        assert_eq!(smart_resize(120, 300, 32, 2048, 8192).unwrap(), (32, 128));
        assert!(matches!(
            smart_resize(1, 201, 32, 0, 1 << 30),
            Err(ImageError::AspectRatio { .. })
        ));
    }

    #[test]
    fn placeholders_wrap_the_pads() {
        assert_eq!(expand_placeholders(3, 7, 8, 9), vec![7, 8, 8, 8, 9]);
    }

    #[test]
    fn opaque_and_transparent_composite() {
        assert_eq!(composite_on_white([10, 20, 30, 255]), [10, 20, 30]);
        assert_eq!(composite_on_white([10, 20, 30, 0]), [255, 255, 255]);
    }

    #[test]
    fn garbage_and_unknown_types_are_typed_errors() {
        assert_eq!(decode_rgb(&[], 100), Err(ImageError::Empty));
        assert!(matches!(
            decode_rgb(b"hello, not an image", 100),
            Err(ImageError::UnsupportedType(None))
        ));
        // A PNG signature with nothing after it.
        let png_head = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
        assert!(matches!(
            decode_rgb(&png_head, 100),
            Err(ImageError::Malformed(_))
        ));
    }
}
