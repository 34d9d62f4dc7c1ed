//! Stored weight types on the device (`kernels/stored.cu`): every type the
//! CPU keeps stored (`CpuMatrix::Stored`, `CpuExperts::Stored`,
//! `CpuTable::Stored`) other than F32, Q4_1 and Q8_0 — F16, BF16, Q4_0,
//! Q5_0, Q5_1, Q2_K..Q6_K, Q8_K, IQ2_XXS, MXFP4, and FP8 E4M3 / FP4 E2M1
//! with a scale grid — is uploaded as stored and dequantized in registers
//! by its kernels.
//!
//! The reference set's values: a stored product runs the CPU's f32 kernel
//! sequence per output (`cpu::f32_matmul::dot`: eight FMA lanes over
//! `⌊k/8⌋` steps, the fixed lane sum, the tail) with each weight the value
//! `quant::dequant` gives it, so it has the CPU's bits, in every row count,
//! window and routed pair (tests/cuda/ops/stored.rs). The fast set runs
//! its own products where it has them: the 256-value super-block formats
//! on int8 activations (`kernels/kq8.cu`), F16 and BF16 with f32
//! activations a warp an output (`kernels/f16w.cu`), each in one order for
//! every row count and routed pair (tests/cuda/ops/kq8.rs, f16w.rs).
//!
//! Layout: the bytes of every part, joined in row order (`[rows, row
//! bytes]`, as the file stores them), padded by [`PAD`] bytes (the kernels
//! copy whole 16-byte words covering a row's bytes); a scale grid as f32
//! values, every part's grid one after the other, with a `u32` per weight
//! row giving the offset of its scale row (so parts whose row counts are
//! not multiples of the grid's block rows join as they are).

use cudarc::driver::CudaSlice;

use super::buf::CudaBuf;
use super::device::{Arg, Device, Shape, args, ptr};
use crate::backend::KernelSet;
use crate::error::{EngineError, Result};
use crate::quant::{QuantTensor, WeightType};

/// Bytes after the last row (the kernels' 16-byte words may reach 15 past
/// a row's end).
const PAD: usize = 64;
/// Weight rows a block of the product kernels owns (`ST_COLS`).
const COLS: usize = 32;
/// Threads of a product block (8 per weight row).
const THREADS: u32 = 256;
/// Grid dimensions at most (the kernels loop past them).
const MAX_GRID: usize = 65_535;

fn err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// Whether the device keeps `ty` stored through these kernels (F32 and the
/// repacked block formats Q4_1 / Q8_0 have kernels of their own).
pub(super) fn kept_stored(ty: WeightType) -> bool {
    kernels(ty).is_some()
}

/// The kernels of a format: product, routed product, table rows, and for
/// the 16-bit floats a product whose blocks own 4 rows (`StNarrow`: the
/// same per-output sequence, so the same bits).
struct Kernels {
    matmul: &'static str,
    gather: &'static str,
    table: &'static str,
    narrow: Option<&'static str>,
    /// The narrow product with a deeper ring in dynamic shared memory
    /// (`StDeep`), where the device allows [`DEEP_SMEM`] a block.
    deep: Option<&'static str>,
}

macro_rules! kernels {
    ($s:literal) => {
        Some(Kernels {
            matmul: concat!("st_matmul_", $s),
            gather: concat!("st_gather_", $s),
            table: concat!("st_table_", $s),
            narrow: None,
            deep: None,
        })
    };
    ($s:literal, narrow) => {
        Some(Kernels {
            narrow: Some(concat!("st_matmul_narrow_", $s)),
            deep: Some(concat!("st_matmul_deep_", $s)),
            ..kernels!($s).unwrap()
        })
    };
}

