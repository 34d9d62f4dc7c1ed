//! [`QuantTensor`]: a stored weight tensor (type, shape, bytes in row
//! ranges), and the row dequantization every backend's reference product
//! follows.

use std::sync::Arc;

use super::bytes::WeightBytes;
use super::dequant;
use super::types::WeightType;

/// Scales kept in a tensor of their own: one f32 per `block_rows ×
/// block_cols` block of the part's `[rows, cols]` values, row-major over
/// `⌈rows / block_rows⌉ × ⌈cols / block_cols⌉` blocks. Converted at load from
/// the file's form (f32 `weight_scale_inv`, or E8M0 `.scale`: `2^(e − 127)`,
/// exact in f32).
#[derive(Debug, Clone)]
pub struct ScaleGrid {
    pub values: Arc<[f32]>,
    pub block_rows: usize,
    pub block_cols: usize,
}

impl ScaleGrid {
    /// Grid columns for `cols` values.
    pub fn grid_cols(&self, cols: usize) -> usize {
        cols.div_ceil(self.block_cols)
    }

    /// The scales of value row `r` (one per column block).
    pub fn row(&self, r: usize, cols: usize) -> &[f32] {
        let gc = self.grid_cols(cols);
        let g = r / self.block_rows;
        &self.values[g * gc..(g + 1) * gc]
    }

    /// Whether the grid has the block count `[rows, cols]` needs.
    pub fn fits(&self, rows: usize, cols: usize) -> bool {
        self.block_rows > 0
            && self.block_cols > 0
            && self.values.len() == rows.div_ceil(self.block_rows) * self.grid_cols(cols)
    }
}

/// `rows` consecutive rows of a [`QuantTensor`], stored contiguously.
#[derive(Debug, Clone)]
pub struct QuantPart {
    pub rows: usize,
    pub data: WeightBytes,
    /// For [`WeightType::needs_scales`] types; row 0 of the grid is this
    /// part's row 0.
    pub scales: Option<ScaleGrid>,
}

/// A stored weight: `dims` row-major (the last is the reduction, `cols`),
/// its rows (the product of the leading dims) stored as consecutive parts.
#[derive(Debug, Clone)]
pub struct QuantTensor {
    pub ty: WeightType,
    pub dims: Vec<usize>,
    pub parts: Vec<QuantPart>,
}

/// Why a [`QuantTensor`] cannot be built; the caller names file and tensor.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("rows of {cols} values are not whole {ty} blocks of {block}")]
    PartialBlock {
        ty: WeightType,
        cols: usize,
        block: usize,
    },
    #[error("{ty} data of {found} bytes, expected {expected} for {rows} rows of {cols}")]
    Size {
        ty: WeightType,
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error("{ty} needs a scale tensor")]
    MissingScales { ty: WeightType },
    #[error("{ty} has no separate scales, but one was given")]
    UnexpectedScales { ty: WeightType },
    #[error(
        "scale grid of {found} values does not match {rows}×{cols} values in blocks of {block_rows}×{block_cols} (expected {expected})"
    )]
    ScaleShape {
        rows: usize,
        cols: usize,
        block_rows: usize,
        block_cols: usize,
        expected: usize,
        found: usize,
    },
    #[error("parts of {found} rows in all, the shape has {expected}")]
    Rows { expected: usize, found: usize },
    #[error("cannot join {a} and {b} rows into one weight")]
    MixedTypes { a: WeightType, b: WeightType },
    #[error("cannot join rows of {a} and {b} values into one weight")]
    MixedWidths { a: usize, b: usize },
}

impl QuantTensor {
    /// One part holding all rows, checked against the shape.
    pub fn new(
        ty: WeightType,
        dims: Vec<usize>,
        data: WeightBytes,
        scales: Option<ScaleGrid>,
    ) -> Result<Self, LayoutError> {
        let cols = dims.last().copied().unwrap_or(1);
        let rows = dims.iter().rev().skip(1).product();
        let t = QuantTensor {
            ty,
            dims,
            parts: vec![QuantPart { rows, data, scales }],
        };
        t.check()?;
        let _ = cols;
        Ok(t)
    }

