//! Images in requests, family-neutral: an OpenAI chat `image_url` part, a
//! Responses `input_image` part or an Anthropic `image` block becomes an
//! [`ImageInput`] (media type, bytes, SHA-256), checked against the
//! server's limits ([`ImageLimits`]), in the order the images appear in the
//! conversation. The template places each image's tokens
//! (`<|vision_start|><|image_pad|><|vision_end|>` for qwen4_exp) where its
//! part stood; the images travel next to the rendered prompt.
//!
//! Only inline images are accepted (a `data:` URL, Anthropic's `base64`
//! source): the server makes no outbound requests, so an `http(s)` URL or an
//! Anthropic `url` source is refused with a 400 saying so. The declared media
//! type must be one of PNG, JPEG, WebP or GIF and must match the bytes'
//! signature; decoding the pixels is the model's image processor's work.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// Default `--max-images`: images in one request.
pub const DEFAULT_MAX_IMAGES: usize = 16;
/// Default `--max-image-bytes`: one image's decoded size (5 MiB,
/// Anthropic's per-image limit; base64 makes it about 6.7 MiB of JSON,
/// inside the default 8 MiB `--body-limit`).
pub const DEFAULT_MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// The server's image limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    pub max_images: usize,
    pub max_image_bytes: usize,
}

impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_images: DEFAULT_MAX_IMAGES,
            max_image_bytes: DEFAULT_MAX_IMAGE_BYTES,
        }
    }
}

/// One image of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// `image/png`, `image/jpeg`, `image/webp` or `image/gif`.
    pub media_type: &'static str,
    pub bytes: Arc<[u8]>,
    /// SHA-256 of `bytes`: what a cached prefix with images is keyed by.
    pub sha256: [u8; 32],
    /// The request field that carried it (named when the model's image
    /// processor refuses it).
    pub field: String,
}

/// The images of one request, in conversation order.
#[derive(Debug, Clone)]
pub struct Images {
    pub list: Vec<ImageInput>,
    /// The request field of each image.
    pub fields: Vec<String>,
    limits: ImageLimits,
    /// The model reads images; without that every image part is refused
    /// as it was before images were parsed (`ApiError::image_unsupported`).
    accepts: bool,
}

impl Images {
    /// `accepts`: the model reads images (`Serving::accepts_images`).
    pub fn new(limits: ImageLimits, accepts: bool) -> Self {
        Self {
            list: Vec::new(),
            fields: Vec::new(),
            limits,
            accepts,
        }
    }

    /// For a model that reads no images: the refusal of the image part at
    /// `field`, before anything in it is looked at.
    fn accepts(&self, field: &str) -> Result<(), ApiError> {
        match self.accepts {
            true => Ok(()),
            false => Err(ApiError::image_unsupported(field)),
        }
    }

    /// An OpenAI `image_url` value: `{"url": …}` or the URL string.
    pub fn push_image_url(&mut self, field: &str, value: Option<&Value>) -> Result<(), ApiError> {
        self.accepts(field)?;
        let url = match value {
            Some(Value::String(u)) => Some(u.as_str()),
            Some(Value::Object(o)) => o.get("url").and_then(Value::as_str),
            _ => None,
        };
        let url_field = format!("{field}.image_url");
        let url = url.ok_or_else(|| {
            ApiError::invalid(
                url_field.clone(),
                format!("{url_field} must be {{\"url\": \"data:image/png;base64,…\"}}"),
            )
        })?;
        self.push_url(field, url)
    }

    /// An OpenAI `image_url` (chat: `{"url": …}` or the bare string;
    /// Responses: the string) at `field`.
    pub fn push_url(&mut self, field: &str, url: &str) -> Result<(), ApiError> {
        self.accepts(field)?;
        let (media_type, data) = parse_data_url(field, url)?;
        self.push(field, media_type, data)
    }

