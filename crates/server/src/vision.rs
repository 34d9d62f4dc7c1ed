//! Images for a model that reads them (a `qwen4_exp` checkpoint with a
//! vision tower): the request side and the worker side of the glue between
//! the routes' [`ImageInput`]s and the engine's media prefill.
//!
//! Request side ([`expand`], [`count`]), on a blocking thread (decoding and
//! resizing never run on the async runtime): each image goes through the
//! family's image processor (decode, resize to the pixel budget, patchify;
//! a refusal is a 400 naming the image's field and what to send instead),
//! its one template placeholder becomes `<|vision_start|>`, one
//! `<|image_pad|>` per merged token and `<|vision_end|>`, and the prompt the
//! session layer matches becomes the keys of [`ds4_engine::decode::media`]
//! (tokens + each image's SHA-256 over its span). Admission, `usage` and
//! `count_tokens` count the expanded tokens.
//!
//! Worker side ([`Vision::media`]): the tower runs on the images a turn
//! does not reuse, and the prefill gets their rows and every token's M-RoPE
//! position.

use std::path::Path;
use std::sync::Arc;

use ds4_engine::backend::{Backend, CpuOps};
use ds4_engine::decode::{KeyedSpan, PromptMedia, media_keys};
use ds4_engine::families::qwen4_exp::vision::{
    ImageError, ImageSpan, ProcessedImage, ProcessorConfig, VisionTower, mrope_positions,
    process_image,
};

use crate::error::ApiError;
use crate::images::ImageInput;

/// A loaded vision tower with its processor and prompt ids.
pub struct Vision {
    processor: ProcessorConfig,
    tower: VisionTower<CpuOps>,
    vision_start: u32,
    image_pad: u32,
    vision_end: u32,
    merge: usize,
}

/// A prompt's images, processed: what the worker needs besides the keys.
#[derive(Debug)]
pub struct VisionPrompt {
    /// The real ids of the expanded prompt (the job's prompt holds keys).
    pub tokens: Vec<u32>,
    /// Each image's processor output, in prompt order.
    pub images: Vec<ProcessedImage>,
    /// Each image's first placeholder and grid.
    pub spans: Vec<ImageSpan>,
}