    /// Values per row (the reduction length).
    pub fn cols(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// Rows: the product of the leading dims.
    pub fn rows(&self) -> usize {
        self.dims.iter().rev().skip(1).product()
    }

    /// Stored bytes of one row (scales excluded).
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.cols()).unwrap_or(0)
    }

    /// Stored bytes, scale grids included.
    pub fn byte_size(&self) -> usize {
        self.parts
            .iter()
            .map(|p| p.data.len() + p.scales.as_ref().map_or(0, |s| s.values.len() * 4))
            .sum()
    }

    /// Every invariant the row accessors rely on.
    pub fn check(&self) -> Result<(), LayoutError> {
        let (ty, cols) = (self.ty, self.cols());
        let row_bytes = ty.row_bytes(cols).ok_or(LayoutError::PartialBlock {
            ty,
            cols,
            block: ty.block_len(),
        })?;
        let mut total = 0;
        for p in &self.parts {
            let expected = p.rows * row_bytes;
            if p.data.len() != expected {
                return Err(LayoutError::Size {
                    ty,
                    rows: p.rows,
                    cols,
                    expected,
                    found: p.data.len(),
                });
            }
            match (&p.scales, ty.needs_scales()) {
                (None, true) => return Err(LayoutError::MissingScales { ty }),
                (Some(_), false) => return Err(LayoutError::UnexpectedScales { ty }),
                (Some(s), true) if !s.fits(p.rows, cols) => {
                    return Err(LayoutError::ScaleShape {
                        rows: p.rows,
                        cols,
                        block_rows: s.block_rows,
                        block_cols: s.block_cols,
                        expected: p.rows.div_ceil(s.block_rows.max(1))
                            * cols.div_ceil(s.block_cols.max(1)),
                        found: s.values.len(),
                    });
                }
                _ => {}
            }
            total += p.rows;
        }
        if total != self.rows() {
            return Err(LayoutError::Rows {
                expected: self.rows(),
                found: total,
            });
        }
        Ok(())
    }

    /// Rows of several tensors of one type and width, in order, as one
    /// tensor of `dims` (no bytes copied).
    pub fn join(dims: Vec<usize>, tensors: &[&QuantTensor]) -> Result<Self, LayoutError> {
        let first = tensors[0];
        for t in tensors {
            if t.ty != first.ty {
                return Err(LayoutError::MixedTypes {
                    a: first.ty,
                    b: t.ty,
                });
            }
            if t.cols() != first.cols() {
                return Err(LayoutError::MixedWidths {
                    a: first.cols(),
                    b: t.cols(),
                });
            }
        }
        let joined = QuantTensor {
            ty: first.ty,
            dims,
            parts: tensors
                .iter()
                .flat_map(|t| t.parts.iter().cloned())
                .collect(),
        };
        joined.check()?;
        Ok(joined)
    }

    /// Whether [`Self::row_range`] can cut at `r0..r1`: inside the rows,
    /// and not starting inside a separate-scale block.
    pub fn can_cut(&self, r0: usize, r1: usize) -> bool {
        if r0 > r1 || r1 > self.rows() {
            return false;
        }
        let mut base = 0;
        for p in &self.parts {
            if let Some(s) = &p.scales
                && r0 > base
                && r0 < base + p.rows
                && !(r0 - base).is_multiple_of(s.block_rows)
            {
                return false;
            }
            base += p.rows;
        }
        true
    }

    /// Rows `r0..r1` as a tensor `[r1 − r0, cols]` (views of the same bytes).
    /// Panics unless [`Self::can_cut`].
    pub fn row_range(&self, r0: usize, r1: usize) -> QuantTensor {
        assert!(
            r0 <= r1 && r1 <= self.rows(),
            "rows {r0}..{r1} of {}",
            self.rows()
        );
        let (cols, row_bytes) = (self.cols(), self.row_bytes());
        let mut parts = Vec::new();
        let mut base = 0;
        for p in &self.parts {
            let (a, b) = (r0.max(base), r1.min(base + p.rows));
            if a < b {
                let (la, lb) = (a - base, b - base);
                let scales = p.scales.as_ref().map(|s| {
                    // Whole grid rows: a range that starts inside a block
                    // would need a re-based grid, which no caller asks for.
                    assert!(
                        la.is_multiple_of(s.block_rows),
                        "row range inside a scale block"
                    );
                    let gc = s.grid_cols(cols);
                    let g0 = la / s.block_rows;
                    let g1 = lb.div_ceil(s.block_rows);
                    ScaleGrid {
                        values: s.values[g0 * gc..g1 * gc].into(),
                        block_rows: s.block_rows,
                        block_cols: s.block_cols,
                    }
                });
                parts.push(QuantPart {
                    rows: lb - la,
                    data: p.data.slice(la * row_bytes..lb * row_bytes),
                    scales,
                });
            }
            base += p.rows;
        }
        QuantTensor {
            ty: self.ty,
            dims: vec![r1 - r0, cols],
            parts,
        }
    }

    /// Rows `r0..r1` dequantized into `out` (`(r1 − r0) · cols` values),
    /// each value exactly as the format defines it.
    pub fn dequantize_rows(&self, r0: usize, r1: usize, out: &mut [f32]) {
        let (cols, row_bytes) = (self.cols(), self.row_bytes());
        assert_eq!(out.len(), (r1 - r0) * cols, "output of rows {r0}..{r1}");
        let mut base = 0;
        let mut at = 0;
        for p in &self.parts {
            let (a, b) = (r0.max(base), r1.min(base + p.rows));
            if a < b {
                let bytes = p.data.as_slice();
                for r in a - base..b - base {
                    let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
                    let dst = &mut out[at..at + cols];
                    match &p.scales {
                        None => dequant::blocks(self.ty, src, dst),
                        Some(s) => dequant::scaled(self.ty, src, s.row(r, cols), s.block_cols, dst),
                    }
                    at += cols;
                }
            }
            base += p.rows;
        }
    }

    /// All values as f32, row-major.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows() * self.cols()];
        self.dequantize_rows(0, self.rows(), &mut out);
        out
    }
}

