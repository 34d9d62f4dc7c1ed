//! The fast kernel set's Q8_0 / Q4_1 products (`kernels/fast8.cu`): each
//! activation row rounded to int8 blocks of 32 once (`f8_quantize`), then
//! one launch for up to [`F8_PARTS`] matrices that read it: eight lanes
//! per output on `dp4a` for one row (decode), a warp per output for a few
//! (verify windows, small batches: up to [`FEW_ROWS`] rows a warp),
//! tensor-core tiles for more. The arithmetic is the CPU fast set's
//! (`cpu/q8_matmul`), so every output has its bits whatever the row count,
//! kernel or tile.

use super::buf::CudaBuf;
use super::device::{Device, Shape, args};
use super::elementwise::{ChainFields, chain_fields};
use super::weights::BlockKind;
use crate::backend::Unary;
use crate::error::{EngineError, Result};

/// Matrices one launch takes at most (`F8_PARTS` in `fast8.cu`).
pub(super) const F8_PARTS: usize = 4;
/// Values per rounded activation block.
const BLOCK: usize = 32;
/// Warps per block of the per-warp launches, and the unit every part's
/// outputs are rounded up to.
const ONE_WARPS: usize = 8;
/// Outputs a warp of the one-row kernel takes (a group of eight lanes
/// each): its grid is that many times smaller than the units (run 45 ran
/// a warp per unit, three in four returning at once).
const ONE_ROW_OUTPUTS_A_WARP: usize = 4;
/// Rows up to which a launch runs warps per output on `dp4a` (4 or 8 rows
/// a warp, each weight block read once for them) rather than tensor-core
/// tiles of 16 outputs a warp, which leave a 2-row verify window a
/// sixteenth of the warps the one-row kernel has.
const FEW_ROWS: usize = 8;
/// Outputs from which 5–8 rows run the tensor-core tiles after all: with
/// that many outputs the tiles' warps fill the GPU and beat 8 rows a warp
/// on `dp4a` (run 36, H100, Q8_0 × 8 rows: [16384, 4096] 82 µs in tiles
/// against 107; [4096, 4096] 57 against 32).
const FEW_ROWS_TILES_FROM: usize = 8192;
/// Outputs per block of a tiled launch (4 warps of 16).
const TILE_COLS: usize = 64;
/// Rows above which a tiled launch takes 32 rows a warp instead of 8 (the
/// grid has blocks enough from the rows' tiles either way below it).
const WIDE_TILES_FROM: usize = 128;
/// Blocks along y at most.
const MAX_GRID_Y: usize = 65_535;

/// One part of a launch: `F8Part` of `fast8.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct F8Part {
    dm: u64,
    quants: u64,
    y: u64,
    n: u64,
    first: u64,
    x_off: u64,
    y_stride: u64,
    chain: ChainFields,
}

/// The `Fast8` parameter of `fast8.cu`'s product kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct F8Args {
    q: u64,
    d: u64,
    s: u64,
    rows: u64,
    k: u64,
    x_stride: u64,
    parts: u64,
    p: [F8Part; F8_PARTS],
}

/// A fast-set matrix as one launch reads it.
pub(super) struct F8Matrix<'a> {
    pub kind: BlockKind,
    pub dm: u64,
    pub quants: u64,
    pub out: usize,
    pub inp: usize,
    pub chain: &'a [Unary],
}

/// `rows` rows of `x` (`k` values each) rounded for `kind`'s products:
/// the buffer (bytes, then `d`, then `s`) and the three addresses.
fn round_rows(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    k: usize,
    kind: BlockKind,
) -> Result<(CudaBuf, [u64; 3])> {
    let blocks = rows * k / BLOCK;
    let buf = CudaBuf::uninit(dev, rows * k / 4 + 2 * blocks)?;
    let q = buf.ptr();
    let d = q + (rows * k) as u64;
    let s = d + 4 * blocks as u64;
    let q4 = i32::from(kind == BlockKind::Q4_1);
    dev.launch(
        "f8_quantize",
        Shape::warps(blocks),
        args![q, d, s, x.ptr(), blocks, q4],
    )?;
    Ok((buf, [q, d, s]))
}

/// Where each part of a launch writes: a buffer of its own `[rows, n]`, or
/// columns `i·n ..` of one shared `[rows, g·n]` (grouped products).
enum Outputs {
    Own(Vec<CudaBuf>),
    Shared(CudaBuf),
}

impl Outputs {
    /// Part `i`'s first value and the values between its rows.
    fn at(&self, i: usize, n: usize, parts: usize) -> (u64, usize) {
        match self {
            Outputs::Own(ys) => (ys[i].ptr(), n),
            Outputs::Shared(y) => (y.ptr() + (4 * i * n) as u64, parts * n),
        }
    }
}

