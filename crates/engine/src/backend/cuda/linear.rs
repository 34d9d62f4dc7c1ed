//! Matrix products on the device: `matmul` (f32, Q8_0, Q4_1) and the routed
//! SwiGLU experts (`kernels/matmul.cu`). f32 products follow the CPU
//! reference's reduction sequence; block formats run a warp per output row
//! in an order of their own. Either way the row loop is inside the kernel,
//! so one compiled code serves every row count.

use super::buf::CudaBuf;
use super::device::{Device, Shape, args, ptr};
use super::elementwise::{chain_args, unary_chain};
use super::select::CudaRouting;
use super::weights::{BlockKind, CudaExperts, CudaMatrix, ExpertWeights};
use crate::backend::Unary;
use crate::error::{EngineError, Result};

/// Output columns per block of the product kernels (8 threads each).
const COLUMNS_PER_BLOCK: usize = 32;
/// Output rows per block of the block-format products (a warp each).
const ROWS_PER_BLOCK: usize = 8;
/// Block-format matrices at least this long and at most this many output
/// rows run `matmul_*_split` (eight warps per output row): a warp per row
/// left the GPU idle on the hyper-connection mixers' [4, 10240] and
/// [320, 10240]. Expert stacks (k = 2560 or 640 at full size) never match,
/// so a routed product keeps the bits of `matmul_block`.
const SPLIT_FROM_K: usize = 4096;
const SPLIT_UP_TO_N: usize = 2048;
/// Blocks along y (pairs of a gathered product) at most; the kernel loops.
const MAX_GRID_Y: usize = 65_535;

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

fn columns(n: usize, pairs: usize) -> Shape {
    Shape {
        grid: (
            n.div_ceil(COLUMNS_PER_BLOCK).max(1) as u32,
            pairs.clamp(1, MAX_GRID_Y) as u32,
        ),
        block: (COLUMNS_PER_BLOCK * 8) as u32,
    }
}

