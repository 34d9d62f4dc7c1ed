//! The fast kernel set's product for Q4_1 / Q8_0 weights: activations
//! rounded to int8, integer dot products (`shared/specs/backend.md`, rule
//! 6; [`crate::backend::kernel_set`]).
//!
//! **Arithmetic (the set's definition).** Each activation row is cut into
//! blocks of 32 values and each block rounded on its own
//! ([`quantize_row`]): `d = amax / 127`, `q_i = round_ties_even(x_i / d)`
//! computed as `x_i · (1 / d)`, clamped to ±127 (ggml's Q8 semantics, with
//! the scale kept in f32 as ggml's Q8_K keeps it). A row's rounding depends
//! on that row alone. Then for every output element, over the blocks `b`
//! in order, starting from `acc = 0`:
//!
//! - Q8_0 (`w = dw · qw`): `acc = fma(dw · da, Σ qw·q, acc)`
//! - Q4_1 (`w = dw · u + mw`): `acc = fma(dw · da, Σ u·q, acc)`, then
//!   `acc = fma(mw, sa, acc)` with `sa = da · Σ q` (per activation block)
//!
//! The integer sums are exact (at most 32·128·127 < 2²⁴, so their
//! conversion to f32 is exact too) and every float operation is a single
//! rounded multiply or fused multiply-add in a fixed order. So the bits of
//! an output element are a function of its weight row and activation row
//! alone: the same for every row count, tile, thread split and ISA (the
//! scalar kernel in [`scalar`] is the model; the AVX2 and AVX-512 VNNI
//! kernels compute exactly its operations, one output row per vector lane).
//!
//! **Layout.** Weights are repacked at load (same bytes as the file) in
//! groups of [`LANES`] output rows: per group and block, the rows' `d`
//! (and `m`) as f16, and their quants interleaved four bytes per row so
//! that one 64-byte load feeds one `vpdpbusd` (16 rows × 4 values) against
//! four broadcast activation bytes. Q4_1 byte `i` of row `j`'s word in
//! chunk `c` holds values `8c + i` (low nibble) and `8c + 4 + i` (high
//! nibble); Q8_0 chunk `c` holds values `4c .. 4c + 4`.

use std::cell::Cell;

use super::SendPtr;
use super::block_matmul::{BLOCK, BlockFormat, BlockMatrixError};

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
mod quantize;
mod scalar;
#[cfg(test)]
mod tests;

/// Output rows per group (one per lane of a 512-bit vector of i32).
pub const LANES: usize = 16;

/// Activation rows one kernel pass takes over a group's weights (the
/// AVX-512 kernels take up to [`WIDE_ROWS`]: 32 registers hold eight
/// rows' sums beside a block's unpacked weights, which are then unpacked
/// once for eight rows instead of twice).
const ROWS: usize = 4;

/// Rows of one AVX-512 VNNI pass.
const WIDE_ROWS: usize = 8;

/// The integer kernels this process runs: every one gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernels {
    Scalar,
    /// AVX2 `vpmaddubsw` (x86-64-v3, the build baseline).
    Avx2,
    /// AVX-512 VNNI (F, BW, VL and VNNI, detected at run time): `vpdpbusd`
    /// here, 256-bit `vpdpwssd` in [`super::kq8_matmul`].
    Avx512Vnni,
}

/// The widest integer kernels the CPU runs, unless `DS4_CPU_KERNELS=avx2`
/// asks for the baseline (as it does for the f32 kernels).
pub fn kernels() -> Q8Kernels {
    static K: std::sync::OnceLock<Q8Kernels> = std::sync::OnceLock::new();
    *K.get_or_init(|| {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        {
            let wide = super::block_matmul::isa() == super::block_matmul::Isa::Avx512
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("avx512vnni");
            if wide {
                Q8Kernels::Avx512Vnni
            } else {
                Q8Kernels::Avx2
            }
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )))]
        {
            Q8Kernels::Scalar
        }
    })
}

