//! Selections on the device: routing decisions ([`CudaRouting`]) and sparse
//! key selections ([`CudaSelection`]), made by exact top-k kernels (ties to
//! the lower index, the total order of `f32::total_cmp`), so no decision
//! needs a round trip to the host.

use std::sync::Arc;

use super::buf::CudaBuf;
use super::device::{Device, Shape, args};
use super::mem::DevMem;
use crate::backend::{IndexerShape, RouterSpec, Scoring};
use crate::error::{EngineError, Result};

/// The most experts a router picks per token (the kernels keep the chosen
/// ids in registers).
pub const MAX_TOP_K: usize = 64;
/// Experts the block routing kernels keep (`route_softmax_topk_block_f32`,
/// `route_scored_block_f32`: ROUTE_THREADS · ROUTE_PER).
const ROUTE_BLOCK_EXPERTS: usize = 512;
/// The most expert groups of a group-limited router.
pub const MAX_GROUPS: usize = 64;
/// Threads of the top-k kernel (its shared arrays are sized for it).
const TOPK_THREADS: u32 = 256;
/// The choice value of an expert in a dropped group (the CPU reference's
/// `cpu::routing::route_scored`: −∞, so a kept group's negative choices
/// still win).
const DROPPED_GROUP_CHOICE: f32 = f32::NEG_INFINITY;

/// Per-token kept indices: `[rows, cap]` with a count per row.
#[derive(Clone)]
pub struct CudaSelection {
    pub(super) idx: Arc<DevMem<u32>>,
    pub(super) counts: Arc<DevMem<u32>>,
    pub(super) rows: usize,
    pub(super) cap: usize,
    /// Every index is below this (checked on the host against the cache a
    /// selection is applied to, so kernels never read past it).
    pub(super) bound: usize,
}

impl std::fmt::Debug for CudaSelection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaSelection[{} rows, ≤ {}]", self.rows, self.cap)
    }
}

/// Per-token routed experts and weights, `[rows, k]` each.
#[derive(Clone)]
pub struct CudaRouting {
    pub(super) experts: Arc<DevMem<u32>>,
    pub(super) weights: Arc<DevMem<f32>>,
    pub(super) rows: usize,
    pub(super) k: usize,
    /// The router's expert count: every id is below it.
    pub(super) n_experts: usize,
}

impl std::fmt::Debug for CudaRouting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaRouting[{}, {}]", self.rows, self.k)
    }
}

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

fn routing(dev: &Device, rows: usize, k: usize, n_experts: usize) -> Result<CudaRouting> {
    Ok(CudaRouting {
        experts: Arc::new(dev.alloc(rows * k)?),
        weights: Arc::new(dev.alloc(rows * k)?),
        rows,
        k,
        n_experts,
    })
}

pub(super) fn route_softmax_topk(
    dev: &Device,
    logits: &CudaBuf,
    rows: usize,
    experts: usize,
    k: usize,
    renormalise: bool,
) -> Result<CudaRouting> {
    if logits.len() != rows * experts || k > experts || k > MAX_TOP_K {
        return Err(shape_err(
            "route_softmax_topk",
            format!(
                "{} logits, {rows} rows of {experts}, top {k} (at most {MAX_TOP_K})",
                logits.len()
            ),
        ));
    }
    let r = routing(dev, rows, k, experts)?;
    if rows > 0 && k > 0 {
        // Up to 512 experts a block per row (same bits, run 20), else a warp.
        let (kernel, shape) = if experts <= ROUTE_BLOCK_EXPERTS {
            ("route_softmax_topk_block_f32", Shape::blocks(rows, 128))
        } else {
            ("route_softmax_topk_f32", Shape::warps(rows))
        };
        dev.launch(
            kernel,
            shape,
            args![
                r.experts.ptr(),
                r.weights.ptr(),
                logits.ptr(),
                rows,
                experts,
                k as i32,
                renormalise as i32
            ],
        )?;
    }
    Ok(r)
}

