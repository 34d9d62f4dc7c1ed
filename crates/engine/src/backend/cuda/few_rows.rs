//! Which kernels a verify window's block products take. A window of K + 1
//! rows (K ≤ 3 drafts) once ran the several-row kernels, a warp per output
//! row loading one step at a time, plus a launch per chain and per part:
//! a K = 1 window cost 1.74 decode steps (run 21, `docs/GPU.md`). Two forms
//! replace them, chosen per product kind; both keep every FMA of the
//! one-row kernels in order, so a window has the bits of single steps:
//!
//! - **few** (`matmul_*_few`): a warp (split form: a block) takes
//!   [`FEW_OUT`] output rows against all the window's rows, so each weight
//!   is read and dequantized once;
//! - **rows** (`matmul_*_rows`): the one-row kernel once per window row
//!   (grid y), rows after the first finding most weights in L2.
//!
//! `DS4_CUDA_FEW=0` turns both off (the several-row kernels, for side-by-
//! side runs); `DS4_CUDA_FEW_ROWS=mm,split,many,splitmany,gm` (or `all`,
//! or `none`) overrides which kinds take the rows form.

use std::sync::LazyLock;

use super::device::Shape;

/// Activation rows at most of a verify window's forms (`MM_TILE` in
/// `matmul.cu`): windows of up to three drafts.
pub(super) const FEW_ROWS: usize = 4;

/// Output rows per warp (split form: per block) of the few form
/// (`FEW_OUT` in `matmul.cu`).
pub(super) const FEW_OUT: usize = 4;

/// A block product's kind, as the choice of form sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FewOp {
    /// One matrix, a warp per output row (`mm`).
    Matmul,
    /// One matrix in the split form, k ≥ 4096 (`split`).
    Split,
    /// Several matrices of one input (`many`).
    Many,
    /// Several split-form matrices of one input (`splitmany`).
    SplitMany,
    /// The gated-residual mix with its gates as a product (`gm`).
    GatedMean,
}

impl FewOp {
    fn key(self) -> &'static str {
        match self {
            FewOp::Matmul => "mm",
            FewOp::Split => "split",
            FewOp::Many => "many",
            FewOp::SplitMany => "splitmany",
            FewOp::GatedMean => "gm",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FewForm {
    /// Not a verify window (one row, or more than [`FEW_ROWS`]), or the
    /// forms are turned off: the one-row or several-row kernels.
    Off,
    Few,
    Rows,
}

/// The kinds that take the rows form unless `DS4_CUDA_FEW_ROWS` says
/// otherwise.
const DEFAULT_ROWS: &[&str] = &[];

struct Choice {
    on: bool,
    rows: Vec<String>,
}

static CHOICE: LazyLock<Choice> = LazyLock::new(|| Choice {
    on: std::env::var("DS4_CUDA_FEW").map_or(true, |v| v != "0"),
    rows: match std::env::var("DS4_CUDA_FEW_ROWS") {
        Ok(v) => v.split(',').map(|s| s.trim().to_string()).collect(),
        Err(_) => DEFAULT_ROWS.iter().map(|s| s.to_string()).collect(),
    },
});

/// The form a block product of `rows` activation rows takes.
pub(super) fn few_form(rows: usize, op: FewOp) -> FewForm {
    if !(2..=FEW_ROWS).contains(&rows) || !CHOICE.on {
        return FewForm::Off;
    }
    if CHOICE.rows.iter().any(|k| k == op.key() || k == "all") {
        FewForm::Rows
    } else {
        FewForm::Few
    }
}

/// `shape` once per activation row (grid y = the row).
pub(super) fn per_row(shape: Shape, rows: usize) -> Shape {
    Shape {
        grid: (shape.grid.0, rows as u32),
        block: shape.block,
    }
}

/// The rows-form kernel of each one-row `Many` kernel.
pub(super) const ROWS_NAMES: &[(&str, &str)] = &[
    ("matmul_q4_1_many", "matmul_q4_1_many_rows"),
    ("matmul_q8_0_many", "matmul_q8_0_many_rows"),
    ("matmul_q4_1_many_swiglu", "matmul_q4_1_many_swiglu_rows"),
    ("matmul_q8_0_many_swiglu", "matmul_q8_0_many_swiglu_rows"),
    ("matmul_q4_1_split_many", "matmul_q4_1_split_many_rows"),
    ("matmul_q8_0_split_many", "matmul_q8_0_split_many_rows"),
];