fn kernels(ty: WeightType) -> Option<Kernels> {
    match ty {
        WeightType::F16 => kernels!("f16", narrow),
        WeightType::BF16 => kernels!("bf16", narrow),
        WeightType::Q4_0 => kernels!("q4_0"),
        WeightType::Q5_0 => kernels!("q5_0"),
        WeightType::Q5_1 => kernels!("q5_1"),
        WeightType::Q2_K => kernels!("q2_k"),
        WeightType::Q3_K => kernels!("q3_k"),
        WeightType::Q4_K => kernels!("q4_k"),
        WeightType::Q5_K => kernels!("q5_k"),
        WeightType::Q6_K => kernels!("q6_k"),
        WeightType::Q8_K => kernels!("q8_k"),
        WeightType::IQ2_XXS => kernels!("iq2_xxs"),
        WeightType::MXFP4 => kernels!("mxfp4"),
        WeightType::FP8_E4M3 => kernels!("fp8"),
        WeightType::FP4_E2M1 => kernels!("fp4"),
        // IQ4_NL: no kernel yet; held as f32 (docs/QUANTIZE.md).
        WeightType::F32 | WeightType::Q4_1 | WeightType::Q8_0 | WeightType::IQ4_NL => None,
    }
}

/// A scale grid on the device.
struct DeviceScales {
    grid: CudaSlice<f32>,
    /// Per weight row, the offset of its scale row in `grid`.
    rows: CudaSlice<u32>,
    block_cols: u32,
}

/// A stored tensor `[rows, cols]` on the device (an expert stack's rows are
/// its experts' rows one after another).
pub struct StoredWeights {
    pub(super) ty: WeightType,
    data: CudaSlice<u8>,
    scales: Option<DeviceScales>,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Stored bytes (scales included), for bandwidth reports.
    pub(super) bytes: usize,
}

impl std::fmt::Debug for StoredWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}, {}]", self.ty, self.rows, self.cols)
    }
}

impl StoredWeights {
    /// `q` uploaded as stored (see the module docs); `None` when its type is
    /// not one of these kernels'.
    pub(super) fn upload(dev: &Device, q: &QuantTensor) -> Result<Option<Self>> {
        if !kept_stored(q.ty) {
            return Ok(None);
        }
        q.check().map_err(|e| err("stored weight", e.to_string()))?;
        let (rows, cols) = (q.rows(), q.cols());
        if cols > u32::MAX as usize / 2 {
            return Err(err(
                "stored weight",
                format!("rows of {cols} values are too long"),
            ));
        }
        let row_bytes = q.row_bytes();
        let total = rows * row_bytes;
        let mut data = dev.alloc_weight::<u8>(total + PAD)?;
        let mut at = 0;
        for p in &q.parts {
            let bytes = p.data.as_slice();
            if !bytes.is_empty() {
                dev.stream
                    .memcpy_htod(bytes, &mut data.slice_mut(at..at + bytes.len()))
                    .map_err(|e| EngineError::Device(format!("host-to-device copy: {e:?}")))?;
                // A copy from pageable memory returns once the bytes are
                // staged, so a file map may drop these pages: the host
                // keeps no second copy of an uploaded model.
                p.data.release();
            }
            at += bytes.len();
        }
        debug_assert_eq!(at, total);
        dev.stream
            .memcpy_htod(&[0u8; PAD], &mut data.slice_mut(total..total + PAD))
            .map_err(|e| EngineError::Device(format!("host-to-device copy: {e:?}")))?;
        let scales = if q.ty.needs_scales() {
            Some(upload_scales(dev, q)?)
        } else {
            None
        };
        Ok(Some(Self {
            ty: q.ty,
            data,
            scales,
            rows,
            cols,
            bytes: q.byte_size(),
        }))
    }

    fn kernels(&self) -> Kernels {
        kernels(self.ty).expect("only kept-stored types are uploaded")
    }

    /// The device address of the stored bytes (row `j` of a 16-bit float
    /// type at `2·cols·j`), for kernels of other files (`hc_fn.rs`).
    pub(super) fn data_ptr(&self) -> u64 {
        ptr(&self.data)
    }