/// Bytes with 64-byte alignment (one group-block of quants starts on a
/// cache line).
#[derive(Clone)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A Q4_1 / Q8_0 matrix `[n, k]` in the integer kernels' layout.
#[derive(Clone)]
pub struct Q8Matrix {
    format: BlockFormat,
    n: usize,
    k: usize,
    /// Per group, per block: `d` of the group's 16 rows (f16 bits), then
    /// (Q4_1) their `m`.
    scales: Box<[u16]>,
    /// Per group, per block: the interleaved quants (`LANES ·
    /// quant_bytes`, a whole number of cache lines).
    quants: Box<[Line]>,
}

impl std::fmt::Debug for Q8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Q8Matrix")
            .field("format", &self.format)
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

/// Bytes of one block's quants (per row).
const fn quant_bytes(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_1 => 16,
        BlockFormat::Q8_0 => 32,
    }
}

/// f16 scales per row and block (`d`, and `m` for Q4_1).
const fn scales_per_block(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_1 => 2,
        BlockFormat::Q8_0 => 1,
    }
}

/// One group of a matrix: the kernels' view.
pub(crate) struct Group<'a> {
    pub(crate) format: BlockFormat,
    pub(crate) blocks: usize,
    /// `[blocks][scales_per_block][LANES]`.
    pub(crate) scales: &'a [u16],
    /// `[blocks][LANES · quant_bytes]`.
    pub(crate) quants: &'a [u8],
}

