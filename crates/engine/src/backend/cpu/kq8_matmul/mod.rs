//! The fast kernel set's product for the 256-value super-block types
//! (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS) with activations rounded to
//! int8 (`shared/specs/backend.md`, rule 6; [`crate::backend::kernel_set`]),
//! in the style of ggml's `ggml_vec_dot_*_q8_K`.
//!
//! **Activations** ([`quantize_row`], ggml's Q8_K): each row is cut into
//! super-blocks of 256 values, each rounded on its own: `da = amax / 127`,
//! `q_i = round_ties_even(x_i · (1 / da))` clamped to ±127 (the rounding
//! rule of [`super::q8_matmul::quantize_row`], applied to 256 values), and
//! `bsums`, `Σ q` per run of 16. A row's rounding depends on that row
//! alone. Rows whose length is not a multiple of 256 keep the reference
//! product ([`supports`]).
//!
//! **Weights in integer form** (`scalar::decode`, tested against
//! [`crate::quant::dequant`]): each super-block's value `i` is
//! `d · sc[s] · w_i − dmin · m[s]` with `s` its sub-block, `w_i` a small
//! integer and `sc`, `m` integers:
//!
//! | type | sub-block | `w` | `sc` | `m` | `d`, `dmin` |
//! |---|---|---|---|---|---|
//! | Q2_K | 16 | 0..3 | 4-bit | 4-bit | `d`, `dmin` |
//! | Q3_K | 16 | −4..3 | 6-bit − 32 | — | `d` |
//! | Q4_K | 32 | 0..15 | 6-bit | 6-bit | `d`, `dmin` |
//! | Q5_K | 32 | 0..31 | 6-bit | 6-bit | `d`, `dmin` |
//! | Q6_K | 16 | −32..31 | i8 | — | `d` |
//! | IQ2_XXS | 32 | ±{8, 25, 43} | `2·s4 + 1` | — | `d / 8` (exact) |
//!
//! **Arithmetic (the set's definition).** For every output element, over
//! the super-blocks in order, starting from `acc = 0`:
//!
//! - `sumi = Σ_s sc[s] · Σ_{i∈s} w_i · q_i` and `summ = Σ_s m[s] ·
//!   Σ_{i∈s} q_i`, in i32: exact (`|sumi|` < 2³¹ for every type: at most
//!   128 · 16 · 32 · 127 for Q6_K); the kernels may add them in any order
//!   and through any offsets (`u − 32` for Q6_K), integers have one answer;
//! - `acc = fma(d · da, sumi as f32, acc)` (`sumi as f32` rounds to nearest
//!   even, the one conversion every ISA has);
//! - types with minima: `acc = fma(−(dmin · da), summ as f32, acc)`.
//!
//! Every float operation is a single rounded multiply or fused
//! multiply-add in a fixed order, so the bits of an output element are a
//! function of its weight row and activation row alone: the same for every
//! row count, tile, thread split and ISA. [`scalar`] is the model; the
//! AVX2 and AVX-512 VNNI kernels compute the same integers and then
//! exactly its float steps.
//!
//! **Layout.** None of its own: the kernels read the file's blocks in
//! place, one weight row at a time (each row's super-blocks are
//! contiguous; ggml's layout is what its dot products were designed for).
//! So resident memory is the file's pages the products touch, as for the
//! reference, and nothing is repacked at load.

use std::cell::Cell;
use std::sync::Arc;

use super::SendPtr;
use crate::quant::{QuantTensor, WeightType};

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
#[macro_use]
mod simd;
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

pub use quantize::quantize_row;

/// Values per super-block (ggml's `QK_K`).
pub const QK: usize = 256;

/// Activation rows one kernel pass takes over a weight row.
const ROWS: usize = 4;

/// Weight rows per work item of the pool (a work item owns its columns).
const ROWS_PER_ITEM: usize = 16;

/// The kernels this process runs: [`super::q8_matmul`]'s choice (one
/// detection for both fast products, so `DS4_CPU_KERNELS=avx2` forces the
/// baseline here too); every one gives the same bits.
pub use super::q8_matmul::Q8Kernels as KKernels;
pub use super::q8_matmul::kernels;

/// The stored types these kernels cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KFormat {
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq2Xxs,
}

impl KFormat {
    pub fn of(ty: WeightType) -> Option<KFormat> {
        Some(match ty {
            WeightType::Q2_K => KFormat::Q2K,
            WeightType::Q3_K => KFormat::Q3K,
            WeightType::Q4_K => KFormat::Q4K,
            WeightType::Q5_K => KFormat::Q5K,
            WeightType::Q6_K => KFormat::Q6K,
            WeightType::IQ2_XXS => KFormat::Iq2Xxs,
            _ => return None,
        })
    }