    /// The kernels' trailing scale arguments: grid, row offsets, block
    /// columns and their log2 (−1 when not a power of two).
    fn scale_args(&self) -> [Arg; 4] {
        match &self.scales {
            None => [Arg::U64(0), Arg::U64(0), Arg::U32(1), Arg::I32(0)],
            Some(s) => {
                let bc = s.block_cols;
                let sh = if bc.is_power_of_two() {
                    bc.trailing_zeros() as i32
                } else {
                    -1
                };
                [
                    Arg::U64(ptr(&s.grid)),
                    Arg::U64(ptr(&s.rows)),
                    Arg::U32(bc),
                    Arg::I32(sh),
                ]
            }
        }
    }
}

/// Every part's grid, joined, and the offset of each weight row's scale row.
fn upload_scales(dev: &Device, q: &QuantTensor) -> Result<DeviceScales> {
    let cols = q.cols();
    let mut grid: Vec<f32> = Vec::new();
    let mut rows: Vec<u32> = Vec::with_capacity(q.rows());
    let mut block_cols = None;
    for p in &q.parts {
        let s = p
            .scales
            .as_ref()
            .ok_or_else(|| err("stored weight", format!("{} needs a scale grid", q.ty)))?;
        if *block_cols.get_or_insert(s.block_cols) != s.block_cols {
            return Err(err(
                "stored weight",
                format!(
                    "parts scaled in blocks of {} and {} columns",
                    block_cols.unwrap_or(0),
                    s.block_cols
                ),
            ));
        }
        let base = grid.len();
        let gc = s.grid_cols(cols);
        for r in 0..p.rows {
            let off = base + r / s.block_rows * gc;
            rows.push(u32::try_from(off).map_err(|_| {
                err(
                    "stored weight",
                    format!("a scale grid of more than {} values", u32::MAX),
                )
            })?);
        }
        grid.extend_from_slice(&s.values);
    }
    let block_cols = block_cols.unwrap_or(1);
    if block_cols == 0 || block_cols > u32::MAX as usize {
        return Err(err(
            "stored weight",
            format!("scale blocks of {block_cols} columns"),
        ));
    }
    Ok(DeviceScales {
        grid: dev.upload_weight(&grid)?,
        rows: dev.upload_weight(&rows)?,
        block_cols: block_cols as u32,
    })
}

/// The fast kernel set's products of a format (`kernels/kq8.cu`): one
/// activation row, tiles of rows, routed pairs.
struct FastKernels {
    one: &'static str,
    tiles: &'static str,
    gather: &'static str,
    grouped: &'static str,
}

macro_rules! fast {
    ($s:literal) => {
        Some(FastKernels {
            one: concat!("kq8_matmul_one_", $s),
            tiles: concat!("kq8_matmul_", $s),
            gather: concat!("kq8_gather_", $s),
            grouped: concat!("kq8_mma_", $s),
        })
    };
}

/// Outputs a block of the grouped products owns (`kq8_mma_*`: 4 warps of
/// 16).
const KQM_COLS: usize = 64;

/// Pairs from which a fast routed product runs grouped by expert
/// (`kernels/kq8_grouped.cu` sorts them into tiles of up to [`KQ_GROUP`]
/// pairs of one expert, `kernels/kq8_mma.cu` multiplies a tile by 16 of
/// the expert's rows a warp on the tensor cores); fewer (decode) run
/// `kq8_gather_*`, a pair a warp. Same bits either way.
const GROUP_FROM_PAIRS: usize = 32;
/// And only where the stack has at most eight experts a pair:
/// sparser, the tiles hold about one pair each, and sorting them costs
/// more than the gather (run 46: GLM-5's K = 3 verify window, 32 pairs over
/// 288 experts, 16.6 ms against 11.6 for K = 2's 24 pairs by the gather).
const GROUP_EXPERTS_PER_PAIR_MAX: usize = 8;
/// Pairs per grouped tile at most (`KQ_GROUP`).
const KQ_GROUP: usize = 32;
/// Experts a grouping counts at most (`KQ_GROUP_EXPERTS`).
const KQ_GROUP_EXPERTS: usize = 1024;