impl Q8Matrix {
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
        let nb = k / BLOCK;
        let bb = format.block_bytes();
        let want = n * nb * bb;
        if data.len() != want {
            return Err(BlockMatrixError::DataLength {
                format,
                n,
                k,
                got: data.len(),
                want,
            });
        }
        let groups = n.div_ceil(LANES);
        let qb = quant_bytes(format);
        let sb = scales_per_block(format);
        let mut scales = vec![0u16; groups * nb * sb * LANES];
        let lines_per_block = LANES * qb / 64;
        let mut quants = vec![Line([0; 64]); groups * nb * lines_per_block];
        let f16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        for j in 0..n {
            let (g, lane) = (j / LANES, j % LANES);
            for b in 0..nb {
                let block = &data[(j * nb + b) * bb..(j * nb + b + 1) * bb];
                let at = (g * nb + b) * sb * LANES;
                scales[at + lane] = f16_at(block, 0);
                let line0 = (g * nb + b) * lines_per_block;
                let lines = &mut quants[line0..line0 + lines_per_block];
                let mut put = |chunk: usize, i: usize, v: u8| {
                    let byte = chunk * 64 + lane * 4 + i;
                    lines[byte / 64].0[byte % 64] = v;
                };
                match format {
                    BlockFormat::Q4_1 => {
                        scales[at + LANES + lane] = f16_at(block, 2);
                        let qs = &block[4..20];
                        // Value v of the block: low nibbles hold 0..16,
                        // high nibbles 16..32.
                        let value = |v: usize| {
                            if v < 16 {
                                qs[v] & 0x0F
                            } else {
                                qs[v - 16] >> 4
                            }
                        };
                        for c in 0..4 {
                            for i in 0..4 {
                                put(c, i, value(8 * c + i) | (value(8 * c + 4 + i) << 4));
                            }
                        }
                    }
                    BlockFormat::Q8_0 => {
                        let qs = &block[2..34];
                        for c in 0..8 {
                            for i in 0..4 {
                                put(c, i, qs[4 * c + i]);
                            }
                        }
                    }
                }
            }
        }
        Ok(Self {
            format,
            n,
            k,
            scales: scales.into(),
            quants: quants.into(),
        })
    }

    pub fn rows(&self) -> usize {
        self.n
    }

    pub fn cols(&self) -> usize {
        self.k
    }

    pub fn format(&self) -> BlockFormat {
        self.format
    }

    fn groups(&self) -> usize {
        self.n.div_ceil(LANES)
    }

    fn group(&self, g: usize) -> Group<'_> {
        let nb = self.k / BLOCK;
        let ss = nb * scales_per_block(self.format) * LANES;
        let qs = nb * LANES * quant_bytes(self.format);
        // SAFETY: `Line` is 64 plain bytes; the slice covers whole lines.
        let bytes = unsafe {
            std::slice::from_raw_parts(self.quants.as_ptr().cast::<u8>(), self.quants.len() * 64)
        };
        Group {
            format: self.format,
            blocks: nb,
            scales: &self.scales[g * ss..(g + 1) * ss],
            quants: &bytes[g * qs..(g + 1) * qs],
        }
    }

    /// `y[m, n] = x[m, k] · Wᵀ` on plain row-major slices.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        Self::matmul_several(&[self], x, m, &mut [y]);
    }

    /// `ys[i] = x · parts[i]ᵀ` in one pool dispatch, `x` quantized once:
    /// `x` is `[m, k]`, every part `[n_i, k]`, `ys[i]` `[m, n_i]`.
    pub fn matmul_several(parts: &[&Q8Matrix], x: &[f32], m: usize, ys: &mut [&mut [f32]]) {
        Self::matmul_several_with(parts, x, m, ys, &|_| OutputMap::None);
    }

    /// [`Q8Matrix::matmul_several`] with part `i`'s values mapped by
    /// `map_of(i)`, each by the work item that computed it, inside the same
    /// pool dispatch: the values the map gives over the finished product,
    /// without a serial pass after it (the SwiGLU gate's SiLU was 2 % of a
    /// decode step's samples on the leader while the other thread spun).
    pub fn matmul_several_with(
        parts: &[&Q8Matrix],
        x: &[f32],
        m: usize,
        ys: &mut [&mut [f32]],
        map_of: &(dyn Fn(usize) -> OutputMap + Sync),
    ) {
        assert_eq!(parts.len(), ys.len(), "one output per part");
        let Some(k) = parts.first().map(|w| w.k) else {
            return;
        };
        assert_eq!(x.len(), m * k, "x must be [m, k]");
        for (w, y) in parts.iter().zip(ys.iter()) {
            assert_eq!(w.k, k, "the parts share k");
            assert_eq!(y.len(), m * w.n, "y must be [m, n]");
        }
        let mut rows = QUANTIZED.take();
        rows.fill(x, m, k);
        let kernels = kernels();
        let total: usize = parts.iter().map(|w| w.groups()).sum();
        let ptrs: Vec<SendPtr> = ys.iter_mut().map(|y| SendPtr(y.as_mut_ptr())).collect();
        let (act, ptrs) = (&rows, &ptrs);
        candle_core::utils::barrier_pool().execute_chunked(total, |range| {
            let mut start = 0;
            for (i, (w, y)) in parts.iter().zip(ptrs).enumerate() {
                let map = map_of(i);
                let end = start + w.groups();
                let (lo, hi) = (range.start.max(start), range.end.min(end));
                if lo < hi {
                    // SAFETY: `y` is `[m, n]` of this part and outlives the
                    // call (the pool joins before returning); work items
                    // own disjoint group ranges, so disjoint columns.
                    unsafe { w.run_range(kernels, act, y, lo - start..hi - start, map) };
                }
                start = end;
            }
        });
        QUANTIZED.set(rows);
    }

    /// Groups `range` times every activation row, into `y` (`[m, n]`).
    ///
    /// # Safety
    /// `y` points at `m · n` writable values whose columns of these groups
    /// no other caller writes meanwhile.
    unsafe fn run_range(
        &self,
        kernels: Q8Kernels,
        act: &QuantizedRows,
        y: &SendPtr,
        range: std::ops::Range<usize>,
        map: OutputMap,
    ) {
        let m = act.m;
        // Activation rows in tiles of about 128 KiB of quants, which stay
        // in L2 while this work item's groups pass over them. A pass's rows
        // are the kernel's business only: no output bit depends on them.
        let pass = if kernels == Q8Kernels::Avx512Vnni {
            WIDE_ROWS
        } else {
            ROWS
        };
        let tile = (128 * 1024 / self.k).max(pass).min(m.max(1));
        let mut out = [0f32; WIDE_ROWS * LANES];
        for r0 in (0..m).step_by(tile) {
            let tm = tile.min(m - r0);
            for g in range.clone() {
                let group = self.group(g);
                let cols = LANES.min(self.n - g * LANES);
                let mut r = r0;
                while r < r0 + tm {
                    let rows = pass.min(r0 + tm - r);
                    let a = act.rows(r, rows);
                    match kernels {
                        Q8Kernels::Scalar => scalar::group_rows(&group, &a, &mut out),
                        #[cfg(all(
                            target_arch = "x86_64",
                            target_feature = "avx2",
                            target_feature = "fma",
                            target_feature = "f16c"
                        ))]
                        // SAFETY: `kernels()` picks these only where the
                        // build or the CPU has the features.
                        Q8Kernels::Avx2 => unsafe { avx2::group_rows(&group, &a, &mut out) },
                        #[cfg(all(
                            target_arch = "x86_64",
                            target_feature = "avx2",
                            target_feature = "fma",
                            target_feature = "f16c"
                        ))]
                        Q8Kernels::Avx512Vnni => unsafe {
                            avx512::group_rows(&group, &a, &mut out)
                        },
                        #[allow(unreachable_patterns)]
                        _ => scalar::group_rows(&group, &a, &mut out),
                    }
                    for (i, lanes) in out.chunks_exact_mut(LANES).take(rows).enumerate() {
                        map.apply(&mut lanes[..cols]);
                        let dst = (r + i) * self.n + g * LANES;
                        // SAFETY: in bounds, and this group's columns are
                        // written by this work item only. A whole group is
                        // a copy of constant length (vector moves: the
                        // element loop was 3 % of an 8-stream step).
                        unsafe {
                            if cols == LANES {
                                std::ptr::copy_nonoverlapping(lanes.as_ptr(), y.0.add(dst), LANES);
                            } else {
                                std::ptr::copy_nonoverlapping(lanes.as_ptr(), y.0.add(dst), cols);
                            }
                        }
                    }
                    r += rows;
                }
            }
        }
    }
}

