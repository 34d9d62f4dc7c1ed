//! Attention on the device (`kernels/attention.cu`): causal over per-head
//! caches, over a sparse selection (with sinks), and DeepSeek-V4's sliding
//! window plus compressed entries; and the QSA block keys. Each (query,
//! head) is cut into fixed tiles of its keys, computed in parallel and
//! merged in tile order (two launches).

use super::buf::{self, CudaBuf};
use super::device::{Arg, Device, Shape, args};
use super::graph::CudaStep;
use super::select::CudaSelection;
use crate::backend::{EntryKeep, Heads};
use crate::error::{EngineError, Result};

/// Keys per tile (the kernels' `ATT_TILE`): tiles are cut by key index
/// alone, so the bits of a query never depend on the others in its call.
const TILE: usize = 64;
/// The most queries a gathered-attention call runs a block per tile
/// (`attention_gathered_tiles_block_f32`).
const BLOCK_TILE_ROWS: usize = 16;
/// Queries from which the window attention runs a block per (query, tile,
/// 32 heads), the tile's shared keys staged for them 32 dims a round
/// (`attention_window_rows32_f32`), rather than a block per (query, tile,
/// 8 heads) with the tile's keys staged whole (`attention_window_staged_f32`,
/// for decode steps and verify windows) or, for heads it cannot stage, a
/// warp per (query, head, tile) (`attention_window_tiles_f32`). All three
/// give the same partials.
const WINDOW_ROWS_FROM: usize = 16;
/// Threads and heads of an `attention_window_rows32_f32` block.
const WINDOW_ROWS_THREADS: u32 = 256;
const WINDOW_ROWS_HEADS: usize = 32;
/// The heads an `attention_window_staged_f32` block may take (a warp
/// each; the kernel's `WS_HEADS` is the most), [`Device::window_heads`].
pub(super) const WINDOW_STAGED_HEADS: [usize; 4] = [1, 2, 4, 8];
/// Dims past which (or not a multiple of 4) the few-query window attention
/// runs the warp kernel: DeepSeek-V4's heads are 512.
const WINDOW_STAGED_DIMS_MAX: usize = 512;
/// `attention_window_staged_f32`'s shared memory at its widest head
/// (allowed at open, `device::DYNAMIC_SHARED`).
pub(super) const WINDOW_STAGED_SHARED_MAX: usize = TILE * (WINDOW_STAGED_DIMS_MAX + 4) * 4;

/// The dynamic shared memory of `attention_window_staged_f32` for heads of
/// `dim` (a tile's key rows padded by 4 floats), or `None` where the warp
/// kernel runs: dims not a multiple of 4 (the staging copies float4s), past
/// `WINDOW_STAGED_DIMS_MAX`, or more than the device lets the kernel have.
fn window_staged_shared(dev: &Device, dim: usize) -> Option<u32> {
    let shared = TILE * (dim + 4) * 4;
    let room = shared <= 48 * 1024 || dev.shared_optin >= WINDOW_STAGED_SHARED_MAX;
    (dim.is_multiple_of(4) && dim <= WINDOW_STAGED_DIMS_MAX && room).then_some(shared as u32)
}

/// Merge `tiles` partials of `[2 + d]` per item into `[items, d]`.
fn merge(
    dev: &Device,
    parts: &CudaBuf,
    items: usize,
    tiles: usize,
    heads: usize,
    d: usize,
    sinks: Option<&CudaBuf>,
) -> Result<CudaBuf> {
    let y = CudaBuf::uninit(dev, items * d)?;
    dev.launch(
        "attention_merge_f32",
        Shape::warps(items * d.div_ceil(32)),
        args![
            y.ptr(),
            parts.ptr(),
            items,
            tiles,
            heads,
            d,
            sinks.map_or(0, |s| s.ptr())
        ],
    )?;
    Ok(y)
}

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