/// Values per super-block of the fast products' activation rounding.
const KQ: usize = 256;
/// Output elements (warps) per block of a fast product.
const KQ_WARPS: usize = 4;
/// Activation rows per tile of `kq8_matmul_*` (`KQ_TILE`).
const KQ_TILE: usize = 4;

/// The fast set's kernels for `w` when this device runs the fast set and
/// `w` is a 256-value super-block type of whole super-blocks: the CPU fast
/// set's arithmetic (`cpu/kq8_matmul`), so the same bits.
fn fast_kernels(dev: &Device, w: &StoredWeights) -> Option<FastKernels> {
    if dev.kernel_set() != KernelSet::Fast || !w.cols.is_multiple_of(KQ) {
        return None;
    }
    match w.ty {
        WeightType::Q2_K => fast!("q2_k"),
        WeightType::Q3_K => fast!("q3_k"),
        WeightType::Q4_K => fast!("q4_k"),
        WeightType::Q5_K => fast!("q5_k"),
        WeightType::Q6_K => fast!("q6_k"),
        WeightType::IQ2_XXS => fast!("iq2_xxs"),
        _ => None,
    }
}

/// The fast set's products over 16-bit float weights (`kernels/f16w.cu`:
/// a warp an output, its own order of the f32 sums): one activation row,
/// up to [`FAST16_FEW_MAX`] rows, more rows, routed pairs.
struct Fast16Kernels {
    one: &'static str,
    few: &'static str,
    rows: &'static str,
    gather: &'static str,
}

macro_rules! fast16 {
    ($s:literal) => {
        Some(Fast16Kernels {
            one: concat!("f16w_one_", $s),
            few: concat!("f16w_few_", $s),
            rows: concat!("f16w_rows_", $s),
            gather: concat!("f16w_gather_", $s),
        })
    };
}

/// Warps (outputs) per block of the 16-bit float products (`F16W_WARPS`).
const FAST16_WARPS: usize = 8;
/// Rows up to which a product runs a warp an output over tiles of
/// [`FAST16_TILE`] rows (`f16w_few_*`); more run four outputs a warp
/// (`f16w_rows_*`: each weight word read once a tile for 32 sums, a
/// quarter of the blocks). The same sums either way.
const FAST16_FEW_MAX: usize = 64;
/// Activation rows per tile of the 16-bit float products.
const FAST16_TILE: usize = 8;
/// Outputs a warp of `f16w_rows_*` takes.
const FAST16_ROWS_OUTPUTS: usize = 4;

/// The fast set's 16-bit float kernels for `w` when this device runs the
/// fast set and `w`'s rows are whole 16-byte words (k a multiple of 8; the
/// choice depends on the format and k alone, so every row count of a
/// product takes the same order).
fn fast16_kernels(dev: &Device, w: &StoredWeights) -> Option<Fast16Kernels> {
    if dev.kernel_set() != KernelSet::Fast || !w.cols.is_multiple_of(8) {
        return None;
    }
    match w.ty {
        WeightType::F16 => fast16!("f16"),
        WeightType::BF16 => fast16!("bf16"),
        _ => None,
    }
}

/// Blocks of `f16w.cu`'s kernels for `n` outputs (their blocks do not loop
/// over outputs, so every output needs its warp in the grid).
fn fast16_blocks(op: &str, n: usize, outputs_a_warp: usize) -> Result<u32> {
    u32::try_from(n.div_ceil(FAST16_WARPS * outputs_a_warp))
        .map_err(|_| err(op, format!("{n} outputs")))
}

/// `f16w.cu` reads 16-byte words of x and w: allocations start on 256
/// bytes and rows are whole words, so this holds for every buffer the
/// backend makes; an error rather than a misaligned load otherwise.
fn fast16_aligned(op: &str, x: &CudaBuf, w: &StoredWeights) -> Result<()> {
    if x.ptr().is_multiple_of(16) && ptr(&w.data).is_multiple_of(16) {
        Ok(())
    } else {
        Err(err(op, "16-bit float product on unaligned rows".into()))
    }
}