/// What [`Q8Matrix::matmul_several_with`] applies to each product value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMap {
    None,
    /// [`crate::backend::cpu::ops::silu`], the value `CpuOps::silu` gives.
    Silu,
}

impl OutputMap {
    #[inline]
    fn apply(self, v: &mut [f32]) {
        match self {
            OutputMap::None => {}
            OutputMap::Silu => v.iter_mut().for_each(|x| *x = super::ops::silu(*x)),
        }
    }
}

/// Activation rows rounded to int8 blocks ([`quantize_row`]).
#[derive(Default)]
pub(crate) struct QuantizedRows {
    m: usize,
    k: usize,
    q: Vec<i8>,
    /// Per row and block: `d`.
    d: Vec<f32>,
    /// Per row and block: `Σ q`.
    qsum: Vec<i32>,
    /// Per row and block: `d · Σ q` (Q4_1's minimum term).
    s: Vec<f32>,
}

/// Up to [`ROWS`] (AVX-512: [`WIDE_ROWS`]) consecutive quantized rows:
/// the kernels' view.
pub(crate) struct RowsView<'a> {
    pub(crate) rows: usize,
    /// `[rows][k]`.
    pub(crate) q: &'a [i8],
    /// `[rows][blocks]` each.
    pub(crate) d: &'a [f32],
    pub(crate) qsum: &'a [i32],
    pub(crate) s: &'a [f32],
    pub(crate) k: usize,
}

impl QuantizedRows {
    fn fill(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / BLOCK;
        self.m = m;
        self.k = k;
        self.q.resize(m * k, 0);
        self.d.resize(m * nb, 0.0);
        self.qsum.resize(m * nb, 0);
        self.s.resize(m * nb, 0.0);
        for r in 0..m {
            quantize_row(
                &x[r * k..(r + 1) * k],
                &mut self.q[r * k..(r + 1) * k],
                &mut self.d[r * nb..(r + 1) * nb],
                &mut self.qsum[r * nb..(r + 1) * nb],
                &mut self.s[r * nb..(r + 1) * nb],
            );
        }
    }

    fn rows(&self, r: usize, rows: usize) -> RowsView<'_> {
        let nb = self.k / BLOCK;
        RowsView {
            rows,
            q: &self.q[r * self.k..(r + rows) * self.k],
            d: &self.d[r * nb..(r + rows) * nb],
            qsum: &self.qsum[r * nb..(r + rows) * nb],
            s: &self.s[r * nb..(r + rows) * nb],
            k: self.k,
        }
    }
}

thread_local! {
    /// The calling thread's quantized activations (no allocation per step).
    static QUANTIZED: Cell<QuantizedRows> = Cell::new(QuantizedRows::default());
}

pub use quantize::{quantize_row, quantize_row_scalar};
