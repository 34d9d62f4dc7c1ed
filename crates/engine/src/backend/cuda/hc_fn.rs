//! `Backend::rms_matmul` on CUDA (`kernels/hc_fn.cu`): the fast kernel
//! set's mHC `fn` projection, the unweighted RMS norm and the product in
//! one launch with sums of its own order (see the kernel file). The
//! reference set, and a product the kernels do not take (a block format,
//! an input size that is not a multiple of 8), run the two ops; which one
//! runs depends on the set and the weight alone, never on the row count,
//! so a row has the same bits in every forward of a set.

use super::buf::CudaBuf;
use super::device::{Device, Shape, args, ptr};
use super::weights::CudaMatrix;
use crate::backend::KernelSet;
use crate::error::{EngineError, Result};
use crate::quant::WeightType;

/// Threads of a block (`HC_FN_THREADS`).
const THREADS: u32 = 256;
/// Rows from which a block owns 8 outputs (`*_o8`) instead of one: each
/// row's values are then read once for 8 outputs; fewer rows keep one
/// output a block so that a decode row spreads over as many SMs as it has
/// outputs. The outputs' bits are the same either way.
const EIGHT_FROM: usize = 16;
/// Grid rows at most (the kernel loops over the rest).
const MAX_GRID_Y: usize = 65_535;

/// The fused product of `rows` rows of `x` by `w` after the norm, or
/// `None` where the two ops run instead (see the module docs).
pub(super) fn rms_matmul(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    w: &CudaMatrix,
    eps: f32,
) -> Result<Option<CudaBuf>> {
    if dev.kernel_set() != KernelSet::Fast {
        return Ok(None);
    }
    let (n, k) = w.dims();
    let (kind, wp) = match w {
        CudaMatrix::F32 { w, .. } => ("f32", ptr(w)),
        CudaMatrix::Stored { w, .. } if w.ty == WeightType::F16 => ("f16", w.data_ptr()),
        CudaMatrix::Stored { w, .. } if w.ty == WeightType::BF16 => ("bf16", w.data_ptr()),
        _ => return Ok(None),
    };
    if k == 0 || !k.is_multiple_of(8) {
        return Ok(None);
    }
    if x.len() != rows * k {
        return Err(EngineError::State(format!(
            "rms_matmul: {} values are not {rows} rows of {k}",
            x.len()
        )));
    }
    let y = CudaBuf::uninit(dev, rows * n)?;
    if rows == 0 || n == 0 {
        return Ok(Some(y));
    }
    let eight = rows >= EIGHT_FROM;
    let name = match (kind, eight) {
        ("f32", false) => "hc_fn_f32_o1",
        ("f32", true) => "hc_fn_f32_o8",
        ("f16", false) => "hc_fn_f16_o1",
        ("f16", true) => "hc_fn_f16_o8",
        ("bf16", false) => "hc_fn_bf16_o1",
        _ => "hc_fn_bf16_o8",
    };
    let outs = if eight { 8 } else { 1 };
    let shape = Shape {
        grid: (
            n.div_ceil(outs).min(MAX_GRID_Y) as u32,
            rows.min(MAX_GRID_Y) as u32,
        ),
        block: THREADS,
    };
    dev.launch(name, shape, args![y.ptr(), x.ptr(), rows, wp, n, k, eps])?;
    Ok(Some(y))
}
