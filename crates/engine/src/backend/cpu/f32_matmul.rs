//! Row-independent f32 matmul, `y[m, n] = x[m, k] · wᵀ` with `w: [n, k]`
//! row-major (a linear layer's weight as stored).
//!
//! Every output element `y[r, j]` is one fixed sequence of operations over
//! `x[r]` and `w[j]`, whatever `m` is, whichever tile or thread computes it
//! ([`dot`] spells the sequence out in scalar code):
//!
//! ```text
//! acc_l = 0                                   l = 0..8
//! acc_l = fma(w[8c + l], x[8c + l], acc_l)    c = 0 .. ⌊k/8⌋, in order
//! s     = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
//! s     = fma(w[i], x[i], s)                  i = 8⌊k/8⌋ .. k, in order
//! ```
//!
//! So a token's projection has the same bits whether it runs in a decode
//! step, a verify window or any prefill chunk — the property that makes a
//! warm turn equal a cold one (candle's GEMM changes its blocking, and with
//! it the summation order, with the row count).
//!
//! Speed comes from tiling, not from reordering: the AVX2 kernel computes
//! an `R × C` tile (`R` activation rows × `C` weight rows) with one 8-lane
//! accumulator per pair, so each weight vector loaded feeds `R` FMAs and
//! each activation vector `C`, and every pair still sees exactly the
//! sequence above. Decode (`R = 1`) uses 8 weight rows per tile (8
//! independent FMA chains); prefill uses 4 × 3 tiles (12 accumulators and 4
//! loads per 12 FMAs, within the 16 ymm registers). Large products are
//! split over strips of weight rows on candle's barrier pool; a strip is
//! the same code whichever thread runs it.

/// Weight rows per work item (a multiple of every tile width used).
const STRIP: usize = 24;

/// Below this many multiply-adds (~0.1 ms of one core) a product runs on
/// the calling thread: a pool dispatch costs microseconds when the workers
/// are idle and far more when they are descheduled (measured on a loaded
/// 2-core box: a 192-token prefill of the tiny fixture went from ~17K to
/// ~6K tok/s with the threshold at 2¹⁸).
const PARALLEL_MIN: usize = 1 << 20;

