//! Norms and RoPE on the device (`kernels/norms.cu`): one warp per
//! normalised slice, whose sum of squares runs in the GPU's fixed order
//! (lanes over indices mod 32, then a butterfly), the formula around it the
//! CPU reference's; the grouped norm's long slices (whole hyper-connection
//! streams) take a block of 256 threads each (threads over indices mod 256,
//! each warp's butterfly, then the warps in order).

use super::buf::CudaBuf;
use super::device::{Device, Shape, args};
use crate::backend::{GateAct, RopeLayout};
use crate::error::{EngineError, Result};

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// `x` is whole slices of `dim` and `w` has `want` values.
fn check(op: &str, x: &CudaBuf, dim: usize, w: Option<(&CudaBuf, usize)>) -> Result<usize> {
    if dim == 0 || !x.len().is_multiple_of(dim) || w.is_some_and(|(w, n)| w.len() != n) {
        return Err(shape_err(
            op,
            format!(
                "{} values in slices of {dim}, weights {:?}",
                x.len(),
                w.map(|(w, _)| w.len())
            ),
        ));
    }
    Ok(x.len() / dim)
}

pub(super) fn rms_norm(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    w: &CudaBuf,
    eps: f32,
) -> Result<CudaBuf> {
    let rows = check("rms_norm", x, width, Some((w, width)))?;
    let y = CudaBuf::uninit(dev, x.len())?;
    if rows > 0 {
        // Few wide rows: a block a row (`rms_norm_wide_f32`, the same
        // bits); otherwise a warp a row keeps every SM busy.
        let (name, shape) = if width >= WIDE_NORM_MIN && rows <= WIDE_NORM_MAX_ROWS {
            ("rms_norm_wide_f32", Shape::blocks(rows, 256))
        } else {
            ("rms_norm_f32", Shape::warps(rows))
        };
        dev.launch(
            name,
            shape,
            args![y.ptr(), x.ptr(), w.ptr(), rows, width, eps],
        )?;
    }
    Ok(y)
}

/// Widths from which a norm of few rows runs a block per row.
const WIDE_NORM_MIN: usize = 2048;
/// Rows up to which a wide norm runs a block per row (more rows fill the
/// SMs with a warp each).
const WIDE_NORM_MAX_ROWS: usize = 64;

pub(super) fn rms_norm_grouped(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    group: usize,
    scale: &CudaBuf,
    eps: f64,
) -> Result<CudaBuf> {
    if group == 0 || !width.is_multiple_of(group) {
        return Err(shape_err(
            "rms_norm_grouped",
            format!("rows of {width} in groups of {group}"),
        ));
    }
    check("rms_norm_grouped", x, width, Some((scale, width)))?;
    let slices = x.len() / group;
    let y = CudaBuf::uninit(dev, x.len())?;
    if slices > 0 {
        // candle's mean multiplies by (1/n) as f64 → f32, and adds eps as
        // f32 (an affine map).
        let inv_n = (1f64 / group as f64) as f32;
        // A block of 256 threads per slice (the kernel's stated order).
        dev.launch(
            "rms_norm_grouped_f32",
            Shape::blocks(slices, 256),
            args![
                y.ptr(),
                x.ptr(),
                scale.ptr(),
                slices,
                width,
                group,
                inv_n,
                eps as f32
            ],
        )?;
    }
    Ok(y)
}

pub(super) fn rms_norm_heads(
    dev: &Device,
    x: &mut CudaBuf,
    dim: usize,
    scale: &CudaBuf,
    eps: f32,
) -> Result<()> {
    let slices = check("rms_norm_heads", x, dim, Some((scale, dim)))?;
    if slices > 0 {
        let p = x.own_ptr(dev)?;
        dev.launch(
            "rms_norm_heads_f32",
            Shape::warps(slices),
            args![p, scale.ptr(), slices, dim, eps],
        )?;
    }
    Ok(())
}

pub(super) fn l2_norm_heads(dev: &Device, x: &mut CudaBuf, dim: usize, scale: f32) -> Result<()> {
    let slices = check("l2_norm_heads", x, dim, None)?;
    if slices > 0 {
        let p = x.own_ptr(dev)?;
        dev.launch(
            "l2_norm_heads_f32",
            Shape::warps(slices),
            args![p, slices, dim, scale],
        )?;
    }
    Ok(())
}

pub(super) fn gated_rms_norm(
    dev: &Device,
    o: &CudaBuf,
    z: &CudaBuf,
    w: &CudaBuf,
    eps: f32,
    act: GateAct,
) -> Result<CudaBuf> {
    let dim = w.len();
    let slices = check("gated_rms_norm", o, dim, None)?;
    if z.len() != o.len() {
        return Err(shape_err(
            "gated_rms_norm",
            format!("o of {} values, z of {}", o.len(), z.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, o.len())?;
    if slices > 0 {
        dev.launch(
            "gated_rms_norm_f32",
            Shape::warps(slices),
            args![
                y.ptr(),
                o.ptr(),
                z.ptr(),
                w.ptr(),
                slices,
                dim,
                eps,
                (act == GateAct::Silu) as i32
            ],
        )?;
    }
    Ok(y)
}

pub(super) fn rope(
    dev: &Device,
    x: &mut CudaBuf,
    head_dim: usize,
    cos: &CudaBuf,
    sin: &CudaBuf,
    half: usize,
    layout: RopeLayout,
) -> Result<()> {
    let rows = cos.len() / half.max(1);
    let bad = half == 0
        || 2 * half > head_dim
        || rows == 0
        || cos.len() != rows * half
        || sin.len() != cos.len()
        || !x.len().is_multiple_of(rows * head_dim);
    if bad {
        return Err(shape_err(
            "rope",
            format!(
                "{} values for {rows} rows of {head_dim}-dim heads, half {half}",
                x.len()
            ),
        ));
    }
    let heads = x.len() / (rows * head_dim);
    let layout: i32 = match layout {
        RopeLayout::HalfSplit => 0,
        RopeLayout::Interleaved => 1,
        RopeLayout::InterleavedTail => 2,
    };
    if heads > 0 {
        let p = x.own_ptr(dev)?;
        dev.launch(
            "rope_f32",
            Shape::elements(rows * heads * half),
            args![p, cos.ptr(), sin.ptr(), rows, heads, head_dim, half, layout],
        )?;
    }
    Ok(())
}

pub(super) fn layer_norm(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    w: &CudaBuf,
    b: &CudaBuf,
    eps: f32,
) -> Result<CudaBuf> {
    let rows = check("layer_norm", x, width, Some((w, width)))?;
    if b.len() != width {
        return Err(shape_err(
            "layer_norm",
            format!("a bias of {} for rows of {width}", b.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, x.len())?;
    if rows > 0 {
        dev.launch(
            "layer_norm_f32",
            Shape::warps(rows),
            args![y.ptr(), x.ptr(), w.ptr(), b.ptr(), rows, width, eps],
        )?;
    }
    Ok(y)
}