/// `rows` activation rows of `k` values rounded to int8 super-blocks: the
/// buffer holding them, the bytes' and the scales' device addresses.
fn round_rows(dev: &Device, x: &CudaBuf, rows: usize, k: usize) -> Result<(CudaBuf, u64, u64)> {
    let blocks = rows * k / KQ;
    // The bytes (a multiple of 256), then one f32 per super-block.
    let buf = CudaBuf::uninit(dev, rows * k / 4 + blocks)?;
    let (q, d) = (buf.ptr(), buf.ptr() + (rows * k) as u64);
    dev.launch(
        "kq8_quantize",
        Shape::warps(blocks),
        args![q, d, x.ptr(), blocks],
    )?;
    Ok((buf, q, d))
}

fn fast_grid(n: usize, y: usize) -> Shape {
    Shape {
        grid: (
            n.div_ceil(KQ_WARPS).clamp(1, MAX_GRID) as u32,
            y.clamp(1, MAX_GRID) as u32,
        ),
        block: (KQ_WARPS * 32) as u32,
    }
}

/// Column blocks of a product launch.
fn col_blocks(n: usize) -> u32 {
    n.div_ceil(COLS).clamp(1, MAX_GRID) as u32
}

/// Weight rows a narrow product block owns (`StNarrow::COLS`).
const NARROW_COLS: usize = 4;
/// Below this many wide blocks a product runs narrow (an H100/H200 has 132
/// SMs: a wide launch of fewer blocks leaves SMs idle).
const NARROW_BELOW_BLOCKS: u32 = 128;

/// Dynamic shared memory of `StDeep`'s ring (`kernels/stored.cu`): 8
/// stages × (4 weight rows of 1296 + 32 bytes + 4 activation rows of 648 +
/// 8 floats).
pub(super) const DEEP_SMEM: usize = 8 * (4 * (1296 + 32) + 4 * (648 + 8) * 4);

/// Blocks a product of several rows aims at (a few waves of the 132 SMs
/// of an H100 / H200): the tiles of rows are split along grid.y until the
/// output blocks times the row blocks reach it.
const PRODUCT_BLOCKS: usize = 512;
/// Activation rows per tile of the stored products (`ST_TILE`).
const ST_TILE: usize = 4;

/// Blocks along y for a product of `rows` rows whose outputs take `blocks`
/// blocks: each takes whole tiles of [`ST_TILE`] rows (one row runs one).
fn row_blocks(rows: usize, blocks: u32) -> u32 {
    if rows <= 1 {
        return 1;
    }
    let tiles = rows.div_ceil(ST_TILE);
    PRODUCT_BLOCKS
        .div_ceil(blocks.max(1) as usize)
        .clamp(1, tiles.min(MAX_GRID)) as u32
}

/// The product kernel, its grid and its dynamic shared memory for `n`
/// outputs on `dev`.
fn product_launch(dev: &Device, kernels: &Kernels, n: usize) -> (&'static str, u32, u32) {
    match (kernels.narrow, kernels.deep) {
        (Some(narrow), deep) if col_blocks(n) < NARROW_BELOW_BLOCKS => {
            let blocks = n.div_ceil(NARROW_COLS).clamp(1, MAX_GRID) as u32;
            match deep {
                Some(deep) if dev.shared_optin >= DEEP_SMEM => (deep, blocks, DEEP_SMEM as u32),
                _ => (narrow, blocks, 0),
            }
        }
        _ => (kernels.matmul, col_blocks(n), 0),
    }
}

/// Rows from which an F16 / BF16 product runs `st_rows_*`
/// (`kernels/stored_rows.cu`: register tiles of 4 outputs × 8 rows a
/// thread; the same sums as the tile kernels, so the same bits).
const ROWS_FROM: usize = 16;
/// Outputs and rows a block of `st_rows_*` owns (`SR_OUTS`, `SR_ROWS`).
const ROWS_TILE: usize = 32;
/// Values a chunk of `st_rows_*` stages (`SR_KC`): k must be a multiple.
const ROWS_CHUNK: usize = 64;