/// One output element: the fixed sequence of the module docs.
#[inline]
pub fn dot(w: &[f32], x: &[f32]) -> f32 {
    let k = w.len();
    debug_assert_eq!(x.len(), k);
    let k8 = k / 8 * 8;
    let mut acc = [0f32; 8];
    for (wc, xc) in w[..k8].chunks_exact(8).zip(x[..k8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = wc[l].mul_add(xc[l], acc[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for i in k8..k {
        s = w[i].mul_add(x[i], s);
    }
    s
}

/// A raw output pointer shared by work items that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every work item writes its own columns of `y` only, and the
// pool joins all items before `matmul` returns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Through a method, so closures capture the whole (`Sync`) wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `y[m, n] = x[m, k] · wᵀ`, `w: [n, k]`, all row-major.
pub fn matmul(x: &[f32], m: usize, w: &[f32], n: usize, k: usize, y: &mut [f32]) {
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(w.len(), n * k, "w must be [n, k]");
    assert_eq!(y.len(), m * n, "y must be [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    let out = OutPtr(y.as_mut_ptr());
    let strips = n.div_ceil(STRIP);
    if m * n * k < PARALLEL_MIN || strips < 2 {
        // SAFETY: y holds m·n values; columns 0..n.
        unsafe { columns(x, m, w, k, 0, n, out.0, n) };
        return;
    }
    candle_core::utils::barrier_pool().execute_chunked(strips, |range| {
        let (j0, j1) = (range.start * STRIP, (range.end * STRIP).min(n));
        // SAFETY: y holds m·n values; this item owns columns j0..j1.
        unsafe { columns(x, m, w, k, j0, j1, out.get(), n) };
    });
}

/// `y[m, n] = x[m, k] · wᵀ` where the rows of `w` are produced a strip at
/// a time by `fill(j0, j1, out)` (rows `j0..j1`, `(j1 − j0) · k` values):
/// a stored weight dequantized on the fly. Each strip runs the same tiles
/// as [`matmul`], so every element has the bits of `matmul` over the filled
/// matrix, and no more than a strip of f32 rows exists per thread.
pub fn matmul_filled(
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    y: &mut [f32],
    fill: &(dyn Fn(usize, usize, &mut [f32]) + Sync),
) {
    assert_eq!(x.len(), m * k, "x must be [m, k]");
    assert_eq!(y.len(), m * n, "y must be [m, n]");
    if m == 0 || n == 0 {
        return;
    }
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let out = OutPtr(y.as_mut_ptr());
    let strip = |s: usize, out: OutPtr| {
        let (j0, j1) = (s * STRIP, ((s + 1) * STRIP).min(n));
        SCRATCH.with_borrow_mut(|w| {
            w.resize((j1 - j0) * k, 0.0);
            fill(j0, j1, w);
            // SAFETY: y holds m·n values; this strip owns columns j0..j1,
            // addressed from column j0 with the full row stride n.
            unsafe { columns(x, m, w, k, 0, j1 - j0, out.get().add(j0), n) };
        });
    };
    let strips = n.div_ceil(STRIP);
    if m * n * k < PARALLEL_MIN || strips < 2 {
        (0..strips).for_each(|s| strip(s, out));
        return;
    }
    candle_core::utils::barrier_pool().execute_chunked(strips, |range| {
        range.for_each(|s| strip(s, out));
    });
}

/// Columns `j0..j1` of `y` (row stride `ldy`).
///
/// # Safety
/// `y` points at `m` rows of `ldy ≥ j1` values; nothing else writes those
/// columns meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn columns(
    x: &[f32],
    m: usize,
    w: &[f32],
    k: usize,
    j0: usize,
    j1: usize,
    y: *mut f32,
    ldy: usize,
) {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        // SAFETY: forwarded from the caller; the features are compiled in.
        unsafe { avx2::columns(x, m, w, k, j0, j1, y, ldy) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    {
        for r in 0..m {
            let xr = &x[r * k..(r + 1) * k];
            for j in j0..j1 {
                // SAFETY: (r, j) is inside y and owned by this call.
                unsafe { *y.add(r * ldy + j) = dot(&w[j * k..(j + 1) * k], xr) };
            }
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::STRIP;

    /// Activation rows per prefill tile.
    const ROWS: usize = 4;

    /// Weight rows per tile for a tile of `rows` activation rows: 8
    /// accumulators or more per tile, at most 12 (registers).
    fn width(rows: usize) -> usize {
        match rows {
            1 => 8,
            2 => 6,
            3 => 4,
            _ => 3,
        }
    }

    /// `((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))`, as [`super::dot`].
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// An `R × C` tile: `y[r·ldy + c] = dot(w[c·k..], x[r·k..])`.
    ///
    /// # Safety
    /// `x` holds `R` rows of `k`, `w` holds `C` rows of `k`, `y` has room
    /// for `R` rows of stride `ldy` from its start, `C` values each.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const C: usize>(
        x: *const f32,
        w: *const f32,
        k: usize,
        y: *mut f32,
        ldy: usize,
    ) {
        let k8 = k / 8 * 8;
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut i = 0;
        while i < k8 {
            // SAFETY: i + 8 <= k8 <= k inside every row.
            let wv: [__m256; C] =
                std::array::from_fn(|c| unsafe { _mm256_loadu_ps(w.add(c * k + i)) });
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: as above.
                let xv = unsafe { _mm256_loadu_ps(x.add(r * k + i)) };
                for (a, wc) in row.iter_mut().zip(wv) {
                    *a = _mm256_fmadd_ps(wc, xv, *a);
                }
            }
            i += 8;
        }
        for (r, row) in acc.into_iter().enumerate() {
            for (c, a) in row.into_iter().enumerate() {
                let mut s = hsum(a);
                for t in k8..k {
                    // SAFETY: t < k inside both rows.
                    s = unsafe { (*w.add(c * k + t)).mul_add(*x.add(r * k + t), s) };
                }
                // SAFETY: the caller guarantees room for the tile.
                unsafe { *y.add(r * ldy + c) = s };
            }
        }
    }

    /// [`tile`] for a runtime shape (`rows ≤ 4`, `cols ≤ width(rows)`).
    ///
    /// # Safety
    /// As [`tile`] with `R = rows`, `C = cols`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_dyn(
        rows: usize,
        cols: usize,
        x: *const f32,
        w: *const f32,
        k: usize,
        y: *mut f32,
        ldy: usize,
    ) {
        macro_rules! by_cols {
            ($r:literal, $($c:literal)*) => {
                match cols {
                    // SAFETY: forwarded from the caller.
                    $($c => unsafe { tile::<$r, $c>(x, w, k, y, ldy) },)*
                    _ => unreachable!("tile of {rows}x{cols}"),
                }
            };
        }
        match rows {
            1 => by_cols!(1, 1 2 3 4 5 6 7 8),
            2 => by_cols!(2, 1 2 3 4 5 6),
            3 => by_cols!(3, 1 2 3 4),
            4 => by_cols!(4, 1 2 3),
            _ => unreachable!("tile of {rows} rows"),
        }
    }

    /// Columns `j0..j1` of `y`: strips of [`STRIP`] weight rows, each
    /// walked by tiles of every activation row.
    ///
    /// # Safety
    /// As [`super::columns`].
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn columns(
        x: &[f32],
        m: usize,
        w: &[f32],
        k: usize,
        j0: usize,
        j1: usize,
        y: *mut f32,
        ldy: usize,
    ) {
        debug_assert!(x.len() >= m * k && w.len() >= j1 * k);
        let mut j = j0;
        while j < j1 {
            let strip = STRIP.min(j1 - j);
            let mut r = 0;
            while r < m {
                let rows = ROWS.min(m - r);
                let width = width(rows);
                let mut c = 0;
                while c < strip {
                    let cols = width.min(strip - c);
                    // SAFETY: rows r..r+rows of x, weight rows j+c..j+c+cols,
                    // and that block of y are in bounds.
                    unsafe {
                        tile_dyn(
                            rows,
                            cols,
                            x.as_ptr().add(r * k),
                            w.as_ptr().add((j + c) * k),
                            k,
                            y.add(r * ldy + j + c),
                            ldy,
                        )
                    };
                    c += cols;
                }
                r += rows;
            }
            j += strip;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: f32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32) * 0.7311 + seed).sin() * (1.0 + (i % 7) as f32))
            .collect()
    }

    fn mm(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        matmul(x, m, w, n, k, &mut y);
        y
    }

    /// Every row of every window (1, 2, 3, 8, 9, 33 rows, at every start
    /// offset of a 40-row sequence) has the bits of that row computed
    /// alone, and of the scalar [`dot`]. Shapes cover odd `k` (tails), `n`
    /// not a multiple of any tile width, and a product large enough to run
    /// on the pool.
    #[test]
    fn matmul_rows_are_independent_of_the_window() {
        for (n, k) in [(37, 45), (5, 8), (130, 64), (301, 523)] {
            let total = 40;
            let x = data(total * k, 0.3);
            let w = data(n * k, 1.7);
            let alone: Vec<Vec<u32>> = (0..total)
                .map(|r| {
                    mm(&x[r * k..(r + 1) * k], 1, &w, n, k)
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
                .collect();
            for r in 0..total {
                for j in 0..n {
                    let d = dot(&w[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                    assert_eq!(alone[r][j], d.to_bits(), "n {n} k {k}: ({r}, {j}) vs dot");
                }
            }
            for m in [1, 2, 3, 8, 9, 33] {
                for start in 0..=total - m {
                    let y = mm(&x[start * k..(start + m) * k], m, &w, n, k);
                    for (i, row) in y.chunks_exact(n).enumerate() {
                        let bits: Vec<u32> = row.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(bits, alone[start + i], "n {n} k {k} window {m} at {start}");
                    }
                }
            }
        }
    }

    /// Against an f64 reference. Each product `w_i·x_i` reaches the result
    /// through at most `d = ⌊k/8⌋ + 3 + (k mod 8)` roundings (its lane's
    /// FMAs, the three levels of the lane sum, the tail FMAs), so
    /// `|y − y64| ≤ γ_d · Σ|w_i·x_i|` with `γ_d = d·u / (1 − d·u)`,
    /// `u = 2⁻²⁴` (Higham, *Accuracy and Stability*, §3.1). The test also
    /// checks the bound is not vacuous: the error is usually well inside it.
    #[test]
    fn matmul_matches_f64_within_the_summation_bound() {
        let (m, n, k) = (9, 70, 1029);
        let x = data(m * k, 0.9);
        let w = data(n * k, 2.3);
        let y = mm(&x, m, &w, n, k);
        let u = 2f64.powi(-24);
        let d = (k / 8 + 3 + k % 8) as f64;
        let gamma = d * u / (1.0 - d * u);
        let mut worst = 0f64;
        for r in 0..m {
            for j in 0..n {
                let (wr, xr) = (&w[j * k..(j + 1) * k], &x[r * k..(r + 1) * k]);
                let exact: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wr
                    .iter()
                    .zip(xr)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                let err = (y[r * n + j] as f64 - exact).abs();
                assert!(err <= gamma * mag, "({r}, {j}): {err} > {}", gamma * mag);
                worst = worst.max(err / (gamma * mag));
            }
        }
        assert!(worst > 0.0 && worst < 0.5, "worst error / bound = {worst}");
    }
}
