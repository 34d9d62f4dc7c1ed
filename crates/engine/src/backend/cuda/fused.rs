//! Fused ops of the inventory (`backend::composed` defines each by its
//! parts) as one launch for a decode step or verify window, where a layer's
//! small kernels cost their launches rather than their work. Each kernel
//! computes every value with the device functions of the kernels it
//! replaces, so the bits are those of the parts; prefill chunks (more rows)
//! run the parts. `DS4_CUDA_FUSED=0` runs the parts everywhere, for
//! side-by-side runs.

use std::sync::LazyLock;

use super::buf::CudaBuf;
use super::device::{Device, Shape, args};
use crate::backend::ScanDims;
use crate::error::{EngineError, Result};

/// Rows at most that take a fused launch (a verify window is at most four).
const FUSED_ROWS: usize = 8;

/// Slice widths up to which the grouped norm keeps a thread's values in
/// registers (`GROUPED_THREADS · GROUPED_REG` in `kernels/norms.cu`).
const GROUPED_IN_REGS: usize = 256 * 16;

static ON: LazyLock<bool> =
    LazyLock::new(|| std::env::var("DS4_CUDA_FUSED").map_or(true, |v| v != "0"));

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// [`crate::backend::Backend::delta_inputs`] in one launch, or `None` where
/// the parts run (more rows, no conv window, fusion off).
#[allow(clippy::too_many_arguments)]
pub(super) fn delta_inputs(
    dev: &Device,
    d: ScanDims,
    u: &CudaBuf,
    window: &mut CudaBuf,
    w: &CudaBuf,
    kernel: usize,
    q_scale: f32,
    a: &CudaBuf,
    neg_a: &CudaBuf,
    dt_bias: &CudaBuf,
) -> Result<Option<[CudaBuf; 4]>> {
    let (kd, vd) = (d.hk * d.dk, d.hv * d.dv);
    let channels = 2 * kd + vd;
    let rows = u.len() / channels.max(1);
    if !*ON || kernel < 2 || rows == 0 || rows > FUSED_ROWS {
        return Ok(None);
    }
    let hist = kernel - 1;
    let bad = d.dk == 0
        || u.len() != rows * channels
        || window.len() != hist * channels
        || w.len() != channels * kernel
        || neg_a.len() != d.hv
        || dt_bias.len() != d.hv
        || a.len() != rows * d.hv;
    if bad {
        return Err(shape_err(
            "delta_inputs",
            format!(
                "u {} / window {} / weights {} / a {} / decays {} {} for {channels} channels \
                 ({} + {} + {}), {} heads, kernel {kernel}",
                u.len(),
                window.len(),
                w.len(),
                a.len(),
                neg_a.len(),
                dt_bias.len(),
                kd,
                kd,
                vd,
                d.hv
            ),
        ));
    }
    let q = CudaBuf::uninit(dev, rows * kd)?;
    let k = CudaBuf::uninit(dev, rows * kd)?;
    let v = CudaBuf::uninit(dev, rows * vd)?;
    let g = CudaBuf::uninit(dev, rows * d.hv)?;
    let next = CudaBuf::uninit(dev, hist * channels)?;
    let items = 32 * 2 * rows * d.hk + rows * vd + hist * channels + rows * d.hv;
    dev.launch(
        "delta_inputs_f32",
        Shape::elements(items),
        args![
            q.ptr(),
            k.ptr(),
            v.ptr(),
            g.ptr(),
            next.ptr(),
            u.ptr(),
            window.ptr(),
            w.ptr(),
            a.ptr(),
            neg_a.ptr(),
            dt_bias.ptr(),
            rows,
            d.hk,
            d.dk,
            vd,
            d.hv,
            kernel,
            q_scale
        ],
    )?;
    *window = next;
    Ok(Some([q, k, v, g]))
}

/// [`crate::backend::Backend::inject_streams_norm`] in one launch, or
/// `None` where the parts run.
#[allow(clippy::too_many_arguments)]
pub(super) fn inject_streams_norm(
    dev: &Device,
    xs: &CudaBuf,
    y: &CudaBuf,
    inj: &CudaBuf,
    c: usize,
    scale: &CudaBuf,
    eps: f64,
) -> Result<Option<[CudaBuf; 2]>> {
    let width = scale.len();
    let rows = inj.len() / c.max(1);
    if !*ON || c == 0 || rows == 0 || rows > FUSED_ROWS {
        return Ok(None);
    }
    let group = width / c;
    if group > GROUPED_IN_REGS {
        return Ok(None);
    }
    let bad = !width.is_multiple_of(c)
        || inj.len() != rows * c
        || y.len() != rows * group
        || xs.len() != rows * width;
    if bad {
        return Err(shape_err(
            "inject_streams_norm",
            format!(
                "streams {} / y {} / injections {} / scale {width} for {c} streams",
                xs.len(),
                y.len(),
                inj.len()
            ),
        ));
    }
    let out = CudaBuf::uninit(dev, xs.len())?;
    let n = CudaBuf::uninit(dev, xs.len())?;
    let slices = rows * c;
    // The grouped norm's constants (`norms::rms_norm_grouped`).
    let inv_n = (1f64 / group as f64) as f32;
    dev.launch(
        "inject_norm_grouped_f32",
        Shape::blocks(slices, 256),
        args![
            n.ptr(),
            out.ptr(),
            xs.ptr(),
            y.ptr(),
            inj.ptr(),
            c,
            scale.ptr(),
            slices,
            width,
            group,
            inv_n,
            eps as f32
        ],
    )?;
    Ok(Some([out, n]))
}