/// Blocks below which `st_rows_*` leaves a product to the tile kernels
/// split over grid.y: a 24-output product of 256 rows is 8 blocks of
/// `st_rows_*` (run 36: DeepSeek-V4's HC `fn`, 16384 long, 299 µs a launch
/// against 152 µs in the deep tiles over 384 blocks).
const ROWS_MIN_BLOCKS: usize = 64;

/// `st_rows_*` for a product of `rows` rows of `x` by `w`, where it
/// applies: 16-bit float weights, whole chunks, activation rows that start
/// on 16 bytes (its loads are 16 bytes wide), and blocks enough.
fn rows_kernel(w: &StoredWeights, x: &CudaBuf, rows: usize) -> Option<&'static str> {
    let name = match w.ty {
        WeightType::F16 => "st_rows_f16",
        WeightType::BF16 => "st_rows_bf16",
        _ => return None,
    };
    let (gx, gy) = (w.rows.div_ceil(ROWS_TILE), rows.div_ceil(ROWS_TILE));
    // The kernel's blocks do not loop: every tile needs a block of its own.
    (rows >= ROWS_FROM
        && gx * gy >= ROWS_MIN_BLOCKS
        && gx <= MAX_GRID
        && gy <= MAX_GRID
        && w.cols.is_multiple_of(ROWS_CHUNK)
        && x.ptr().is_multiple_of(16))
    .then_some(name)
}

/// `y[rows, n] = x[rows, k] · wᵀ` into `y` (the caller checked the shapes).
pub(super) fn matmul(
    dev: &Device,
    y: &CudaBuf,
    x: &CudaBuf,
    rows: usize,
    w: &StoredWeights,
) -> Result<()> {
    let (n, k) = (w.rows, w.cols);
    if let Some(f) = fast_kernels(dev, w) {
        let (_rounded, q, d) = round_rows(dev, x, rows, k)?;
        let (name, tiles) = if rows == 1 {
            (f.one, 1)
        } else {
            (f.tiles, rows.div_ceil(KQ_TILE))
        };
        return dev.launch(
            name,
            fast_grid(n, tiles),
            args![y.ptr(), q, d, rows, ptr(&w.data), n, k],
        );
    }
    if let Some(f) = fast16_kernels(dev, w) {
        fast16_aligned("matmul", x, w)?;
        let (name, outputs_a_warp) = match rows {
            1 => (f.one, 1),
            r if r <= FAST16_FEW_MAX => (f.few, 1),
            _ => (f.rows, FAST16_ROWS_OUTPUTS),
        };
        return dev.launch(
            name,
            Shape {
                grid: (
                    fast16_blocks("matmul", n, outputs_a_warp)?,
                    rows.div_ceil(FAST16_TILE).clamp(1, MAX_GRID) as u32,
                ),
                block: (FAST16_WARPS * 32) as u32,
            },
            args![y.ptr(), x.ptr(), rows, ptr(&w.data), n, k],
        );
    }
    if let Some(name) = rows_kernel(w, x, rows) {
        return dev.launch(
            name,
            Shape {
                grid: (
                    n.div_ceil(ROWS_TILE) as u32,
                    rows.div_ceil(ROWS_TILE) as u32,
                ),
                block: THREADS,
            },
            args![y.ptr(), x.ptr(), rows, ptr(&w.data), n, k],
        );
    }
    let mut a = args![y.ptr(), x.ptr(), rows, ptr(&w.data), n, k].to_vec();
    a.extend(w.scale_args());
    let (name, blocks, shared) = product_launch(dev, &w.kernels(), n);
    dev.launch_shared(
        name,
        Shape {
            grid: (blocks, row_blocks(rows, blocks)),
            block: THREADS,
        },
        shared,
        &a,
    )
}

