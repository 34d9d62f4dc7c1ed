//! A verify window's block products. A window of K + 1 rows (K ≤ 3 drafts)
//! once ran the several-row kernels (a warp per output row, one step
//! loaded at a time) plus a launch per chain, SwiGLU, gated mean and
//! `matmul_many` part: a K = 1 window cost 1.74 one-row forwards (run 21,
//! `docs/GPU.md`). Now 2..=[`WINDOW_ROWS`] rows run the one-row kernels
//! once per row over grid y (they take their row from blockIdx.y): the same code,
//! so a window has the bits of single steps and the launches of one step,
//! and the rows run concurrently, so rows after the first find most weights
//! in L2. `DS4_CUDA_WINDOW_ROWS=0` turns it off (the several-row kernels,
//! for side-by-side runs).

use std::sync::LazyLock;

use super::device::Shape;

/// Activation rows at most that take the one-row kernels per row: verify
/// windows of up to three drafts. Prefill chunks keep the several-row
/// kernels, which read each weight once for four rows.
pub(super) const WINDOW_ROWS: usize = 4;

static ON: LazyLock<bool> =
    LazyLock::new(|| std::env::var("DS4_CUDA_WINDOW_ROWS").map_or(true, |v| v != "0"));

/// Whether a block product of `rows` activation rows runs the one-row
/// kernels once per row.
pub(super) fn per_row_window(rows: usize) -> bool {
    (2..=WINDOW_ROWS).contains(&rows) && *ON
}

/// `shape` once per activation row (grid y = the row).
pub(super) fn per_row(shape: Shape, rows: usize) -> Shape {
    Shape {
        grid: (shape.grid.0, rows as u32),
        block: shape.block,
    }
}