pub(super) fn attention_causal(
    dev: &Device,
    q: &CudaBuf,
    k: &[&CudaBuf],
    v: &[&CudaBuf],
    offset: usize,
    q_heads: usize,
    kv: Heads,
) -> Result<CudaBuf> {
    if dev.pool.capturing() {
        return Err(shape_err(
            "attention_causal",
            "the cache length of a captured step comes from the step (attention_causal_step)"
                .into(),
        ));
    }
    let (kvh, d) = (kv.heads, kv.dim);
    let t = q.len() / (q_heads * d).max(1);
    let total = offset + t;
    let bad = t == 0
        || kvh == 0
        || !q_heads.is_multiple_of(kvh)
        || q.len() != t * q_heads * d
        || k.len() != kvh
        || v.len() != kvh
        || k.iter().chain(v).any(|c| c.len() < total * d);
    if bad {
        return Err(shape_err(
            "attention_causal",
            format!("{t} queries over {total} keys in {} kv heads", k.len()),
        ));
    }
    // The per-head caches are separate allocations: their addresses go in
    // a small table.
    let table: Vec<u64> = k.iter().chain(v).map(|c| c.ptr()).collect();
    let table = dev.upload(&table)?;
    let (kp, vp) = (table.ptr(), table.ptr() + 8 * kvh as u64);
    let tiles = total.div_ceil(TILE);
    let items = t * q_heads;
    let parts = CudaBuf::uninit(dev, items * tiles * (d + 2))?;
    dev.launch(
        "attention_causal_tiles_f32",
        Shape::warps(items * tiles),
        args![
            parts.ptr(),
            q.ptr(),
            kp,
            vp,
            t,
            q_heads,
            kvh,
            d,
            offset,
            tiles
        ],
    )?;
    merge(dev, &parts, items, tiles, q_heads, d, None)
}