    pub fn weight_type(self) -> WeightType {
        match self {
            KFormat::Q2K => WeightType::Q2_K,
            KFormat::Q3K => WeightType::Q3_K,
            KFormat::Q4K => WeightType::Q4_K,
            KFormat::Q5K => WeightType::Q5_K,
            KFormat::Q6K => WeightType::Q6_K,
            KFormat::Iq2Xxs => WeightType::IQ2_XXS,
        }
    }

    /// Bytes of one super-block.
    pub const fn block_bytes(self) -> usize {
        match self {
            KFormat::Q2K => 84,
            KFormat::Q3K => 110,
            KFormat::Q4K => 144,
            KFormat::Q5K => 176,
            KFormat::Q6K => 210,
            KFormat::Iq2Xxs => 66,
        }
    }

    /// Whether the type has sub-block minima (the second float step).
    pub const fn has_min(self) -> bool {
        matches!(self, KFormat::Q2K | KFormat::Q4K | KFormat::Q5K)
    }
}

/// Whether a stored tensor takes these kernels: one of the types, rows of
/// whole super-blocks, no separate scale grid.
pub fn supports(q: &QuantTensor) -> bool {
    KFormat::of(q.ty).is_some()
        && q.cols().is_multiple_of(QK)
        && q.parts.iter().all(|p| p.scales.is_none())
}

/// A stored matrix `[n, k]` of one of these types, read in place.
#[derive(Debug, Clone)]
pub struct KMatrix {
    q: Arc<QuantTensor>,
}

impl KMatrix {
    /// `None` unless [`supports`] and the tensor is a matrix.
    pub fn new(q: Arc<QuantTensor>) -> Option<Self> {
        (supports(&q) && q.dims.len() == 2).then_some(Self { q })
    }

    pub fn rows(&self) -> usize {
        self.q.rows()
    }

    pub fn cols(&self) -> usize {
        self.q.cols()
    }

    /// `y[m, n] = x[m, k] · Wᵀ` on plain row-major slices.
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        matmul_rows(&self.q, 0, self.rows(), x, m, y);
    }
}

/// `y[m, n] = x[m, k] · W[row0 .. row0 + n]ᵀ` for a stored tensor that
/// [`supports`] (an expert's rows of a stack, or a whole matrix), `k` its
/// row length.
pub fn matmul_rows(q: &QuantTensor, row0: usize, n: usize, x: &[f32], m: usize, y: &mut [f32]) {
    let format = KFormat::of(q.ty).expect("a type of these kernels");
    let k = q.cols();
    assert!(supports(q) && row0 + n <= q.rows(), "rows {row0}+{n}");
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(y.len(), m * n, "y must be [m, n]");
    let mut rows = QUANTIZED.take();
    rows.fill(x, m, k);
    let kernels = kernels();
    let w = WeightRows::new(q, row0, n);
    let ptr = SendPtr(y.as_mut_ptr());
    let (act, w, ptr) = (&rows, &w, &ptr);
    candle_core::utils::barrier_pool().execute_chunked(n.div_ceil(ROWS_PER_ITEM), |range| {
        let cols = range.start * ROWS_PER_ITEM..(range.end * ROWS_PER_ITEM).min(n);
        // SAFETY: `y` is `[m, n]` and outlives the call (the pool joins
        // before returning); work items own disjoint column ranges.
        unsafe { run_range(format, kernels, w, act, ptr, cols) };
    });
    QUANTIZED.set(rows);
}

/// The byte rows `row0 .. row0 + n` of a stored tensor's parts.
pub(crate) struct WeightRows<'a> {
    /// `(first row, bytes of its rows)` per part that holds any.
    parts: Vec<(usize, &'a [u8])>,
    row_bytes: usize,
    n: usize,
}

impl<'a> WeightRows<'a> {
    fn new(q: &'a QuantTensor, row0: usize, n: usize) -> Self {
        let row_bytes = q.row_bytes();
        let mut parts = Vec::new();
        let mut base = 0;
        for p in &q.parts {
            let (a, b) = (row0.max(base), (row0 + n).min(base + p.rows));
            if a < b {
                let bytes = &p.data.as_slice()[(a - base) * row_bytes..(b - base) * row_bytes];
                parts.push((a - row0, bytes));
            }
            base += p.rows;
        }
        Self {
            parts,
            row_bytes,
            n,
        }
    }

