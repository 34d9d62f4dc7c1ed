//! A batch's per-session rows cut apart and put back together in one
//! launch each ([`crate::backend::Backend::split_rows`] and
//! [`crate::backend::Backend::concat_rows`]): a table of row blocks
//! (source, stride, rows, destination) and one `copy_row_blocks_f32`,
//! where a row copy or an append a session was one launch each — ~7,700
//! launches a 64-session batch of the full-size qwen4_exp shape (24.9 ms
//! of its 88.8 ms of driver time, run 41). The values are copies either
//! way. While a graph is captured (no uploads there) they run part by
//! part.

use super::buf::{self, CudaBuf};
use super::device::{Device, Shape, args};
use crate::error::{EngineError, Result};

/// Rows a table entry copies at most: a prefill chunk's part is cut into
/// several entries, so the launch's grid (entries × rows × width) is not
/// sized by the longest part.
const BLOCK_ROWS: usize = 16;

/// Table entries copying `rows` rows of `width` from `src` (a row every
/// `width` values) to `dst`, at most [`BLOCK_ROWS`] rows each.
fn push_blocks(table: &mut Vec<u64>, src: u64, dst: u64, rows: usize, width: usize) {
    for first in (0..rows).step_by(BLOCK_ROWS) {
        let at = 4 * (first * width) as u64;
        table.extend([
            src + at,
            width as u64,
            BLOCK_ROWS.min(rows - first) as u64,
            dst + at,
            0,
        ]);
    }
}

/// Upload `table` and copy its blocks in one launch.
fn copy_blocks(dev: &Device, table: &[u64], width: usize) -> Result<()> {
    if table.is_empty() || width == 0 {
        return Ok(());
    }
    let n = table.len() / 5;
    let max_rows = table.chunks(5).map(|e| e[2]).max().unwrap_or(0) as usize;
    let table = dev.upload(table)?;
    dev.launch(
        "copy_row_blocks_f32",
        Shape::elements(n * max_rows * width),
        args![table.ptr(), n, max_rows, width],
    )
}

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// `Backend::split_rows`.
pub(super) fn split_rows(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    counts: &[usize],
) -> Result<Vec<CudaBuf>> {
    let total: usize = counts.iter().sum();
    if total * width > x.len() {
        return Err(shape_err(
            "split_rows",
            format!("parts of {total} rows of {width} from {} values", x.len()),
        ));
    }
    if dev.pool.capturing() || counts.len() < 2 {
        let mut at = 0;
        return counts
            .iter()
            .map(|&t| {
                let r = buf::rows(dev, x, width, at, t);
                at += t;
                r
            })
            .collect();
    }
    let mut table = Vec::new();
    let mut at = 0;
    let parts = counts
        .iter()
        .map(|&t| {
            let out = CudaBuf::uninit(dev, t * width)?;
            push_blocks(
                &mut table,
                x.ptr() + 4 * (at * width) as u64,
                out.ptr(),
                t,
                width,
            );
            at += t;
            Ok(out)
        })
        .collect::<Result<Vec<_>>>()?;
    copy_blocks(dev, &table, width)?;
    Ok(parts)
}

/// `Backend::concat_rows`.
pub(super) fn concat_rows(dev: &Device, parts: Vec<CudaBuf>, width: usize) -> Result<CudaBuf> {
    if width == 0 || parts.iter().any(|p| p.len() % width != 0) {
        return Err(shape_err(
            "concat_rows",
            format!("parts not whole rows of {width}"),
        ));
    }
    if dev.pool.capturing() || parts.len() < 2 {
        let mut it = parts.into_iter();
        let mut all = it
            .next()
            .ok_or_else(|| shape_err("concat_rows", "no parts".into()))?;
        for p in it {
            buf::append(dev, &mut all, &p)?;
        }
        return Ok(all);
    }
    let total: usize = parts.iter().map(CudaBuf::len).sum();
    let out = CudaBuf::uninit(dev, total)?;
    let mut table = Vec::new();
    let mut at = 0;
    for p in &parts {
        push_blocks(
            &mut table,
            p.ptr(),
            out.ptr() + 4 * at as u64,
            p.len() / width,
            width,
        );
        at += p.len();
    }
    copy_blocks(dev, &table, width)?;
    Ok(out)
}
