//! Matrix product with block-quantized GGUF weights and f32 activations:
//! `y[m, n] = x[m, k] · W[n, k]ᵀ`, for W in Q4_1 or Q8_0 blocks.
//!
//! candle's quantized matmul rounds the activations to 8 bits per 32-value
//! block (as llama.cpp does) and has no SIMD path at all for Q4_1, the
//! default model's type. Rounding activations is what made greedy decoding
//! drift from the transformers reference on near ties (SmolLM2 has a few
//! very large activation channels, so a block holding one gets a coarse
//! scale). This kernel keeps the activations in f32. A block's weights are
//! `d·u_i + m` (Q4_1) or `d·q_i` (Q8_0), so the product with the
//! dequantized weights factors exactly as
//!
//! `y = Σ_b d_b · (Σ_i u_bi · x_bi) + Σ_b m_b · (Σ_i x_bi)`
//!
//! which is what is computed, in f32: the inner sums use the small integer
//! quants directly (no per-weight scale arithmetic), and the block sums of
//! `x` are computed once per activation row and shared by every weight row.
//! The result equals dequantized weights times activations up to f32
//! rounding of the additions.
//!
//! Bit-exactness across paths is a contract: an output element is computed
//! by the same operations in the same order whether it comes from a decode
//! step (one activation row: quants are unpacked straight into registers)
//! or from a prefill window (quants are unpacked once into an L1 buffer and
//! reused for every row). So a prompt prefilled in one window, in chunks or
//! token by token gives identical bits, and warm turns equal cold ones.
//!
//! The GGUF blocks are repacked at load into separate arrays of scales,
//! minima and quants (same bytes in total), so scales convert eight at a
//! time and quants load aligned to their block. Work is split over groups
//! of output rows on candle's persistent CPU pool, so this op uses the same
//! threads as every other candle op.

use std::cell::RefCell;
use std::sync::Arc;

use super::SendPtr;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape};

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx2;
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx512;
#[cfg_attr(
    all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ),
    allow(dead_code)
)]
mod portable;
mod several;

/// Which kernels this process runs. One process uses one set for every
/// matrix, so results never mix summation orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust (no AVX2 at build time).
    Portable,
    /// AVX2 + FMA + F16C (the build baseline, x86-64-v3).
    Avx2,
    /// AVX-512F, detected at run time.
    Avx512,
}

/// The kernels in use: the widest the CPU has, unless the environment
/// variable `DS4_CPU_KERNELS=avx2` asks for the baseline (for example to
/// reproduce, bit for bit, results from a machine without AVX-512).
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let wanted = std::env::var("DS4_CPU_KERNELS").unwrap_or_default();
        detect(wanted.trim())
    })
}

fn detect(wanted: &str) -> Isa {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        if wanted != "avx2" && std::arch::is_x86_feature_detected!("avx512f") {
            Isa::Avx512
        } else {
            Isa::Avx2
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    {
        let _ = wanted;
        Isa::Portable
    }
}

/// Values per block (both formats).
pub const BLOCK: usize = 32;

/// The block formats this kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFormat {
    /// 20 bytes: `d: f16, m: f16, qs: [u8; 16]`; value `i` is `d·u_i + m`
    /// with `u_i` the low nibble of `qs[i]` for `i < 16`, else the high
    /// nibble of `qs[i - 16]`.
    Q4_1,
    /// 34 bytes: `d: f16, qs: [i8; 32]`; value `i` is `d·qs[i]`.
    Q8_0,
}

impl BlockFormat {
    /// Bytes of one block as stored in GGUF.
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q8_0 => 34,
        }
    }

    /// Bytes of one block's quants.
    const fn quant_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 16,
            BlockFormat::Q8_0 => 32,
        }
    }

    const fn has_min(self) -> bool {
        matches!(self, BlockFormat::Q4_1)
    }
}