    /// Row `j` (counted from `row0`).
    fn row(&self, j: usize) -> &'a [u8] {
        let &(first, bytes) = self
            .parts
            .iter()
            .rev()
            .find(|(first, _)| *first <= j)
            .expect("a part holds the row");
        &bytes[(j - first) * self.row_bytes..(j - first + 1) * self.row_bytes]
    }
}

/// Weight rows `cols` times every activation row, into `y` (`[m, n]`,
/// `n = cols of the product`).
///
/// # Safety
/// `y` points at `m · n` writable values whose columns `cols` no other
/// caller writes meanwhile.
unsafe fn run_range(
    format: KFormat,
    kernels: KKernels,
    w: &WeightRows<'_>,
    act: &QuantizedRows,
    y: &SendPtr,
    cols: std::ops::Range<usize>,
) {
    let (m, k) = (act.m, act.k);
    let n = w.n;
    // Activation rows in tiles of about 128 KiB of quants, which stay in
    // L2 while this work item's rows pass over them; no output bit depends
    // on the tiling.
    let tile = (128 * 1024 / k).max(ROWS).min(m.max(1));
    let mut out = [0f32; ROWS];
    for r0 in (0..m).step_by(tile) {
        let tm = tile.min(m - r0);
        for j in cols.clone() {
            let wr = w.row(j);
            let mut r = r0;
            while r < r0 + tm {
                let rows = ROWS.min(r0 + tm - r);
                let a = act.rows(r, rows);
                row(format, kernels, wr, &a, &mut out[..rows]);
                for (i, &v) in out[..rows].iter().enumerate() {
                    // SAFETY: in bounds, and column `j` is written by this
                    // work item only.
                    unsafe { *y.0.add((r + i) * n + j) = v };
                }
                r += rows;
            }
        }
    }
}

/// One weight row times the view's rows with the given kernels (the same
/// bits for each).
fn row(format: KFormat, kernels: KKernels, w: &[u8], a: &RowsView<'_>, out: &mut [f32]) {
    debug_assert!(out.len() == a.rows && w.len() == a.k / QK * format.block_bytes());
    match kernels {
        KKernels::Scalar => scalar::row(format, w, a, out),
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: AVX2/FMA/F16C are the build baseline.
        KKernels::Avx2 => unsafe { avx2::row(format, w, a, out) },
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: `kernels()` picks this only where the CPU has AVX-512
        // F/BW/VL/VNNI.
        KKernels::Avx512Vnni => unsafe { avx512::row(format, w, a, out) },
        #[allow(unreachable_patterns)]
        _ => scalar::row(format, w, a, out),
    }
}

/// Activation rows rounded to int8 super-blocks ([`quantize_row`]).
#[derive(Default)]
pub(crate) struct QuantizedRows {
    m: usize,
    k: usize,
    q: Vec<i8>,
    /// Per row and super-block: `da`.
    d: Vec<f32>,
    /// Per row, super-block and run of 16: `Σ q`.
    bsums: Vec<i16>,
}

/// Up to [`ROWS`] consecutive quantized rows: the kernels' view.
pub(crate) struct RowsView<'a> {
    pub(crate) rows: usize,
    /// `[rows][k]`.
    pub(crate) q: &'a [i8],
    /// `[rows][k / 256]`.
    pub(crate) d: &'a [f32],
    /// `[rows][k / 16]`.
    pub(crate) bsums: &'a [i16],
    pub(crate) k: usize,
}

impl QuantizedRows {
    pub(crate) fn fill(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / QK;
        self.m = m;
        self.k = k;
        self.q.resize(m * k, 0);
        self.d.resize(m * nb, 0.0);
        self.bsums.resize(m * k / 16, 0);
        for r in 0..m {
            quantize_row(
                &x[r * k..(r + 1) * k],
                &mut self.q[r * k..(r + 1) * k],
                &mut self.d[r * nb..(r + 1) * nb],
                &mut self.bsums[r * k / 16..(r + 1) * k / 16],
            );
        }
    }

    pub(crate) fn rows(&self, r: usize, rows: usize) -> RowsView<'_> {
        let nb = self.k / QK;
        RowsView {
            rows,
            q: &self.q[r * self.k..(r + rows) * self.k],
            d: &self.d[r * nb..(r + rows) * nb],
            bsums: &self.bsums[r * self.k / 16..(r + rows) * self.k / 16],
            k: self.k,
        }
    }
}

thread_local! {
    /// The calling thread's quantized activations (no allocation per step).
    static QUANTIZED: Cell<QuantizedRows> = Cell::new(QuantizedRows::default());
}