impl Vision {
    /// The tower of the checkpoint in `dir` when its family reads images and
    /// it has one (`vision_config` and `model.visual.*`), else `None`.
    /// `max_pixels` replaces the processor's limit on decoded pixels.
    pub fn load(dir: &Path, family: &str, max_pixels: Option<u64>) -> Result<Option<Self>, String> {
        if family != "qwen4_exp" || !dir.is_dir() {
            return Ok(None);
        }
        let Some(tower) = VisionTower::load(dir, CpuOps).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let path = dir.join("preprocessor_config.json");
        let mut processor = match std::fs::read_to_string(&path) {
            Ok(text) => {
                ProcessorConfig::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))?
            }
            Err(_) => ProcessorConfig::default(),
        };
        if let Some(p) = max_pixels {
            processor.max_decoded_pixels = p;
        }
        let c = tower.config();
        if processor.merge_size != c.spatial_merge_size || processor.patch_size != c.patch_size {
            return Err(format!(
                "{}: merge {} / patch {} disagree with the vision tower's {} / {}",
                path.display(),
                processor.merge_size,
                processor.patch_size,
                c.spatial_merge_size,
                c.patch_size
            ));
        }
        Ok(Some(Self {
            vision_start: c.vision_start_token_id,
            image_pad: c.image_token_id,
            vision_end: c.vision_end_token_id,
            merge: c.spatial_merge_size,
            processor,
            tower,
        }))
    }

    /// Process `images` and expand their placeholders in `prompt` (one
    /// `vision_start, image_pad, vision_end` per image, in order). Returns
    /// the keys the session layer matches and the [`VisionPrompt`].
    fn prepare(
        &self,
        prompt: &[u32],
        images: &[ImageInput],
    ) -> Result<(Vec<u32>, VisionPrompt), ApiError> {
        let marks: Vec<usize> = prompt
            .windows(3)
            .enumerate()
            .filter(|(_, w)| *w == [self.vision_start, self.image_pad, self.vision_end])
            .map(|(i, _)| i)
            .collect();
        let pads = prompt.iter().filter(|&&t| t == self.image_pad).count();
        if marks.len() != images.len() || pads != images.len() {
            // Only the template writes the placeholders; text that spells
            // them out would make the images ambiguous.
            return Err(ApiError::invalid(
                images.first().map_or("messages", |i| i.field.as_str()),
                format!(
                    "the prompt has {pads} image placeholders for {} images: do not write \
                     <|vision_start|>, <|image_pad|> or <|vision_end|> in the text",
                    images.len()
                ),
            ));
        }
        let mut processed = Vec::with_capacity(images.len());
        for img in images {
            processed
                .push(process_image(&img.bytes, &self.processor).map_err(|e| refusal(img, e))?);
        }
        let mut tokens = Vec::with_capacity(prompt.len());
        let (mut spans, mut keyed) = (Vec::new(), Vec::new());
        let mut at = 0;
        for ((&mark, p), img) in marks.iter().zip(&processed).zip(images) {
            tokens.extend_from_slice(&prompt[at..mark]);
            keyed.push(KeyedSpan {
                first: tokens.len(),
                len: p.merged_tokens + 1,
                sha256: img.sha256,
            });
            tokens.push(self.vision_start);
            spans.push(ImageSpan {
                first: tokens.len(),
                grid_thw: p.grid_thw,
            });
            tokens.extend(std::iter::repeat_n(self.image_pad, p.merged_tokens));
            tokens.push(self.vision_end);
            at = mark + 3;
        }
        tokens.extend_from_slice(&prompt[at..]);
        let keys = media_keys(&tokens, &keyed).map_err(|e| ApiError::internal(e.to_string()))?;
        Ok((
            keys,
            VisionPrompt {
                tokens,
                images: processed,
                spans,
            },
        ))
    }

    /// The media of a job whose prompt (keys) is `prompt`: `v.tokens`
    /// extended by whatever the prompt adds after them (a reasoning-budget
    /// continuation's text), every token's position, and `encode`, which
    /// runs the tower on image `i` when the prefill first needs it.
    pub fn media<'a>(
        &self,
        v: &VisionPrompt,
        prompt: &[u32],
        encode: &'a ds4_engine::decode::media::Encode<'a>,
    ) -> Result<PromptMedia<'a>, String> {
        let mut tokens = v.tokens.clone();
        tokens.extend_from_slice(prompt.get(tokens.len()..).unwrap_or_default());
        let (pos, _) =
            mrope_positions(tokens.len(), &v.spans, self.merge).map_err(|e| e.to_string())?;
        let positions = pos.iter().map(|p| p.map(|x| x as u32)).collect();
        let spans = v
            .spans
            .iter()
            .map(|s| (s.first, s.tokens(self.merge)))
            .collect();
        Ok(PromptMedia::new(
            tokens,
            positions,
            self.tower.config().out_hidden_size,
            spans,
            encode,
        ))
    }

    /// The tower's rows for one processed image (`[merged tokens, width]`).
    pub fn encode(&self, img: &ProcessedImage) -> Result<Vec<f32>, ds4_engine::EngineError> {
        CpuOps.download(&self.tower.forward(img)?)
    }
}

/// The processor's refusal of `img` as a 400 naming its field.
fn refusal(img: &ImageInput, e: ImageError) -> ApiError {
    let what = match &e {
        ImageError::TooManyPixels { .. } => {
            let mut err = ApiError::invalid(
                img.field.as_str(),
                format!(
                    "{}: {e} (the server's --max-image-pixels); send a smaller image",
                    img.field
                ),
            );
            err.code = Some("image_limit_exceeded");
            return err;
        }
        ImageError::AspectRatio { .. } => "crop or pad it",
        ImageError::Empty | ImageError::Malformed(_) | ImageError::UnsupportedType(_) => {
            "send a complete PNG, JPEG, WebP or GIF file"
        }
    };
    ApiError::invalid(img.field.as_str(), format!("{}: {e}; {what}", img.field))
}

/// The request side: process a prompt's images (on a blocking thread),
/// expand their placeholders and key the prompt: `prompt` becomes the
/// session keys, the result what the worker needs besides them. Nothing to
/// do (`None`) without images or without a tower (the routes refused the
/// images then).
pub async fn expand(
    vision: Option<&Arc<Vision>>,
    prompt: &mut Vec<u32>,
    images: &[ImageInput],
) -> Result<Option<Arc<VisionPrompt>>, ApiError> {
    let (Some(vision), false) = (vision, images.is_empty()) else {
        return Ok(None);
    };
    let (vision, tokens, images) = (vision.clone(), std::mem::take(prompt), images.to_vec());
    let (keys, prepared) = tokio::task::spawn_blocking(move || vision.prepare(&tokens, &images))
        .await
        .map_err(|e| ApiError::internal(format!("processing the images failed: {e}")))??;
    *prompt = keys;
    Ok(Some(Arc::new(prepared)))
}

/// The prompt's length once its images are expanded (`count_tokens`).
pub async fn count(
    vision: Option<&Arc<Vision>>,
    mut prompt: Vec<u32>,
    images: Vec<ImageInput>,
) -> Result<usize, ApiError> {
    expand(vision, &mut prompt, &images).await?;
    Ok(prompt.len())
}