/// A block-quantized weight matrix `[n, k]`, repacked by field.
#[derive(Debug, Clone)]
pub struct BlockMatrix {
    format: BlockFormat,
    n: usize,
    k: usize,
    /// `d` of every block as f16 bits, interleaved by row group: group `g`
    /// (rows `4g ..`, `cols` of them) holds `[k / 32, cols]` — block `b` of
    /// each of its rows in turn, so decode reads one sequential stream.
    scales: Arc<[u16]>,
    /// `m` of every block (Q4_1) as f16 bits, row-major `[n, k / 32]` (it
    /// is read once per row); empty for Q8_0.
    mins: Arc<[u16]>,
    /// Quants, interleaved like `scales`: `[k / 32, cols, quant_bytes]` per
    /// group.
    quants: Arc<[u8]>,
}

#[derive(Debug, thiserror::Error)]
pub enum BlockMatrixError {
    #[error("{format:?} rows of {k} values are not a multiple of {BLOCK}")]
    RowLength { format: BlockFormat, k: usize },
    #[error("{format:?} data holds {got} bytes, a [{n}, {k}] matrix needs {want}")]
    DataLength {
        format: BlockFormat,
        n: usize,
        k: usize,
        got: usize,
        want: usize,
    },
}

/// One row group of a matrix (rows `j0 .. j0 + cols`): the kernels' view.
pub(crate) struct RowGroup<'a> {
    format: BlockFormat,
    k: usize,
    cols: usize,
    scales: &'a [u16],
    mins: &'a [u16],
    quants: &'a [u8],
}

impl RowGroup<'_> {
    /// Minima of row `c` of the group (empty for formats without them).
    fn mins_of(&self, c: usize) -> &[u16] {
        let nb = self.k / BLOCK;
        if self.format.has_min() {
            &self.mins[c * nb..(c + 1) * nb]
        } else {
            &[]
        }
    }
}

/// Per-thread buffers: scales as f32 and, for prefill, unpacked quants.
#[derive(Default)]
pub(crate) struct GroupScratch {
    scales: Vec<f32>,
    weights: Vec<f32>,
    /// One row group's results for every activation row.
    out: Vec<f32>,
}

impl GroupScratch {
    #[cfg_attr(
        not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )),
        allow(dead_code)
    )]
    fn buffers(&mut self, scales: usize, weights: usize) -> (&mut [f32], &mut [f32]) {
        if self.scales.len() < scales {
            self.scales.resize(scales, 0.0);
        }
        if self.weights.len() < weights {
            self.weights.resize(weights, 0.0);
        }
        (&mut self.scales[..scales], &mut self.weights[..weights])
    }
}

thread_local! {
    static SCRATCH: RefCell<GroupScratch> = RefCell::new(GroupScratch::default());
    /// Block sums of the activations of the current call (no allocation
    /// per decode step).
    static BLOCK_SUMS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Output rows computed together: each activation block is loaded once for
/// all of them.
const COLUMNS: usize = 4;

/// Up to this many activation rows (a decode step or an MTP verify
/// window), quants are unpacked in registers and shared by the rows the
/// registers hold; beyond (prefill), once into a buffer shared by all rows.
#[cfg_attr(
    not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )),
    allow(dead_code)
)]
const FUSED_MAX_ROWS: usize = 4;

impl BlockMatrix {
    /// `data`: `n` rows of `k / 32` blocks each, as stored in GGUF.
    pub fn new(
        data: &[u8],
        format: BlockFormat,
        n: usize,
        k: usize,
    ) -> Result<Self, BlockMatrixError> {
        if !k.is_multiple_of(BLOCK) {
            return Err(BlockMatrixError::RowLength { format, k });
        }
        let blocks = n * (k / BLOCK);
        let want = blocks * format.block_bytes();
        if data.len() != want {
            return Err(BlockMatrixError::DataLength {
                format,
                n,
                k,
                got: data.len(),
                want,
            });
        }
        let nb = k / BLOCK;
        let bb = format.block_bytes();
        let f16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        Ok(Self::pack(format, n, k, |j, b| {
            let block = &data[(j * nb + b) * bb..(j * nb + b + 1) * bb];
            match format {
                BlockFormat::Q4_1 => (f16_at(block, 0), f16_at(block, 2), &block[4..20]),
                BlockFormat::Q8_0 => (f16_at(block, 0), 0, &block[2..34]),
            }
        }))
    }