/// A candle block tensor as a [`QuantTensor`] (owned bytes): tests and
/// tools make stored weights with candle's quantizers.
pub fn from_candle(q: &candle_core::quantized::QTensor) -> crate::error::Result<QuantTensor> {
    use candle_core::quantized::GgmlDType as G;
    let ty = match q.dtype() {
        G::F32 => WeightType::F32,
        G::F16 => WeightType::F16,
        G::BF16 => WeightType::BF16,
        G::Q4_0 => WeightType::Q4_0,
        G::Q4_1 => WeightType::Q4_1,
        G::Q5_0 => WeightType::Q5_0,
        G::Q5_1 => WeightType::Q5_1,
        G::Q8_0 => WeightType::Q8_0,
        G::Q2K => WeightType::Q2_K,
        G::Q3K => WeightType::Q3_K,
        G::Q4K => WeightType::Q4_K,
        G::Q5K => WeightType::Q5_K,
        G::Q6K => WeightType::Q6_K,
        G::Q8K => WeightType::Q8_K,
        other => {
            return Err(crate::error::EngineError::Unsupported(format!(
                "candle type {other:?} as a stored weight"
            )));
        }
    };
    let bytes = q.data()?.into_owned();
    QuantTensor::new(
        ty,
        q.shape().dims().to_vec(),
        WeightBytes::owned(bytes),
        None,
    )
    .map_err(|e| crate::error::EngineError::State(e.to_string()))
}
