//! The vision tower (`model.visual.*`) on the op inventory: patch rows →
//! merged image features `[tokens, out_hidden]` that replace the image
//! placeholders' embeddings.
//!
//! As transformers' `Qwen4ExpVisionModel`:
//! - the Conv3d patch embedding (kernel = stride = `(2, 16, 16)`, bias) is
//!   one matmul over the processor's flattened patch rows (their order is
//!   the kernel's `[C][T][py][px]`);
//! - a learned `side × side` position grid, resampled bilinearly
//!   (`align_corners=True`) to the image's patch grid as four weighted
//!   gathers (`vision_utils.get_vision_interpolation_indices_and_weights`,
//!   computed on the host from the grid alone), added;
//! - pre-LayerNorm blocks: fused qkv with bias, axial 2-D RoPE over the whole
//!   head (frequencies `θ^(−2i/(d/2))`, `i < d/4`, for the patch row and then
//!   the column, the pair concatenated and duplicated: half-split RoPE with
//!   half = d/2), non-causal attention within each image (images run one at
//!   a time: every other op is row-wise, so this is the reference's
//!   block-diagonal `cu_seqlens` attention), a GELU MLP (`hidden_act`);
//! - the merger: LayerNorm, each 2×2 block's four consecutive rows read as
//!   one `4·hidden` row (the processor already ordered patches by merge
//!   block), fc1, exact (erf) GELU, fc2.

use std::path::Path;

use super::processor::ProcessedImage;
use crate::backend::{Backend, GeluForm, Heads, HostWeight, RopeLayout};
use crate::error::{EngineError, Result};
use crate::layers::linear::{BindLinear, Linear};
use crate::load::binder::{Binder, WeightSource};
use crate::load::safetensors::SafetensorsDir;

/// `vision_config` of a `qwen4_exp` checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub out_hidden_size: usize,
    pub num_position_embeddings: usize,
    pub rope_theta: f32,
    pub act: GeluForm,
    /// Prompt token ids (top level of `config.json`): an image is
    /// `vision_start, image × merged tokens, vision_end`.
    pub image_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
}

fn config_err(path: &Path, field: &str, message: String) -> EngineError {
    EngineError::Config {
        path: path.to_path_buf(),
        field: format!("vision_config.{field}"),
        message,
    }
}

fn field(path: &Path, v: &serde_json::Value, key: &str, default: usize) -> Result<usize> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => x
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| config_err(path, key, "expected a non-negative integer".into())),
    }
}

impl VisionConfig {
    /// From the checkpoint's `config.json` (`vision_config`, with
    /// transformers' defaults for absent fields); `None` for a text-only
    /// checkpoint.
    pub fn from_hf(path: &Path, config: &serde_json::Value) -> Result<Option<Self>> {
        let Some(v) = config.get("vision_config") else {
            return Ok(None);
        };
        let act = match v
            .get("hidden_act")
            .and_then(|a| a.as_str())
            .unwrap_or("gelu_pytorch_tanh")
        {
            "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => GeluForm::Tanh,
            "gelu" => GeluForm::Erf,
            other => {
                return Err(config_err(
                    path,
                    "hidden_act",
                    format!("{other:?} is not supported (gelu, gelu_pytorch_tanh)"),
                ));
            }
        };
        let rope_theta = v
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .or_else(|| v.get("rope_theta"))
            .and_then(|t| t.as_f64())
            .unwrap_or(10_000.0) as f32;
        let c = Self {
            depth: field(path, v, "depth", 27)?,
            hidden_size: field(path, v, "hidden_size", 1152)?,
            intermediate_size: field(path, v, "intermediate_size", 4304)?,
            num_heads: field(path, v, "num_heads", 16)?,
            in_channels: field(path, v, "in_channels", 3)?,
            patch_size: field(path, v, "patch_size", 16)?,
            temporal_patch_size: field(path, v, "temporal_patch_size", 2)?,
            spatial_merge_size: field(path, v, "spatial_merge_size", 2)?,
            out_hidden_size: field(path, v, "out_hidden_size", 3584)?,
            num_position_embeddings: field(path, v, "num_position_embeddings", 2304)?,
            rope_theta,
            act,
            image_token_id: field(path, config, "image_token_id", 248_056)? as u32,
            vision_start_token_id: field(path, config, "vision_start_token_id", 248_053)? as u32,
            vision_end_token_id: field(path, config, "vision_end_token_id", 248_054)? as u32,
        };
        let side = (c.num_position_embeddings as f64).sqrt() as usize;
        let head_dim = c.hidden_size / c.num_heads.max(1);
        if c.num_heads == 0
            || !c.hidden_size.is_multiple_of(c.num_heads)
            || !head_dim.is_multiple_of(4)
        {
            return Err(config_err(
                path,
                "num_heads",
                format!(
                    "hidden_size {} over {} heads must give a head_dim divisible by 4 (axial RoPE)",
                    c.hidden_size, c.num_heads
                ),
            ));
        }
        if side * side != c.num_position_embeddings
            || c.in_channels != 3
            || c.spatial_merge_size == 0
        {
            return Err(config_err(
                path,
                "num_position_embeddings",
                "must be a square, with in_channels 3 and spatial_merge_size ≥ 1".into(),
            ));
        }
        Ok(Some(c))
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

struct Affine<B: Backend> {
    w: Linear<B>,
    b: B::Buf,
}

impl<B: Backend> Affine<B> {
    fn load(w: &mut Binder<'_, B>, name: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self {
            w: w.linear(name, out, inp)?,
            b: w.vector(&format!("{name}.bias"), &[out])?,
        })
    }
    fn forward(&self, ops: &B, x: &B::Buf, rows: usize) -> Result<B::Buf> {
        let y = self.w.forward(ops, x, rows)?;
        ops.add_bias(&y, &self.b, self.w.out_dim())
    }
}