    /// Lay out the blocks `block(j, b) = (d, m, quants)` in this type's
    /// interleaved order.
    fn pack<'a>(
        format: BlockFormat,
        n: usize,
        k: usize,
        block: impl Fn(usize, usize) -> (u16, u16, &'a [u8]),
    ) -> Self {
        let nb = k / BLOCK;
        let blocks = n * nb;
        let mut scales = Vec::with_capacity(blocks);
        let mut mins = Vec::with_capacity(if format.has_min() { blocks } else { 0 });
        let mut quants = Vec::with_capacity(blocks * format.quant_bytes());
        for j0 in (0..n).step_by(COLUMNS) {
            let cols = COLUMNS.min(n - j0);
            for b in 0..nb {
                for c in 0..cols {
                    let (d, _, q) = block(j0 + c, b);
                    scales.push(d);
                    quants.extend_from_slice(q);
                }
            }
        }
        if format.has_min() {
            for j in 0..n {
                for b in 0..nb {
                    mins.push(block(j, b).1);
                }
            }
        }
        Self {
            format,
            n,
            k,
            scales: scales.into(),
            mins: mins.into(),
            quants: quants.into(),
        }
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    /// The row group starting at row `j0` (a multiple of [`COLUMNS`]).
    fn group(&self, j0: usize) -> RowGroup<'_> {
        let nb = self.k / BLOCK;
        let cols = COLUMNS.min(self.n - j0);
        let qb = self.format.quant_bytes();
        let mins = if self.format.has_min() {
            &self.mins[j0 * nb..(j0 + cols) * nb]
        } else {
            &self.mins[..0]
        };
        RowGroup {
            format: self.format,
            k: self.k,
            cols,
            scales: &self.scales[j0 * nb..(j0 + cols) * nb],
            mins,
            quants: &self.quants[j0 * nb * qb..(j0 + cols) * nb * qb],
        }
    }