/// `chain(x·wᵀ)`: [`crate::backend::Backend::matmul_unary`] (an empty chain
/// is the plain product). One-row block products apply the chain as they
/// store (one launch); the others run the product, then `unary_chain`.
pub(super) fn matmul(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    w: &CudaMatrix,
    chain: &[Unary],
) -> Result<CudaBuf> {
    let (n, k) = w.dims();
    if x.len() != rows * k {
        return Err(shape_err(
            "matmul",
            format!("{} values are not [{rows}, {k}]", x.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, rows * n)?;
    if rows == 0 || n == 0 {
        return Ok(y);
    }
    let shape = columns(n, 1);
    match w {
        CudaMatrix::F32 { w, .. } => dev.launch(
            "matmul_f32",
            shape,
            args![y.ptr(), x.ptr(), rows, ptr(w), n, k],
        )?,
        CudaMatrix::Block {
            kind, dm, quants, ..
        } => {
            // One warp per output row; for few long rows a block of eight
            // warps per output row (the kernel's own order, chosen by the
            // matrix's shape alone so every row count gives the same bits).
            let split = k >= SPLIT_FROM_K && n <= SPLIT_UP_TO_N;
            let shape = if split {
                Shape::blocks(n, 256)
            } else {
                Shape {
                    grid: (n.div_ceil(ROWS_PER_BLOCK) as u32, 1),
                    block: (ROWS_PER_BLOCK * 32) as u32,
                }
            };
            // One activation row (decode) has kernels of its own: the same
            // arithmetic, loading ahead, without the several-row path's
            // registers (`kernels/matmul.cu`).
            let name = match (kind, split, rows == 1) {
                (BlockKind::Q4_1, false, false) => "matmul_q4_1",
                (BlockKind::Q8_0, false, false) => "matmul_q8_0",
                (BlockKind::Q4_1, true, false) => "matmul_q4_1_split",
                (BlockKind::Q8_0, true, false) => "matmul_q8_0_split",
                (BlockKind::Q4_1, false, true) => "matmul_q4_1_one",
                (BlockKind::Q8_0, false, true) => "matmul_q8_0_one",
                (BlockKind::Q4_1, true, true) => "matmul_q4_1_split_one",
                (BlockKind::Q8_0, true, true) => "matmul_q8_0_split_one",
            };
            if rows == 1 {
                let mut a = args![y.ptr(), x.ptr(), ptr(dm), ptr(quants), n, k].to_vec();
                a.extend(chain_args("matmul_unary", chain)?);
                dev.launch(name, shape, &a)?;
                return Ok(y);
            } else {
                dev.launch(
                    name,
                    shape,
                    args![y.ptr(), x.ptr(), rows, ptr(dm), ptr(quants), n, k],
                )?
            }
        }
    }
    if chain.is_empty() {
        Ok(y)
    } else {
        unary_chain(dev, &y, chain)
    }
}

/// `out[t] = Σ_k w[t,k]·down_e(act(gate_up_e·x_t))`: gate/up for every
/// (token, slot) pair in one launch, SwiGLU, down in one launch, then the
/// slots summed in order.
pub(super) fn experts_swiglu(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    routing: &CudaRouting,
    gate_up: &CudaExperts,
    down: &CudaExperts,
    limit: Option<f32>,
) -> Result<CudaBuf> {
    let (h, two_i) = (gate_up.inp, gate_up.out);
    let inter = two_i / 2;
    let ok = x.len() == rows * h
        && routing.rows == rows
        && routing.n_experts <= gate_up.e
        && two_i == 2 * inter
        && down.e == gate_up.e
        && down.out == h
        && down.inp == inter;
    if !ok {
        return Err(shape_err(
            "experts_swiglu",
            format!(
                "{} values for {rows} rows, routing of {} rows, {gate_up:?} / {down:?}",
                x.len(),
                routing.rows
            ),
        ));
    }
    let k = routing.k;
    let pairs = rows * k;
    let out = CudaBuf::uninit(dev, rows * h)?;
    if pairs == 0 {
        if rows * h > 0 {
            return super::buf::zeros(dev, rows * h);
        }
        return Ok(out);
    }
    let experts = routing.experts.ptr();
    let gu = CudaBuf::uninit(dev, pairs * two_i)?;
    gather_product(dev, &gu, x, k, experts, pairs, gate_up)?;
    let act = CudaBuf::uninit(dev, pairs * inter)?;
    dev.launch(
        "swiglu_f32",
        Shape::elements(pairs * inter),
        args![
            act.ptr(),
            gu.ptr(),
            pairs,
            inter,
            limit.is_some() as i32,
            limit.unwrap_or(0.0)
        ],
    )?;
    let ys = CudaBuf::uninit(dev, pairs * h)?;
    gather_product(dev, &ys, &act, 1, experts, pairs, down)?;
    dev.launch(
        "experts_combine",
        Shape::elements(rows * h),
        args![out.ptr(), ys.ptr(), routing.weights.ptr(), rows, k, h],
    )?;
    Ok(out)
}

/// `y[p] = w_{experts[p]} · x[p / x_div]` for every pair, one launch.
fn gather_product(
    dev: &Device,
    y: &CudaBuf,
    x: &CudaBuf,
    x_div: usize,
    experts: u64,
    pairs: usize,
    w: &CudaExperts,
) -> Result<()> {
    let (n, k) = (w.out, w.inp);
    match &w.w {
        ExpertWeights::F32(wf) => dev.launch(
            "matmul_f32_gather",
            columns(n, pairs),
            args![y.ptr(), x.ptr(), x_div, experts, pairs, ptr(wf), n, k],
        ),
        ExpertWeights::Block { kind, dm, quants } => {
            let name = match kind {
                BlockKind::Q4_1 => "matmul_q4_1_gather",
                BlockKind::Q8_0 => "matmul_q8_0_gather",
            };
            let shape = Shape {
                grid: (
                    n.div_ceil(ROWS_PER_BLOCK) as u32,
                    pairs.clamp(1, MAX_GRID_Y) as u32,
                ),
                block: (ROWS_PER_BLOCK * 32) as u32,
            };
            dev.launch(
                name,
                shape,
                args![
                    y.ptr(),
                    x.ptr(),
                    x_div,
                    experts,
                    pairs,
                    ptr(dm),
                    ptr(quants),
                    n,
                    k
                ],
            )
        }
    }
}