/// Routed products: `y[p] = W_{experts[p]} · x[p / x_div]` for the stack
/// `w` of experts `[n, k]` (`w.rows` = E·n), one launch.
#[allow(clippy::too_many_arguments)]
pub(super) fn gather(
    dev: &Device,
    y: &CudaBuf,
    x: &CudaBuf,
    x_div: usize,
    experts: u64,
    pairs: usize,
    w: &StoredWeights,
    n: usize,
) -> Result<()> {
    let k = w.cols;
    if let Some(f) = fast_kernels(dev, w) {
        let x_rows = x.len() / k;
        let (_rounded, q, d) = round_rows(dev, x, x_rows, k)?;
        let experts_in_stack = w.rows / n.max(1);
        // The tiles' blocks do not loop over outputs.
        if pairs >= GROUP_FROM_PAIRS
            && experts_in_stack <= pairs * GROUP_EXPERTS_PER_PAIR_MAX
            && experts_in_stack <= KQ_GROUP_EXPERTS
            && n.div_ceil(KQM_COLS) <= MAX_GRID
        {
            // order [pairs], tiles [3 · max tiles], the tile count.
            let max_tiles = pairs.div_ceil(KQ_GROUP) + experts_in_stack;
            let tables = dev.alloc::<u32>(pairs + 3 * max_tiles + 1)?;
            let order = tables.ptr();
            let tiles = order + 4 * pairs as u64;
            let ntiles = tiles + 12 * max_tiles as u64;
            dev.launch(
                "kq8_group_pairs",
                Shape {
                    grid: (1, 1),
                    block: 1024,
                },
                args![order, tiles, ntiles, experts, pairs, experts_in_stack],
            )?;
            let grid = Shape {
                grid: (
                    n.div_ceil(KQM_COLS).max(1) as u32,
                    max_tiles.clamp(1, MAX_GRID) as u32,
                ),
                block: 128,
            };
            return dev.launch(
                f.grouped,
                grid,
                args![
                    y.ptr(),
                    q,
                    d,
                    x_div,
                    order,
                    tiles,
                    ntiles,
                    ptr(&w.data),
                    n,
                    k
                ],
            );
        }
        return dev.launch(
            f.gather,
            fast_grid(n, pairs),
            args![y.ptr(), q, d, x_div, experts, pairs, ptr(&w.data), n, k],
        );
    }
    if let Some(f) = fast16_kernels(dev, w) {
        fast16_aligned("gather", x, w)?;
        return dev.launch(
            f.gather,
            Shape {
                grid: (
                    fast16_blocks("gather", n, 1)?,
                    pairs.clamp(1, MAX_GRID) as u32,
                ),
                block: (FAST16_WARPS * 32) as u32,
            },
            args![y.ptr(), x.ptr(), x_div, experts, pairs, ptr(&w.data), n, k],
        );
    }
    let mut a = args![y.ptr(), x.ptr(), x_div, experts, pairs, ptr(&w.data), n, k].to_vec();
    a.extend(w.scale_args());
    dev.launch(
        w.kernels().gather,
        Shape {
            grid: (col_blocks(n), pairs.clamp(1, MAX_GRID) as u32),
            block: THREADS,
        },
        &a,
    )
}

/// Rows `ids[0 .. count]` (device `u32`s at `ids`) of the table `w`,
/// dequantized into `out` (`count · w.cols` values).
pub(super) fn table_rows(
    dev: &Device,
    out: &CudaBuf,
    w: &StoredWeights,
    ids: u64,
    count: usize,
) -> Result<()> {
    let width = w.cols;
    // A thread per (row, unit, lane) and per tail value (`st_table_item`).
    let unit = match w.ty.block_len() {
        1 | 2 => 8,
        b => b,
    };
    let per_row = width / unit * 8 + width % unit;
    let mut a = args![out.ptr(), ptr(&w.data), ids, count, width].to_vec();
    a.extend(w.scale_args());
    dev.launch(w.kernels().table, Shape::elements(count * per_row), &a)
}