    /// `y[m, n] = x[m, k] · Wᵀ` on plain row-major slices.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        self.matmul_with(isa(), x, m, y)
    }

    fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(x.len(), m * self.k, "x must be [m, k]");
        assert_eq!(y.len(), m * self.n, "y must be [m, n]");
        // The calling thread's buffer, taken out for the call: the pool
        // runs part of the work on this thread, which borrows `SCRATCH`.
        let mut sx = BLOCK_SUMS.take();
        sx.clear();
        sx.resize(m * (self.k / BLOCK), 0.0);
        block_sums(x, &mut sx);
        self.run_groups(isa, x, &sx, m, y);
        BLOCK_SUMS.set(sx);
    }

    /// Activation rows per tile: about 256 KiB of them (a tile is read
    /// once per row group), and never fewer than the register-fused path
    /// takes, so decode and verify windows run untiled.
    fn row_tile(&self, m: usize) -> usize {
        const TILE_FLOATS: usize = 64 * 1024;
        (TILE_FLOATS / self.k).max(2 * FUSED_MAX_ROWS).min(m.max(1))
    }

    fn run_groups(&self, isa: Isa, x: &[f32], sx: &[f32], m: usize, y: &mut [f32]) {
        let y_ptr = SendPtr(y.as_mut_ptr());
        let groups = self.n.div_ceil(COLUMNS);
        // Each work item owns a range of row groups, so no two workers
        // write the same element of `y`.
        candle_core::utils::barrier_pool().execute_chunked(groups, |range| {
            // SAFETY: `y` is `[m, n]` and outlives the call (the pool joins
            // before returning); the ranges are disjoint.
            unsafe { self.run_range(isa, x, sx, m, &y_ptr, range) }
        });
    }

    /// Row groups `range` of this matrix times the `m` rows of `x`, into
    /// `y` (`[m, n]`).
    ///
    /// # Safety
    /// `y` points at `m · n` writable values that no other caller writes
    /// in these groups' columns meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_range(
        &self,
        isa: Isa,
        x: &[f32],
        sx: &[f32],
        m: usize,
        y: &SendPtr,
        range: std::ops::Range<usize>,
    ) {
        let (n, k, nb) = (self.n, self.k, self.k / BLOCK);
        SCRATCH.with(|scratch| {
            let scratch = &mut *scratch.borrow_mut();
            let mut out = std::mem::take(&mut scratch.out);
            let tile = self.row_tile(m);
            out.resize(tile * COLUMNS, 0.0);
            // Activation rows in tiles that stay in the core's L2 while
            // every row group of this work item passes over them (a
            // group's quants are unpacked again per tile). The rows of
            // a tile are the kernels' `m`: an output element's
            // operations do not depend on it, so tiling changes no bit.
            for r0 in (0..m).step_by(tile) {
                let tm = tile.min(m - r0);
                let (xt, st) = (&x[r0 * k..(r0 + tm) * k], &sx[r0 * nb..(r0 + tm) * nb]);
                for group in range.clone() {
                    let j0 = group * COLUMNS;
                    let cols = COLUMNS.min(n - j0);
                    let out = &mut out[..tm * cols];
                    self.group_times(isa, j0, cols, xt, st, tm, scratch, out);
                    for (r, row) in out.chunks_exact(cols).enumerate() {
                        // SAFETY: (r0 + r, j0 .. j0 + cols) is in bounds and
                        // written only by this group.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                row.as_ptr(),
                                y.0.add((r0 + r) * n + j0),
                                cols,
                            )
                        };
                    }
                }
            }
            scratch.out = out;
        });
    }

    /// Rows `j0 .. j0 + cols` times all `m` activation rows:
    /// `out[r * cols + c]`.
    #[allow(clippy::too_many_arguments)]
    fn group_times(
        &self,
        isa: Isa,
        j0: usize,
        cols: usize,
        x: &[f32],
        sx: &[f32],
        m: usize,
        scratch: &mut GroupScratch,
        out: &mut [f32],
    ) {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        {
            use avx2::{Q4, Q8};
            let fused = m <= FUSED_MAX_ROWS;
            let g = self.group(j0);
            debug_assert_eq!(g.cols, cols);
            // One monomorphised kernel per (format, group width).
            macro_rules! dispatch {
                ($kernels:ident) => {
                    match (self.format, cols) {
                        (BlockFormat::Q4_1, 4) => {
                            $kernels::rows::<4, Q4>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q4_1, 3) => {
                            $kernels::rows::<3, Q4>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q4_1, 2) => {
                            $kernels::rows::<2, Q4>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q4_1, _) => {
                            $kernels::rows::<1, Q4>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q8_0, 4) => {
                            $kernels::rows::<4, Q8>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q8_0, 3) => {
                            $kernels::rows::<3, Q8>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q8_0, 2) => {
                            $kernels::rows::<2, Q8>(&g, x, sx, m, fused, scratch, out)
                        }
                        (BlockFormat::Q8_0, _) => {
                            $kernels::rows::<1, Q8>(&g, x, sx, m, fused, scratch, out)
                        }
                    }
                };
            }
            // SAFETY: the cfg guarantees AVX2/FMA/F16C and `isa()` picks
            // AVX-512 only when the CPU reports it; `g` holds `cols`
            // rows of this matrix's format, `x`/`sx` hold `m` rows and `out`
            // `m * cols` values.
            unsafe {
                if isa == Isa::Avx512 {
                    dispatch!(avx512)
                } else {
                    dispatch!(avx2)
                }
            }
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )))]
        {
            let _ = (isa, cols);
            portable::rows(&self.group(j0), x, sx, m, scratch, out);
        }
    }
}

fn block_sums(x: &[f32], sums: &mut [f32]) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    // SAFETY: the cfg guarantees the features at compile time.
    unsafe {
        avx2::block_sums(x, sums)
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    portable::block_sums(x, sums)
}