pub(super) fn route_scored(
    dev: &Device,
    logits: &CudaBuf,
    rows: usize,
    bias: Option<&CudaBuf>,
    fixed: Option<&[u32]>,
    spec: &RouterSpec,
) -> Result<CudaRouting> {
    let (e, k) = (spec.experts, spec.k);
    let bad = logits.len() != rows * e
        || k > e
        || k > MAX_TOP_K
        || bias.is_some_and(|b| b.len() != e)
        || fixed.is_some_and(|f| f.len() != rows * k || f.iter().any(|&i| i as usize >= e))
        || spec
            .groups
            .is_some_and(|(g, keep)| g == 0 || e % g != 0 || keep > g || g > MAX_GROUPS);
    if bad {
        return Err(shape_err(
            "route_scored",
            format!("{} logits, {rows} rows, {spec:?}", logits.len()),
        ));
    }
    let r = routing(dev, rows, k, e)?;
    if rows == 0 || k == 0 {
        return Ok(r);
    }
    // One group, kept, masks nothing (GLM-5's 288 experts): the same
    // choices as no limit. (Other all-kept limits stay on the warp kernel,
    // which the block kernel's test compares against.)
    let limited = spec.groups.is_some_and(|gk| gk != (1, 1));
    if fixed.is_none() && !limited && e <= ROUTE_BLOCK_EXPERTS {
        // A block per row: the warp kernel's bits (see the kernel; run 45
        // had GLM-5's warp kernel at 40 µs a row).
        return dev
            .launch(
                "route_scored_block_f32",
                Shape::blocks(rows, 128),
                args![
                    r.experts.ptr(),
                    r.weights.ptr(),
                    logits.ptr(),
                    bias.map_or(0, |b| b.ptr()),
                    rows,
                    e,
                    k as i32,
                    (spec.scoring == Scoring::Sigmoid) as i32,
                    spec.renormalise as i32,
                    spec.scale
                ],
            )
            .map(|()| r);
    }
    let fixed = fixed.map(|f| dev.upload(f)).transpose()?;
    let (groups, keep) = spec.groups.unwrap_or((0, 0));
    dev.launch(
        "route_scored_f32",
        Shape::warps(rows),
        args![
            r.experts.ptr(),
            r.weights.ptr(),
            logits.ptr(),
            bias.map_or(0, |b| b.ptr()),
            fixed.as_ref().map_or(0, |f| f.ptr()),
            rows,
            e,
            k as i32,
            (spec.scoring == Scoring::Sigmoid) as i32,
            groups as i32,
            keep as i32,
            spec.renormalise as i32,
            spec.scale,
            DROPPED_GROUP_CHOICE
        ],
    )?;
    Ok(r)
}

pub(super) fn routing_to_host(dev: &Device, r: &CudaRouting) -> Result<(Vec<usize>, Vec<f32>)> {
    let n = r.rows * r.k;
    let experts = dev.download(&r.experts, n)?;
    let weights = dev.download(&r.weights, n)?;
    Ok((experts.into_iter().map(|e| e as usize).collect(), weights))
}

/// A selection listed on the host, padded to the longest row.
pub(super) fn selection_from_host(
    dev: &Device,
    rows: &[Vec<u32>],
    bound: usize,
) -> Result<CudaSelection> {
    if let Some(bad) = rows.iter().flatten().find(|&&i| i as usize >= bound) {
        return Err(EngineError::State(format!(
            "selection_from_host: index {bad} of {bound} keys"
        )));
    }
    let cap = rows.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let mut idx = vec![0u32; rows.len() * cap];
    for (r, row) in rows.iter().enumerate() {
        idx[r * cap..r * cap + row.len()].copy_from_slice(row);
    }
    let counts: Vec<u32> = rows.iter().map(|r| r.len() as u32).collect();
    Ok(CudaSelection {
        idx: Arc::new(dev.upload(&idx)?),
        counts: Arc::new(dev.upload(&counts)?),
        rows: rows.len(),
        cap,
        bound,
    })
}

pub(super) fn selection_to_host(dev: &Device, s: &CudaSelection) -> Result<Vec<Vec<u32>>> {
    let idx = dev.download(&s.idx, s.rows * s.cap)?;
    let counts = dev.download(&s.counts, s.rows)?;
    Ok(counts
        .iter()
        .enumerate()
        .map(|(r, &c)| idx[r * s.cap..r * s.cap + c as usize].to_vec())
        .collect())
}

/// Per row: the `k` best of the first `limits[r]` scores (row stride
/// `stride`), ascending, each expanded to `ratio` entries, then the tail
/// `limits[r]·ratio .. visible[r]`.
#[allow(clippy::too_many_arguments)]
fn topk(
    dev: &Device,
    scores: &CudaBuf,
    stride: usize,
    limits: &[u32],
    visible: &[u32],
    k: usize,
    ratio: usize,
    cap: usize,
) -> Result<CudaSelection> {
    let rows = limits.len();
    let sel = CudaSelection {
        idx: Arc::new(dev.alloc(rows * cap)?),
        counts: Arc::new(dev.alloc(rows)?),
        rows,
        cap,
        bound: visible.iter().map(|&v| v as usize).max().unwrap_or(0),
    };
    if rows == 0 {
        return Ok(sel);
    }
    let (limits, visible) = (dev.upload(limits)?, dev.upload(visible)?);
    dev.launch(
        "topk_select",
        Shape {
            grid: (rows as u32, 1),
            block: TOPK_THREADS,
        },
        args![
            sel.idx.ptr(),
            sel.counts.ptr(),
            scores.ptr(),
            stride,
            limits.ptr(),
            visible.ptr(),
            k as u32,
            ratio as u32,
            cap
        ],
    )?;
    Ok(sel)
}