struct LayerNorm<B: Backend> {
    w: B::Buf,
    b: B::Buf,
    width: usize,
}

impl<B: Backend> LayerNorm<B> {
    fn load(w: &mut Binder<'_, B>, name: &str, width: usize) -> Result<Self> {
        Ok(Self {
            w: w.vector(&format!("{name}.weight"), &[width])?,
            b: w.vector(&format!("{name}.bias"), &[width])?,
            width,
        })
    }
    fn forward(&self, ops: &B, x: &B::Buf) -> Result<B::Buf> {
        ops.layer_norm(x, self.width, &self.w, &self.b, 1e-6)
    }
}

struct Block<B: Backend> {
    norm1: LayerNorm<B>,
    qkv: Affine<B>,
    proj: Affine<B>,
    norm2: LayerNorm<B>,
    fc1: Affine<B>,
    fc2: Affine<B>,
}

/// The tower's weights.
pub struct VisionTower<B: Backend> {
    cfg: VisionConfig,
    ops: B,
    patch: Affine<B>,
    pos: B::Table,
    blocks: Vec<Block<B>>,
    merger_norm: LayerNorm<B>,
    merger_fc1: Affine<B>,
    merger_fc2: Affine<B>,
    inv_freq: Vec<f32>,
}

impl<B: Backend> VisionTower<B> {
    /// The tower of a VL checkpoint directory (`model.visual.*`); `None`
    /// when the checkpoint has no `vision_config`.
    pub fn load(dir: &Path, ops: B) -> Result<Option<Self>> {
        let mut st = SafetensorsDir::open(dir)?;
        let config_path = st.config_path();
        let Some(cfg) = VisionConfig::from_hf(&config_path, st.config())? else {
            return Ok(None);
        };
        let others: Vec<String> = st
            .entries()
            .filter(|(n, _)| !n.starts_with("model.visual."))
            .map(|(n, _)| n.to_string())
            .collect();
        for n in others {
            st.ignore(&n);
        }
        let tower = Self::load_from(&mut st, cfg, ops)?;
        st.finish(&[])?;
        Ok(Some(tower))
    }