/// The candle op: `x [.., k]` (f32, contiguous) → `y [.., n]`.
impl CustomOp1 for BlockMatrix {
    fn name(&self) -> &'static str {
        "block-quantized-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("block-quantized-matmul expects f32 activations");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("block-quantized-matmul expects contiguous activations");
        };
        let dims = layout.shape().dims();
        let Some((&k, outer)) = dims.split_last() else {
            candle_core::bail!("block-quantized-matmul expects at least one dimension");
        };
        if k != self.k {
            candle_core::bail!(
                "block-quantized-matmul: activations have {k} columns, weights {}",
                self.k
            );
        }
        let m: usize = outer.iter().product();
        let mut y = vec![0f32; m * self.n];
        self.matmul(&data[start..end], m, &mut y);
        let mut out_dims = outer.to_vec();
        out_dims.push(self.n);
        Ok((CpuStorage::F32(y), Shape::from(out_dims)))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;

    /// Every kernel set this CPU can run.
    fn isas() -> Vec<Isa> {
        let mut all = vec![detect("avx2")];
        if detect("") != all[0] {
            all.push(detect(""));
        }
        all
    }

    fn random(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn quantized(format: BlockFormat, n: usize, k: usize, seed: u64) -> (QTensor, BlockMatrix) {
        let w = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu).unwrap();
        let dtype = match format {
            BlockFormat::Q4_1 => GgmlDType::Q4_1,
            BlockFormat::Q8_0 => GgmlDType::Q8_0,
        };
        let q = QTensor::quantize(&w, dtype).unwrap();
        let ours = BlockMatrix::new(&q.data().unwrap(), format, n, k).unwrap();
        (q, ours)
    }

    /// Block `b` of row `j`: `(d, m, quants)` (`m` is 0 for Q8_0).
    fn block(w: &BlockMatrix, j: usize, b: usize) -> (u16, u16, &[u8]) {
        let nb = w.k / BLOCK;
        let j0 = j - j % COLUMNS;
        let cols = COLUMNS.min(w.n - j0);
        let at = j0 * nb + b * cols + (j - j0);
        let qb = w.format.quant_bytes();
        let m = if w.format.has_min() {
            w.mins[j * nb + b]
        } else {
            0
        };
        (w.scales[at], m, &w.quants[at * qb..(at + 1) * qb])
    }

    /// Several matrices in one pool dispatch (`matmul_several`) give each
    /// part the bits of its own `matmul`, for decode rows, verify windows
    /// and tiled prefill rows alike, and write every value of every part.
    #[test]
    fn several_in_one_dispatch_are_each_product_alone() {
        let k = 576;
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            // Widths off the group size, and a one-row part.
            let parts: Vec<BlockMatrix> = [576, 190, 7, 1]
                .iter()
                .enumerate()
                .map(|(i, &n)| quantized(format, n, k, 40 + i as u64).1)
                .collect();
            let refs: Vec<&BlockMatrix> = parts.iter().collect();
            for m in [1, 2, 3, 4, 9, 300] {
                let x = random(m * k, 7 + m as u64);
                let mut ys: Vec<Vec<f32>> = parts.iter().map(|w| vec![f32::NAN; m * w.n]).collect();
                let mut views: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
                BlockMatrix::matmul_several(&refs, &x, m, &mut views);
                for (i, (w, y)) in parts.iter().zip(&ys).enumerate() {
                    let mut alone = vec![0.0; m * w.n];
                    w.matmul(&x, m, &mut alone);
                    let same = y
                        .iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{format:?} part {i} ({} rows), m = {m}", w.n);
                }
            }
        }
    }

    /// candle's dequantization of `q`, flattened.
    fn dequantized(q: &QTensor) -> Vec<f32> {
        let t = q.dequantize(&Device::Cpu).unwrap();
        t.flatten_all().unwrap().to_vec1().unwrap()
    }

    /// Weight `(j, i)` from the repacked fields, as dequantization computes it.
    fn weight(w: &BlockMatrix, j: usize, i: usize) -> f32 {
        let (d, m, q) = block(w, j, i / BLOCK);
        let (d, i) = (half::f16::from_bits(d).to_f32(), i % BLOCK);
        match w.format {
            BlockFormat::Q4_1 => {
                let u = if i < 16 { q[i] & 0x0F } else { q[i - 16] >> 4 };
                d * u as f32 + half::f16::from_bits(m).to_f32()
            }
            BlockFormat::Q8_0 => d * (q[i] as i8) as f32,
        }
    }

    #[test]
    fn repacked_fields_reproduce_dequantization_bit_for_bit() {
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            let (n, k) = (7, 96);
            let (q, w) = quantized(format, n, k, 11);
            let dense = dequantized(&q);
            for j in 0..n {
                let row: Vec<f32> = (0..k).map(|i| weight(&w, j, i)).collect();
                assert_eq!(row, dense[j * k..(j + 1) * k], "{format:?} row {j}");
            }
        }
    }

    #[test]
    fn decode_and_prefill_paths_agree_bit_for_bit() {
        for (isa, format) in isas()
            .into_iter()
            .flat_map(|i| [(i, BlockFormat::Q4_1), (i, BlockFormat::Q8_0)])
        {
            // n = 38: full row groups and a partial one.
            let (n, k, m) = (38, 320, 6);
            let (_, w) = quantized(format, n, k, 21);
            let x = random(m * k, 22);
            let mut window = vec![0f32; m * n];
            w.matmul_with(isa, &x, m, &mut window);
            for r in 0..m {
                let mut step = vec![0f32; n];
                w.matmul_with(isa, &x[r * k..(r + 1) * k], 1, &mut step);
                let same = step
                    .iter()
                    .zip(&window[r * n..(r + 1) * n])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{format:?} row {r}: one-row and window results differ"
                );
            }
            for split in 1..m {
                let mut parts = vec![0f32; m * n];
                let (a, b) = parts.split_at_mut(split * n);
                w.matmul_with(isa, &x[..split * k], split, a);
                w.matmul_with(isa, &x[split * k..], m - split, b);
                assert!(
                    parts
                        .iter()
                        .zip(&window)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{isa:?} {format:?} split at {split}"
                );
            }
        }
    }

    #[test]
    fn row_tiles_change_no_bit() {
        // k = 8192: tiles of 8 rows, so 21 rows run as 8 + 8 + 5 (buffer
        // path) and 19 rows end in a 3-row register-fused tile.
        for (isa, format) in isas()
            .into_iter()
            .flat_map(|i| [(i, BlockFormat::Q4_1), (i, BlockFormat::Q8_0)])
        {
            let (n, k) = (9, 8192);
            let (_, w) = quantized(format, n, k, 31);
            assert_eq!(w.row_tile(21), 8);
            for m in [19, 21] {
                let x = random(m * k, 32 + m as u64);
                let mut window = vec![0f32; m * n];
                w.matmul_with(isa, &x, m, &mut window);
                for r in 0..m {
                    let mut step = vec![0f32; n];
                    w.matmul_with(isa, &x[r * k..(r + 1) * k], 1, &mut step);
                    assert!(
                        step.iter()
                            .zip(&window[r * n..(r + 1) * n])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} {format:?} m={m} row {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn equals_dequantized_matmul_in_f64() {
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            // n = 37 leaves a partial column group; m covers decode and prefill.
            let (n, k) = (37, 256);
            let (q, w) = quantized(format, n, k, 3);
            let dense = dequantized(&q);
            for (isa, m) in isas().into_iter().flat_map(|i| [(i, 1), (i, 2), (i, 5)]) {
                let x = random(m * k, 4 + m as u64);
                let mut got = vec![0f32; m * n];
                w.matmul_with(isa, &x, m, &mut got);
                for r in 0..m {
                    for j in 0..n {
                        let exact: f64 = (0..k)
                            .map(|i| dense[j * k + i] as f64 * x[r * k + i] as f64)
                            .sum();
                        // Only f32 rounding of 256 products and their sum:
                        // |error| <= k·eps·Σ|w·x| ≈ 256 · 6e-8 · 64 ≈ 1e-3
                        // in the worst case, ~1e-5 in practice.
                        let g = got[r * n + j] as f64;
                        assert!(
                            (g - exact).abs() < 1e-4,
                            "{isa:?} {format:?} m={m} ({r},{j}): {g} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn custom_op_keeps_leading_dims() {
        let (n, k) = (8, 64);
        let (_, w) = quantized(BlockFormat::Q4_1, n, k, 5);
        let x = Tensor::from_vec(random(2 * 3 * k, 6), (2, 3, k), &Device::Cpu).unwrap();
        let y = x.apply_op1_no_bwd(&w).unwrap();
        assert_eq!(y.dims(), &[2, 3, n]);
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(matches!(
            BlockMatrix::new(&[0u8; 20], BlockFormat::Q4_1, 1, 30),
            Err(BlockMatrixError::RowLength { .. })
        ));
        assert!(matches!(
            BlockMatrix::new(&[0u8; 33], BlockFormat::Q8_0, 1, 32),
            Err(BlockMatrixError::DataLength { .. })
        ));
    }
}