/// `Backend::attention_causal_rows` (continuous batching): every
/// session's queries in place, one table upload, one tiles launch and one
/// merge for all of them (the tiles by `attention_causal_staged_batch_*`
/// where [`staged_kernel`] allows, else `attention_causal_tiles_batch_f32`,
/// then `attention_merge_batch_f32`: each row's tiles and merge are its
/// session's launch alone's, so the same bits).
pub(super) fn attention_causal_rows(
    dev: &Device,
    q: &CudaBuf,
    parts: &[crate::backend::CausalRows<'_, CudaBuf>],
    q_heads: usize,
    kv: Heads,
) -> Result<CudaBuf> {
    if dev.pool.capturing() {
        return Err(shape_err(
            "attention_causal_rows",
            "a captured step attends one session (attention_causal_step)".into(),
        ));
    }
    let (kvh, d) = (kv.heads, kv.dim);
    let rows: usize = parts.iter().map(|p| p.t).sum();
    let bad = parts.is_empty()
        || kvh == 0
        || !q_heads.is_multiple_of(kvh)
        || q.len() != rows * q_heads * d
        || parts.iter().any(|p| {
            p.t == 0
                || p.k.len() != kvh
                || p.v.len() != kvh
                || p.k
                    .iter()
                    .chain(p.v)
                    .any(|c| c.len() < (p.offset + p.t) * d)
        });
    if bad {
        return Err(shape_err(
            "attention_causal_rows",
            format!(
                "{rows} queries of {} sessions in {kvh} kv heads",
                parts.len()
            ),
        ));
    }
    // row_part, row_pos [rows]; part_t, part_off [parts]; then each part's
    // 2·kvh cache addresses (the kernels' table).
    let mut table: Vec<u64> = Vec::with_capacity(2 * rows + parts.len() * (2 + 2 * kvh));
    for (p, part) in parts.iter().enumerate() {
        table.extend(std::iter::repeat_n(p as u64, part.t));
    }
    for part in parts {
        table.extend(0..part.t as u64);
    }
    table.extend(parts.iter().map(|p| p.t as u64));
    table.extend(parts.iter().map(|p| p.offset as u64));
    for part in parts {
        table.extend(part.k.iter().chain(part.v).map(|c| c.ptr()));
    }
    let max_tiles = parts
        .iter()
        .map(|p| (p.offset + p.t).div_ceil(TILE))
        .max()
        .unwrap_or(1);
    let items = rows * q_heads;
    let tiles_out = CudaBuf::uninit(dev, items * max_tiles * (d + 2))?;
    // The staged kernel's launch, or the warp kernel's: the staged one
    // reads the table's row groups (group_first, group_n: each session's
    // rows in groups of at most STAGED_ROWS) after the kv addresses.
    let (name, shape, shared, groups) = match staged_kernel(dev, d) {
        Some((name, shared)) => {
            let mut first = Vec::new();
            let mut count = Vec::new();
            let mut at = 0;
            for part in parts {
                for g in (0..part.t).step_by(STAGED_ROWS) {
                    first.push((at + g) as u64);
                    count.push(STAGED_ROWS.min(part.t - g) as u64);
                }
                at += part.t;
            }
            let groups = first.len();
            table.extend(first);
            table.extend(count);
            let shape = Shape::blocks(groups * kvh * max_tiles, 128);
            (name, shape, shared, Some(groups))
        }
        None => (
            "attention_causal_tiles_batch_f32",
            Shape::warps(items * max_tiles),
            0,
            None,
        ),
    };
    // The table stays alive until the merge has been queued (the stream
    // reads it in order).
    let table = dev.upload(&table)?;
    let mut a = args![
        tiles_out.ptr(),
        q.ptr(),
        table.ptr(),
        rows,
        parts.len(),
        q_heads,
        kvh,
        d,
        max_tiles
    ]
    .to_vec();
    a.extend(groups.map(Arg::from));
    dev.launch_shared(name, shape, shared, &a)?;
    let y = CudaBuf::uninit(dev, items * d)?;
    dev.launch(
        "attention_merge_batch_f32",
        Shape::warps(items * d.div_ceil(32)),
        args![
            y.ptr(),
            tiles_out.ptr(),
            table.ptr(),
            rows,
            parts.len(),
            q_heads,
            d,
            max_tiles
        ],
    )?;
    Ok(y)
}

/// The staged batch kernel for heads of `d` dims and its dynamic shared
/// memory (a tile's keys, rows padded by 4 floats, and its values), or
/// `None` where the warp kernel runs: dims not a multiple of 4 (the
/// staging copies float4s), or past 128 (DIMS 4 a lane), or more shared
/// memory than the device lets the kernel have.
fn staged_kernel(dev: &Device, d: usize) -> Option<(&'static str, u32)> {
    let shared = staged_shared(d);
    let name = if d <= 64 {
        "attention_causal_staged_batch_d64_f32"
    } else {
        "attention_causal_staged_batch_f32"
    };
    let room = if shared <= 48 * 1024 {
        true
    } else {
        dev.shared_optin >= STAGED_SHARED_MAX
    };
    (d.is_multiple_of(4) && d <= STAGED_DIMS_MAX && room).then_some((name, shared as u32))
}

/// Bytes of `attention_causal_staged_batch_*`'s shared tile for `d` dims.
const fn staged_shared(d: usize) -> usize {
    TILE * (2 * d + 4) * 4
}

/// Rows of one session an `attention_causal_staged_batch_*` block takes:
/// its staged tile serves 4 rows' query heads (a decode row's, a verify
/// window's in one block; a prefill chunk's spread over many).
const STAGED_ROWS: usize = 4;
/// Heads past this many dims run the warp kernel.
const STAGED_DIMS_MAX: usize = 128;
/// The staged kernel's shared memory at its widest head (allowed at open,
/// `device::DYNAMIC_SHARED`).
pub(super) const STAGED_SHARED_MAX: usize = staged_shared(STAGED_DIMS_MAX);

/// `Backend::attention_causal_step`: the cache length from the step, the
/// grid over the caches' capacity (see the kernels).
pub(super) fn attention_causal_step(
    dev: &Device,
    q: &CudaBuf,
    k: &[&CudaBuf],
    v: &[&CudaBuf],
    step: &CudaStep,
    q_heads: usize,
    kv: Heads,
) -> Result<CudaBuf> {
    let (kvh, d) = (kv.heads, kv.dim);
    let t = q.len() / (q_heads * d).max(1);
    let total = step.pos + t;
    let bad = t == 0
        || t != step.rows
        || kvh == 0
        || !q_heads.is_multiple_of(kvh)
        || q.len() != t * q_heads * d
        || k.len() != kvh
        || v.len() != kvh
        || k.iter().chain(v).any(|c| c.len() < total * d);
    if bad {
        return Err(shape_err(
            "attention_causal_step",
            format!("{t} queries over {total} keys in {} kv heads", k.len()),
        ));
    }
    // Replays may reach any length the caches have room for.
    let cap_rows = k
        .iter()
        .chain(v)
        .map(|c| buf::capacity(c) / d.max(1))
        .min()
        .unwrap_or(0);
    let cap_tiles = cap_rows.div_ceil(TILE);
    let table: Vec<u64> = k.iter().chain(v).map(|c| c.ptr()).collect();
    let table = dev.upload(&table)?;
    let (kp, vp) = (table.ptr(), table.ptr() + 8 * kvh as u64);
    let items = t * q_heads;
    let parts = CudaBuf::uninit(dev, items * cap_tiles * (d + 2))?;
    dev.launch(
        "attention_causal_tiles_step_f32",
        Shape::warps(items * cap_tiles),
        args![
            parts.ptr(),
            q.ptr(),
            kp,
            vp,
            t,
            q_heads,
            kvh,
            d,
            step.ptr,
            cap_tiles
        ],
    )?;
    let y = CudaBuf::uninit(dev, items * d)?;
    dev.launch(
        "attention_merge_step_f32",
        Shape::warps(items * d.div_ceil(32)),
        args![y.ptr(), parts.ptr(), items, cap_tiles, t, d, step.ptr],
    )?;
    Ok(y)
}

pub(super) fn block_keys(
    dev: &Device,
    raw: &CudaBuf,
    dim: usize,
    ratio: usize,
    first: usize,
    last: usize,
) -> Result<CudaBuf> {
    if ratio == 0 || first > last || raw.len() < last * ratio * dim {
        return Err(shape_err(
            "block_keys",
            format!(
                "blocks {first}..{last} of {ratio} rows of {dim} from {} values",
                raw.len()
            ),
        ));
    }
    let count = last - first;
    let out = CudaBuf::uninit(dev, count * dim)?;
    if count * dim > 0 {
        dev.launch(
            "block_keys_f32",
            Shape::elements(count * dim),
            args![out.ptr(), raw.ptr(), dim, ratio, first, count],
        )?;
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention_gathered(
    dev: &Device,
    q: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    keep: &CudaSelection,
    q_heads: usize,
    kv: Heads,
    sinks: Option<&CudaBuf>,
) -> Result<CudaBuf> {
    let (hkv, d) = (kv.heads, kv.dim);
    let rows = keep.rows;
    let bad = hkv == 0
        || d == 0
        || !q_heads.is_multiple_of(hkv)
        || q.len() != rows * q_heads * d
        || !k.len().is_multiple_of(hkv * d)
        || v.len() != k.len()
        || keep.bound > k.len() / (hkv * d).max(1)
        || sinks.is_some_and(|s| s.len() != q_heads);
    if bad {
        return Err(shape_err(
            "attention_gathered",
            format!(
                "{} query values for {rows} queries of {q_heads}×{d}, {} cache values",
                q.len(),
                k.len()
            ),
        ));
    }
    if rows == 0 {
        return CudaBuf::uninit(dev, 0);
    }
    let tiles = keep.cap.div_ceil(TILE).max(1);
    let items = rows * q_heads;
    let parts = CudaBuf::uninit(dev, items * tiles * (d + 2))?;
    // A block per tile for few queries (decode, verify windows), a warp
    // per tile for many; the two give the same bits (`attention.cu`). A
    // block per tile for a 512-token prefill was 1.3% slower (run 20).
    let (kernel, shape) = if rows <= BLOCK_TILE_ROWS {
        (
            "attention_gathered_tiles_block_f32",
            Shape::blocks(items * tiles, 128),
        )
    } else {
        ("attention_gathered_tiles_f32", Shape::warps(items * tiles))
    };
    dev.launch(
        kernel,
        shape,
        args![
            parts.ptr(),
            q.ptr(),
            k.ptr(),
            v.ptr(),
            keep.idx.ptr(),
            keep.counts.ptr(),
            keep.cap,
            rows,
            q_heads,
            hkv,
            d,
            1.0 / (d as f32).sqrt(),
            tiles
        ],
    )?;
    merge(dev, &parts, items, tiles, q_heads, d, sinks)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention_window(
    dev: &Device,
    q: &CudaBuf,
    heads: usize,
    dim: usize,
    query_first: usize,
    window: &CudaBuf,
    window_first: usize,
    span: usize,
    entries: &CudaBuf,
    keep: EntryKeep<'_, CudaSelection>,
    sinks: &CudaBuf,
) -> Result<CudaBuf> {
    let width = heads * dim;
    let rows = q.len() / width.max(1);
    let p = window.len() / dim.max(1);
    if width == 0
        || q.len() != rows * width
        || sinks.len() != heads
        || !entries.len().is_multiple_of(dim)
        || !window.len().is_multiple_of(dim)
    {
        return Err(shape_err(
            "attention_window",
            format!(
                "{} query values, {} sinks for {heads} heads of {dim}",
                q.len(),
                sinks.len()
            ),
        ));
    }
    if query_first + rows > window_first + p || query_first < window_first {
        return Err(shape_err(
            "attention_window",
            format!(
                "queries {query_first}..{} outside the window rows {window_first}..{}",
                query_first + rows,
                window_first + p
            ),
        ));
    }
    let n_entries = entries.len() / dim;
    let (mode, ratio, sel) = match keep {
        EntryKeep::None => (0, 0, None),
        EntryKeep::Causal { ratio } => (1, ratio, None),
        EntryKeep::Selected(sel) => {
            if sel.rows != rows || sel.bound > n_entries {
                return Err(shape_err(
                    "attention_window",
                    format!(
                        "a selection of {} rows below {} for {rows} queries over {n_entries} \
                         entries",
                        sel.rows, sel.bound
                    ),
                ));
            }
            (2, 0, Some(sel))
        }
    };
    if rows == 0 {
        return CudaBuf::uninit(dev, 0);
    }
    // Keys per query at most: its window (≤ span, ≤ the cached rows) and
    // the entries it may see.
    let entries_max = match sel {
        Some(s) => s.cap,
        None if mode == 1 => n_entries,
        None => 0,
    };
    let tiles = (span.min(p) + entries_max).div_ceil(TILE).max(1);
    let items = rows * heads;
    let parts = CudaBuf::uninit(dev, items * tiles * (dim + 2))?;
    let (kernel, shape, shared) = if rows >= WINDOW_ROWS_FROM {
        (
            "attention_window_rows32_f32",
            Shape::blocks(
                rows * tiles * heads.div_ceil(WINDOW_ROWS_HEADS),
                WINDOW_ROWS_THREADS,
            ),
            0,
        )
    } else if let Some(shared) = window_staged_shared(dev, dim) {
        (
            "attention_window_staged_f32",
            Shape::blocks(
                rows * tiles * heads.div_ceil(dev.window_heads()),
                32 * dev.window_heads() as u32,
            ),
            shared,
        )
    } else {
        ("attention_window_tiles_f32", Shape::warps(items * tiles), 0)
    };
    dev.launch_shared(
        kernel,
        shape,
        shared,
        args![
            parts.ptr(),
            q.ptr(),
            window.ptr(),
            entries.ptr(),
            n_entries,
            sel.map_or(0, |s| s.idx.ptr()),
            sel.map_or(0, |s| s.counts.ptr()),
            sel.map_or(0, |s| s.cap),
            rows,
            heads,
            dim,
            query_first,
            window_first,
            span,
            mode,
            ratio,
            1.0 / (dim as f32).sqrt(),
            tiles
        ],
    )?;
    merge(dev, &parts, items, tiles, heads, dim, Some(sinks))
}