    /// Bind a parsed `vision_config`'s weights (`model.visual.*`) from any
    /// source (a checkpoint directory, or
    /// [`crate::load::synthetic::SyntheticSource`] for speed measurements
    /// at sizes no fixture has).
    pub fn load_from(st: &mut dyn WeightSource, cfg: VisionConfig, ops: B) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let merged = h * cfg.spatial_merge_size * cfg.spatial_merge_size;
        let tower = {
            let mut root = Binder::new(st, &ops);
            let mut w = root.pp("model.visual");
            let pd = cfg.patch_dim();
            let conv = w.tensor(
                "patch_embed.proj.weight",
                &[
                    h,
                    cfg.in_channels,
                    cfg.temporal_patch_size,
                    cfg.patch_size,
                    cfg.patch_size,
                ],
            )?;
            let patch = Affine {
                w: w.linear_from(HostWeight::F32(conv.reshape((h, pd))?), h, pd)?,
                b: w.vector("patch_embed.proj.bias", &[h])?,
            };
            let pos = w.table("pos_embed.weight", cfg.num_position_embeddings, h)?;
            let blocks = (0..cfg.depth)
                .map(|l| {
                    let mut b = w.pp(&format!("blocks.{l}"));
                    Ok(Block {
                        norm1: LayerNorm::load(&mut b, "norm1", h)?,
                        qkv: Affine::load(&mut b, "attn.qkv", 3 * h, h)?,
                        proj: Affine::load(&mut b, "attn.proj", h, h)?,
                        norm2: LayerNorm::load(&mut b, "norm2", h)?,
                        fc1: Affine::load(&mut b, "mlp.linear_fc1", i, h)?,
                        fc2: Affine::load(&mut b, "mlp.linear_fc2", h, i)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let mut m = w.pp("merger");
            let merger_norm = LayerNorm::load(&mut m, "norm", h)?;
            let merger_fc1 = Affine::load(&mut m, "linear_fc1", merged, merged)?;
            let merger_fc2 = Affine::load(&mut m, "linear_fc2", cfg.out_hidden_size, merged)?;
            (patch, pos, blocks, merger_norm, merger_fc1, merger_fc2)
        };
        // transformers: 1 / θ^(arange(0, d/2, 2)/(d/2)) in f32.
        let spatial = cfg.head_dim() / 2;
        let inv_freq = (0..spatial)
            .step_by(2)
            .map(|j| 1.0 / cfg.rope_theta.powf(j as f32 / spatial as f32))
            .collect();
        let (patch, pos, blocks, merger_norm, merger_fc1, merger_fc2) = tower;
        Ok(Self {
            cfg,
            ops,
            patch,
            pos,
            blocks,
            merger_norm,
            merger_fc1,
            merger_fc2,
            inv_freq,
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Merged features of one image: `[merged_tokens, out_hidden]`.
    pub fn forward(&self, img: &ProcessedImage) -> Result<B::Buf> {
        let ops = &self.ops;
        let cfg = &self.cfg;
        let [t, gh, gw] = img.grid_thw;
        let m = cfg.spatial_merge_size;
        let n = t * gh * gw;
        if img.pixel_values.len() != n * cfg.patch_dim()
            || !gh.is_multiple_of(m)
            || !gw.is_multiple_of(m)
        {
            return Err(EngineError::State(format!(
                "vision tower: {} pixel values for a {t}x{gh}x{gw} grid of {}-value patches (merge {m})",
                img.pixel_values.len(),
                cfg.patch_dim()
            )));
        }
        let h = cfg.hidden_size;
        let x = ops.upload(&img.pixel_values)?;
        let mut x = self.patch.forward(ops, &x, n)?;
        // Learned positions, resampled: Σ_j w_j · pos[idx_j], j in order.
        let (rows, cols) = block_order(t, gh, gw, m);
        let (idx, wts) = bilinear_taps(&rows, &cols, gh, gw, self.side());
        let mut pos: Option<B::Buf> = None;
        for j in 0..4 {
            let ids: Vec<u32> = idx.iter().map(|v| v[j]).collect();
            let g = ops.gather_rows(&self.pos, &ids)?;
            let s = ops.upload(&wts.iter().map(|v| v[j]).collect::<Vec<_>>())?;
            let term = ops.scale_rows(&g, &s, h)?;
            pos = Some(match pos {
                None => term,
                Some(p) => ops.add(&p, &term)?,
            });
        }
        x = ops.add(&x, &pos.expect("four taps"))?;
        // Axial RoPE tables: [cos(row·f) | cos(col·f)] per patch row.
        let hd = cfg.head_dim();
        let half = hd / 2;
        let q = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for (&r, &c) in rows.iter().zip(&cols) {
            for (p, f) in [(r, &self.inv_freq), (c, &self.inv_freq)] {
                for &fj in f.iter().take(q) {
                    let a = p as f32 * fj;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        let (cos, sin) = (ops.upload(&cos)?, ops.upload(&sin)?);
        // Every patch attends to every patch of its image.
        let all: Vec<u32> = (0..n as u32).collect();
        let keep = ops.selection_from_host(&vec![all; n], n)?;
        let heads = Heads {
            heads: cfg.num_heads,
            dim: hd,
        };
        for b in &self.blocks {
            let y = b.norm1.forward(ops, &x)?;
            let qkv = b.qkv.forward(ops, &y, n)?;
            let mut parts = ops.split_cols(&qkv, n, &[h, h, h], 1)?.into_iter();
            let (mut qh, mut kh, vh) = (
                parts.next().unwrap(),
                parts.next().unwrap(),
                parts.next().unwrap(),
            );
            ops.rope(&mut qh, hd, &cos, &sin, half, RopeLayout::HalfSplit)?;
            ops.rope(&mut kh, hd, &cos, &sin, half, RopeLayout::HalfSplit)?;
            let a = ops.attention_gathered(&qh, &kh, &vh, &keep, cfg.num_heads, heads, None)?;
            let a = b.proj.forward(ops, &a, n)?;
            x = ops.add(&x, &a)?;
            let y = b.norm2.forward(ops, &x)?;
            let y = b.fc1.forward(ops, &y, n)?;
            let y = ops.gelu(&y, cfg.act)?;
            let y = b.fc2.forward(ops, &y, n)?;
            x = ops.add(&x, &y)?;
        }
        // Merger: rows are in merge-block order, so `[n, h]` read as
        // `[n/m², m²·h]` is the 2×2 merge.
        let y = self.merger_norm.forward(ops, &x)?;
        let tokens = n / (m * m);
        let y = self.merger_fc1.forward(ops, &y, tokens)?;
        let y = ops.gelu(&y, GeluForm::Erf)?;
        self.merger_fc2.forward(ops, &y, tokens)
    }

    fn side(&self) -> usize {
        (self.cfg.num_position_embeddings as f64).sqrt() as usize
    }
}

/// (row, col) of each patch in the processor's merge-block order, frames
/// repeated.
fn block_order(t: usize, gh: usize, gw: usize, m: usize) -> (Vec<usize>, Vec<usize>) {
    let mut rows = Vec::with_capacity(t * gh * gw);
    let mut cols = Vec::with_capacity(t * gh * gw);
    for _ in 0..t {
        for bh in 0..gh / m {
            for bw in 0..gw / m {
                for ih in 0..m {
                    for iw in 0..m {
                        rows.push(bh * m + ih);
                        cols.push(bw * m + iw);
                    }
                }
            }
        }
    }
    (rows, cols)
}

/// One axis of transformers' bilinear `align_corners=True` taps, in f32:
/// `src = i·(side−1)/max(size−1, 1)`, taps `⌊src⌋, ⌊src⌋+1` clamped to the
/// table, weights `max(1 − |src − tap|, 0)` (on the unclamped tap).
fn axis_taps(i: usize, size: usize, side: usize) -> ([usize; 2], [f32; 2]) {
    let src = (i as f32 * (side - 1) as f32) / (size.max(2) - 1) as f32;
    let floor = src.floor();
    let mut taps = [0; 2];
    let mut w = [0f32; 2];
    for o in 0..2 {
        let raw = floor as i64 + o as i64;
        taps[o] = raw.clamp(0, side as i64 - 1) as usize;
        w[o] = (1.0 - (src - floor - o as f32).abs()).max(0.0);
    }
    (taps, w)
}

/// Per patch: four table rows and their weights (`h` taps outer, `w` inner).
fn bilinear_taps(
    rows: &[usize],
    cols: &[usize],
    gh: usize,
    gw: usize,
    side: usize,
) -> (Vec<[u32; 4]>, Vec<[f32; 4]>) {
    rows.iter()
        .zip(cols)
        .map(|(&r, &c)| {
            let (ht, hw) = axis_taps(r, gh, side);
            let (wt, ww) = axis_taps(c, gw, side);
            let mut idx = [0u32; 4];
            let mut wts = [0f32; 4];
            for a in 0..2 {
                for b in 0..2 {
                    idx[a * 2 + b] = (ht[a] * side + wt[b]) as u32;
                    wts[a * 2 + b] = hw[a] * ww[b];
                }
            }
            (idx, wts)
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corners_map_to_corners_and_weights_sum_to_one() {
        let (t, w) = axis_taps(0, 5, 6);
        assert_eq!((t[0], w[0]), (0, 1.0));
        let (t, w) = axis_taps(4, 5, 6);
        assert_eq!((t[0], w[0]), (5, 1.0));
        for i in 0..7 {
            let (_, w) = axis_taps(i, 7, 6);
            assert!((w[0] + w[1] - 1.0).abs() < 1e-6);
        }
        // A one-patch axis reads the table's first row.
        assert_eq!(axis_taps(0, 1, 6).0[0], 0);
    }

    #[test]
    fn block_order_walks_merge_blocks() {
        let (r, c) = block_order(1, 2, 4, 2);
        assert_eq!(r, vec![0, 0, 1, 1, 0, 0, 1, 1]);
        assert_eq!(c, vec![0, 1, 0, 1, 2, 3, 2, 3]);
    }
}