    /// An Anthropic image `source` at `field` (`{"type": "base64",
    /// "media_type", "data"}`; a `url` source is refused).
    pub fn push_anthropic(&mut self, field: &str, source: Option<&Value>) -> Result<(), ApiError> {
        self.accepts(field)?;
        let source_field = format!("{field}.source");
        let Some(source) = source.and_then(Value::as_object) else {
            return Err(ApiError::invalid(
                source_field.clone(),
                format!(
                    "{source_field} is required: {{\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \"…\"}}"
                ),
            ));
        };
        match source.get("type").and_then(Value::as_str) {
            Some("base64") => {}
            Some("url") => return Err(no_outbound(&source_field)),
            other => {
                return Err(ApiError::invalid(
                    format!("{source_field}.type"),
                    format!(
                        "{source_field}.type = {other:?}: only \"base64\" image sources are \
                         accepted"
                    ),
                ));
            }
        }
        let media = source
            .get("media_type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let data = source.get("data").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                format!("{source_field}.data"),
                format!("{source_field}.data is required (the image, base64-encoded)"),
            )
        })?;
        self.push(&format!("{source_field}.data"), media, data)
    }

    fn push(&mut self, field: &str, media: &str, data: &str) -> Result<(), ApiError> {
        if self.list.len() >= self.limits.max_images {
            return Err(limit_error(
                field,
                format!(
                    "{field}: more than {} images in one request (the server's --max-images)",
                    self.limits.max_images
                ),
            ));
        }
        let media_type = media_type(field, media)?;
        // Base64 is 4 bytes per 3: refuse an oversized image before decoding it.
        let max = self.limits.max_image_bytes;
        if data.len() / 4 * 3 > max + 3 {
            return Err(too_big(field, data.len() / 4 * 3, max));
        }
        let bytes = STANDARD.decode(data.trim_end()).map_err(|e| {
            ApiError::invalid(
                field,
                format!("{field}: the image is not valid base64 ({e})"),
            )
        })?;
        if bytes.len() > max {
            return Err(too_big(field, bytes.len(), max));
        }
        if !signature_matches(media_type, &bytes) {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{field}: the bytes are not a {media_type} image (truncated, or another \
                     type than declared)"
                ),
            ));
        }
        let sha256 = Sha256::digest(&bytes).into();
        self.fields.push(field.to_string());
        self.list.push(ImageInput {
            media_type,
            bytes: bytes.into(),
            sha256,
            field: field.to_string(),
        });
        Ok(())
    }
}

/// `data:<media type>[;params];base64,<data>` → (media type, data).
fn parse_data_url<'a>(field: &str, url: &'a str) -> Result<(&'a str, &'a str), ApiError> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https:/") {
        return Err(no_outbound(field));
    }
    let bad = || {
        ApiError::invalid(
            field,
            format!(
                "{field}: expected a data URL (data:image/png;base64,…); the server makes no \
                 outbound requests"
            ),
        )
    };
    let rest = url
        .strip_prefix("data:")
        .or_else(|| url.strip_prefix("DATA:"))
        .ok_or_else(bad)?;
    let (head, data) = rest.split_once(',').ok_or_else(bad)?;
    let mut params = head.split(';');
    let media = params.next().unwrap_or_default();
    if !params.any(|p| p.eq_ignore_ascii_case("base64")) {
        return Err(ApiError::invalid(
            field,
            format!("{field}: the data URL must be base64-encoded (data:{media};base64,…)"),
        ));
    }
    Ok((media, data))
}

fn media_type(field: &str, media: &str) -> Result<&'static str, ApiError> {
    match media.trim().to_ascii_lowercase().as_str() {
        "image/png" => Ok("image/png"),
        "image/jpeg" | "image/jpg" => Ok("image/jpeg"),
        "image/webp" => Ok("image/webp"),
        "image/gif" => Ok("image/gif"),
        other => Err(ApiError::invalid(
            field,
            format!(
                "{field}: media type {other:?} is not accepted; send image/png, image/jpeg, \
                 image/webp or image/gif"
            ),
        )),
    }
}

/// The file signature of each accepted type.
fn signature_matches(media_type: &str, b: &[u8]) -> bool {
    match media_type {
        "image/png" => b.starts_with(b"\x89PNG\r\n\x1a\n"),
        "image/jpeg" => b.starts_with(&[0xFF, 0xD8, 0xFF]),
        "image/gif" => b.starts_with(b"GIF87a") || b.starts_with(b"GIF89a"),
        "image/webp" => b.len() >= 12 && &b[..4] == b"RIFF" && &b[8..12] == b"WEBP",
        _ => false,
    }
}

fn no_outbound(field: &str) -> ApiError {
    let mut e = ApiError::invalid(
        field,
        format!(
            "{field}: image URLs are not fetched (the server makes no outbound requests); send \
             the image inline: a data URL (data:image/png;base64,…) or an Anthropic base64 source"
        ),
    );
    e.code = Some("unsupported_image_source");
    e
}

fn too_big(field: &str, size: usize, max: usize) -> ApiError {
    limit_error(
        field,
        format!("{field}: the image is {size} bytes, over the server's --max-image-bytes of {max}"),
    )
}

fn limit_error(field: &str, message: String) -> ApiError {
    let mut e = ApiError::invalid(field, message);
    e.code = Some("image_limit_exceeded");
    e
}

#[cfg(test)]
#[path = "images_tests.rs"]
mod tests;