/// `chain(x · wᵀ)` for every matrix of `parts` (one format, one `k`), each
/// into a buffer of its own: one rounding of `x`, then a launch per
/// [`F8_PARTS`] matrices.
pub(super) fn products(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[F8Matrix<'_>],
) -> Result<Vec<CudaBuf>> {
    let outs = parts
        .iter()
        .map(|p| CudaBuf::uninit(dev, rows * p.out))
        .collect::<Result<Vec<_>>>()?;
    let outs = Outputs::Own(outs);
    run(dev, x, rows, parts, false, &outs)?;
    let Outputs::Own(ys) = outs else {
        return Err(EngineError::State("fast products: outputs".into()));
    };
    Ok(ys)
}

/// [`crate::backend::Backend::matmul_grouped`] over fast-set matrices of
/// one shape `[n, k]`: group `i` reads columns `i·k ..` of `x` and writes
/// columns `i·n ..` of the output. Blocks of 32 never straddle two groups,
/// so one rounding of the whole row is each group's rounding of its slice:
/// every group has its own `matmul`'s bits.
pub(super) fn grouped(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[F8Matrix<'_>],
) -> Result<CudaBuf> {
    let n = parts.first().map_or(0, |p| p.out);
    if parts.iter().any(|p| p.out != n) {
        return Err(EngineError::State(
            "fast grouped products: groups of one shape".into(),
        ));
    }
    let outs = Outputs::Shared(CudaBuf::uninit(dev, rows * parts.len() * n)?);
    run(dev, x, rows, parts, true, &outs)?;
    let Outputs::Shared(y) = outs else {
        return Err(EngineError::State("fast grouped products: output".into()));
    };
    Ok(y)
}

/// Round `x` once and launch the parts four at a time; `grouped`: part `i`
/// reads columns `i·k ..` of rows `g·k` long.
fn run(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[F8Matrix<'_>],
    grouped: bool,
    outs: &Outputs,
) -> Result<()> {
    let Some(first) = parts.first() else {
        return Ok(());
    };
    let (kind, k) = (first.kind, first.inp);
    if parts.iter().any(|p| p.kind != kind || p.inp != k) || !k.is_multiple_of(BLOCK) {
        return Err(EngineError::State(format!(
            "fast products: parts of one format and a length a multiple of {BLOCK} ({:?})",
            parts.iter().map(|p| (p.kind, p.inp)).collect::<Vec<_>>()
        )));
    }
    let x_stride = if grouped { parts.len() * k } else { k };
    if x.len() != rows * x_stride {
        return Err(EngineError::State(format!(
            "fast products: {} values are not [{rows}, {x_stride}]",
            x.len()
        )));
    }
    if rows == 0 || k == 0 {
        return Ok(());
    }
    let (_rounded, [q, d, s]) = round_rows(dev, x, rows, x_stride, kind)?;
    // Warps per output (`dp4a`) for few rows; 64-output tiles for more.
    let per_warp =
        rows <= 4 || (rows <= FEW_ROWS && parts.iter().all(|p| p.out < FEW_ROWS_TILES_FROM));
    for (c, chunk) in parts.chunks(F8_PARTS).enumerate() {
        let mut a = F8Args {
            q,
            d,
            s,
            rows: rows as u64,
            k: k as u64,
            x_stride: x_stride as u64,
            parts: chunk.len() as u64,
            ..Default::default()
        };
        // Units: warps (few rows) or 64-output tiles, each part starting a
        // block of its own.
        let mut first = 0usize;
        for (i, p) in chunk.iter().enumerate() {
            let index = c * F8_PARTS + i;
            let units = if per_warp {
                p.out.div_ceil(ONE_WARPS) * ONE_WARPS
            } else {
                p.out.div_ceil(TILE_COLS)
            };
            let (y, y_stride) = outs.at(index, p.out, parts.len());
            a.p[i] = F8Part {
                dm: p.dm,
                quants: p.quants,
                y,
                n: p.out as u64,
                first: first as u64,
                x_off: if grouped { (index * k) as u64 } else { 0 },
                y_stride: y_stride as u64,
                chain: chain_fields("fast products", p.chain)?,
            };
            first += units;
        }
        if first == 0 {
            continue;
        }
        let (name, shape) = if per_warp {
            let (name, rows_a_warp) = match (kind, rows) {
                (BlockKind::Q8_0, 1) => ("f8_one_q8_0", 1),
                (BlockKind::Q4_1, 1) => ("f8_one_q4_1", 1),
                (BlockKind::Q8_0, 2..=4) => ("f8_rows4_q8_0", 4),
                (BlockKind::Q4_1, 2..=4) => ("f8_rows4_q4_1", 4),
                (BlockKind::Q8_0, _) => ("f8_rows8_q8_0", 8),
                (BlockKind::Q4_1, _) => ("f8_rows8_q4_1", 8),
            };
            let units_a_warp = if rows_a_warp == 1 {
                ONE_ROW_OUTPUTS_A_WARP
            } else {
                1
            };
            let blocks = first.div_ceil(ONE_WARPS * units_a_warp);
            (name, (blocks, rows.div_ceil(rows_a_warp), ONE_WARPS * 32))
        } else {
            let wide = rows > WIDE_TILES_FROM;
            let name = match (kind, wide) {
                (BlockKind::Q8_0, false) => "f8_tiles8_q8_0",
                (BlockKind::Q4_1, false) => "f8_tiles8_q4_1",
                (BlockKind::Q8_0, true) => "f8_tiles32_q8_0",
                (BlockKind::Q4_1, true) => "f8_tiles32_q4_1",
            };
            let tile_rows = if wide { 32 } else { 8 };
            let y = rows.div_ceil(tile_rows).min(MAX_GRID_Y);
            (name, (first, y, 128))
        };
        let (gx, gy, threads) = shape;
        if gx > u32::MAX as usize {
            return Err(EngineError::State(format!(
                "fast products: {gx} blocks of outputs"
            )));
        }
        dev.launch_fast8(
            name,
            Shape {
                grid: (gx as u32, gy as u32),
                block: threads as u32,
            },
            &a,
        )?;
    }
    Ok(())
}