fn u32_of(op: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| shape_err(op, format!("{v} does not fit 32 bits")))
}

pub(super) fn select_topk(
    dev: &Device,
    scores: &CudaBuf,
    rows: usize,
    width: usize,
    limits: &[usize],
    k: usize,
) -> Result<CudaSelection> {
    if scores.len() != rows * width || limits.len() != rows || limits.iter().any(|&l| l > width) {
        return Err(shape_err(
            "select_topk",
            format!(
                "{} scores, {} limits for {rows} rows of {width}",
                scores.len(),
                limits.len()
            ),
        ));
    }
    let limits: Vec<u32> = limits
        .iter()
        .map(|&l| u32_of("select_topk", l))
        .collect::<Result<_>>()?;
    let k = k.min(width);
    topk(dev, scores, width, &limits, &limits, k, 1, k.max(1))
}

pub(super) fn indexer_select(
    dev: &Device,
    q: &CudaBuf,
    blocks: &CudaBuf,
    base: usize,
    shape: IndexerShape,
) -> Result<CudaSelection> {
    let row = shape.heads * shape.dim;
    if row == 0 || shape.ratio == 0 || !q.len().is_multiple_of(row) {
        return Err(shape_err(
            "indexer_select",
            format!("{} query values for {shape:?}", q.len()),
        ));
    }
    let rows = q.len() / row;
    let last = base + rows;
    let nb_max = last / shape.ratio;
    if blocks.len() < nb_max * shape.dim {
        return Err(shape_err(
            "indexer_select",
            format!(
                "{} block keys for {nb_max} blocks of {}",
                blocks.len(),
                shape.dim
            ),
        ));
    }
    let stride = nb_max.max(1);
    let scores = CudaBuf::uninit(dev, rows * stride)?;
    if nb_max > 0 {
        // A warp per (row, block), a lane per head, where the heads fit.
        let (name, launch) = if shape.heads <= 32 {
            ("indexer_scores_heads_f32", Shape::warps(rows * stride))
        } else {
            ("indexer_scores_f32", Shape::elements(rows * stride))
        };
        dev.launch(
            name,
            launch,
            args![
                scores.ptr(),
                q.ptr(),
                blocks.ptr(),
                rows,
                stride,
                base,
                shape.heads,
                shape.dim,
                shape.ratio,
                1.0 / (shape.dim as f32).sqrt()
            ],
        )?;
    }
    let visible: Vec<u32> = (0..rows)
        .map(|i| u32_of("indexer_select", base + i + 1))
        .collect::<Result<_>>()?;
    let limits: Vec<u32> = visible.iter().map(|&v| v / shape.ratio as u32).collect();
    let cap = shape.block_topk * shape.ratio + shape.ratio;
    topk(
        dev,
        &scores,
        stride,
        &limits,
        &visible,
        shape.block_topk,
        shape.ratio,
        cap,
    )
}

/// Pools to tokens (GLM-5's DSA). The CPU refuses a pool that is not
/// complete for its own query; here only the bound is checked on the host
/// (every pool ends before the last query's token, so no index passes the
/// cache): pools selected with per-row limits of complete pools, as
/// `select_topk` is given them, are complete by construction.
pub(super) fn expand_pools(
    dev: &Device,
    pools: &CudaSelection,
    base: usize,
    pool: usize,
    tail: bool,
) -> Result<CudaSelection> {
    let rows = pools.rows;
    let last = base + rows;
    if pool == 0 || pools.bound * pool > last {
        return Err(shape_err(
            "expand_pools",
            format!(
                "pools below {} of {pool} tokens for queries up to token {last}",
                pools.bound
            ),
        ));
    }
    let cap = pools.cap * pool + if tail { pool } else { 0 };
    let out = CudaSelection {
        idx: Arc::new(dev.alloc(rows * cap)?),
        counts: Arc::new(dev.alloc(rows)?),
        rows,
        cap,
        bound: last,
    };
    if rows > 0 && cap == 0 {
        // Nothing selected and no tail: every row is empty.
        let counts = dev.alloc_zeros::<u32>(rows)?;
        return Ok(CudaSelection {
            counts: Arc::new(counts),
            ..out
        });
    }
    if rows > 0 {
        dev.launch(
            "expand_pools",
            Shape::elements(rows * cap),
            args![
                out.idx.ptr(),
                out.counts.ptr(),
                pools.idx.ptr(),
                pools.counts.ptr(),
                pools.cap,
                rows,
                base,
                pool,
                tail as i32,
                cap
            ],
        )?;
    }
    Ok(out)
}
