//! [`CudaBuf`]: f32 values on the device, and the memory ops of the
//! inventory (upload, download, rows, append, truncate, column concat and
//! split).
//!
//! A buffer is a shared allocation plus a length. Cloning is cheap (states
//! are snapshotted by cloning); an op that writes in place first makes the
//! allocation its own (a copy when it is shared), so a clone behaves like
//! the CPU backend's deep copy. Caches grow by [`append`] into spare
//! capacity (doubling), so a decode step does not copy the whole cache.

use std::sync::Arc;

use super::device::{Device, Shape, args};
use super::graph::CudaStep;
use super::mem::DevMem;
use crate::error::{EngineError, Result};

#[derive(Clone)]
pub struct CudaBuf {
    mem: Arc<DevMem<f32>>,
    len: usize,
}

impl std::fmt::Debug for CudaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuf[{}]", self.len)
    }
}

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

impl CudaBuf {
    pub(super) fn from_mem(mem: DevMem<f32>, len: usize) -> Self {
        Self {
            mem: Arc::new(mem),
            len,
        }
    }

    /// A new buffer of `len` values, to be fully written by a kernel.
    pub(super) fn uninit(dev: &Device, len: usize) -> Result<Self> {
        Ok(Self::from_mem(dev.alloc(len)?, len))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first value.
    pub(super) fn ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// Make the allocation this buffer's own (copied when a clone holds
    /// it) with room for at least `capacity` values; its address, for an
    /// in-place kernel or an append.
    pub(super) fn own(&mut self, dev: &Device, capacity: usize) -> Result<u64> {
        let room = self.mem.len() >= capacity.max(1);
        if !(room && Arc::get_mut(&mut self.mem).is_some()) {
            let fresh = dev.alloc::<f32>(capacity.max(self.len))?;
            copy_vals(dev, &self.mem, 0, &fresh, 0, self.len)?;
            self.mem = Arc::new(fresh);
        }
        Ok(self.mem.ptr())
    }

    /// [`CudaBuf::own`] at the current length.
    pub(super) fn own_ptr(&mut self, dev: &Device) -> Result<u64> {
        let len = self.len;
        self.own(dev, len)
    }
}

pub(super) fn upload(dev: &Device, host: &[f32]) -> Result<CudaBuf> {
    Ok(CudaBuf::from_mem(dev.upload(host)?, host.len()))
}

pub(super) fn download(dev: &Device, x: &CudaBuf) -> Result<Vec<f32>> {
    dev.download(&x.mem, x.len)
}

pub(super) fn download_parts(dev: &Device, x: &CudaBuf, lens: &[usize]) -> Result<Vec<Vec<f32>>> {
    if lens.iter().sum::<usize>() != x.len {
        return Err(shape_err(
            "download_parts",
            format!(
                "parts of {} values in all from {} values",
                lens.iter().sum::<usize>(),
                x.len
            ),
        ));
    }
    dev.download_parts(&x.mem, lens)
}

pub(super) fn zeros(dev: &Device, n: usize) -> Result<CudaBuf> {
    Ok(CudaBuf::from_mem(dev.alloc_zeros(n)?, n))
}

pub(super) fn rows(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    first: usize,
    count: usize,
) -> Result<CudaBuf> {
    let (a, b) = (first * width, (first + count) * width);
    if b > x.len {
        return Err(shape_err(
            "rows",
            format!(
                "rows {first}..{} of a {}-row buffer",
                first + count,
                x.len / width.max(1)
            ),
        ));
    }
    let out = dev.alloc(b - a)?;
    copy_vals(dev, &x.mem, a, &out, 0, b - a)?;
    Ok(CudaBuf::from_mem(out, b - a))
}

/// `dst ← [dst | src]`, into spare capacity when there is some.
pub(super) fn append(dev: &Device, dst: &mut CudaBuf, src: &CudaBuf) -> Result<()> {
    let need = dst.len + src.len;
    let capacity = if dst.mem.len() >= need {
        need
    } else {
        // Doubling keeps a growing cache at amortised O(1) per row.
        need.max(2 * dst.mem.len()).max(64)
    };
    let at = dst.len;
    dst.own(dev, capacity)?;
    copy_vals(dev, &src.mem, 0, &dst.mem, at, src.len)?;
    dst.len = need;
    Ok(())
}

/// A copy of `x` in a new block.
pub(super) fn copy_of(dev: &Device, x: &CudaBuf) -> Result<CudaBuf> {
    let out = dev.alloc(x.len)?;
    copy_vals(dev, &x.mem, 0, &out, 0, x.len)?;
    Ok(CudaBuf::from_mem(out, x.len))
}

/// Device-to-device copies of values run as a kernel (`copy4_f32`), not a
/// driver copy: a driver copy between two kernels costs more than a launch
/// in a decode step (run 22, `docs/GPU.md`: a pure unit's three inputs and
/// outputs as driver copies, decode 126–129 tok/s against 138–139 as two
/// kernels). `DS4_CUDA_COPY_KERNEL=0` brings the driver copies back, for
/// side-by-side runs.
static COPY_KERNEL: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var("DS4_CUDA_COPY_KERNEL").map_or(true, |v| v != "0"));

/// Values up to which a copy runs as the kernel: the driver copies a large
/// block faster (1 GiB: 4.26 TB/s read + write against the kernel's 3.15,
/// run 22), and a prefill's large appends are not latency-bound.
const COPY_KERNEL_MAX: usize = 1 << 20;

/// `n` values `src[from ..]` → `dst[to ..]` on the stream.
fn copy_vals(
    dev: &Device,
    src: &DevMem<f32>,
    from: usize,
    dst: &DevMem<f32>,
    to: usize,
    n: usize,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if !*COPY_KERNEL || n > COPY_KERNEL_MAX || from + n > src.len() || to + n > dst.len() {
        // The driver copy also reports a range outside either block.
        return dev.copy(src, from, dst, to, n);
    }
    dev.launch(
        "copy4_f32",
        Shape::elements(n),
        args![
            dst.ptr() + 4 * to as u64,
            src.ptr() + 4 * from as u64,
            n,
            0u64,
            0u64,
            0u64,
            0u64,
            0u64,
            0u64,
            0u64,
            0u64,
            0u64
        ],
    )
}

/// Each `src`'s values into its `dst`'s storage (equal lengths; `dst` is
/// written in place, clones included: a graph's own input buffer), up to
/// eight pairs a launch (`copy4_f32`, `copy8_f32` above four), so a pure
/// unit's several inputs cost one launch, not one copy each (DeepSeek-V4's
/// units take five inputs and give up to six outputs).
/// Large buffers, or `DS4_CUDA_COPY_KERNEL=0`, go one copy each
/// ([`copy_vals`]).
pub(super) fn copy_many(dev: &Device, pairs: &[(&CudaBuf, &CudaBuf)]) -> Result<()> {
    if let Some((d, s)) = pairs.iter().find(|(d, s)| d.len != s.len) {
        return Err(shape_err(
            "copy_many",
            format!("{} values into {}", s.len, d.len),
        ));
    }
    if !*COPY_KERNEL || pairs.iter().any(|(_, s)| s.len > COPY_KERNEL_MAX) {
        for (d, s) in pairs {
            copy_vals(dev, &s.mem, 0, &d.mem, 0, s.len)?;
        }
        return Ok(());
    }
    for chunk in pairs.chunks(8) {
        let mut a = [(0u64, 0u64, 0usize); 8];
        for (slot, (d, s)) in a.iter_mut().zip(chunk) {
            *slot = (d.ptr(), s.ptr(), s.len);
        }
        let total: usize = a.iter().map(|p| p.2).sum();
        if total == 0 {
            continue;
        }
        if chunk.len() <= 4 {
            dev.launch(
                "copy4_f32",
                Shape::elements(total),
                args![
                    a[0].0, a[0].1, a[0].2, a[1].0, a[1].1, a[1].2, a[2].0, a[2].1, a[2].2, a[3].0,
                    a[3].1, a[3].2
                ],
            )?;
        } else {
            dev.launch(
                "copy8_f32",
                Shape::elements(total),
                args![
                    a[0].0, a[0].1, a[0].2, a[1].0, a[1].1, a[1].2, a[2].0, a[2].1, a[2].2, a[3].0,
                    a[3].1, a[3].2, a[4].0, a[4].1, a[4].2, a[5].0, a[5].1, a[5].2, a[6].0, a[6].1,
                    a[6].2, a[7].0, a[7].1, a[7].2
                ],
            )?;
        }
    }
    Ok(())
}

/// `Backend::resize`: the length becomes `n`; storage shared or too small
/// is replaced by its own with room for `grow_to` values.
pub(super) fn resize(dev: &Device, dst: &mut CudaBuf, n: usize, grow_to: usize) -> Result<()> {
    if !(dst.mem.len() >= n.max(1) && Arc::get_mut(&mut dst.mem).is_some()) {
        dst.own(dev, grow_to.max(n))?;
    }
    dst.len = n;
    Ok(())
}

/// The storage's identity: its address and capacity.
pub(super) fn storage_key(x: &CudaBuf) -> [u64; 2] {
    [x.mem.ptr(), x.mem.len() as u64]
}

/// Values the storage has room for.
pub(super) fn capacity(x: &CudaBuf) -> usize {
    x.mem.len()
}

/// Rows `pos .. pos + count` of `x: [_, width]`, `pos` from the step.
pub(super) fn rows_step(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    step: &CudaStep,
    count: usize,
) -> Result<CudaBuf> {
    let n = count * width;
    if (step.pos + count) * width > x.len {
        return Err(shape_err(
            "rows_step",
            format!(
                "rows {}..{} of a {}-row buffer",
                step.pos,
                step.pos + count,
                x.len / width.max(1)
            ),
        ));
    }
    let out = CudaBuf::uninit(dev, n)?;
    if n > 0 {
        dev.launch(
            "rows_step_f32",
            Shape::elements(n),
            args![out.ptr(), x.ptr(), width, n, step.ptr],
        )?;
    }
    Ok(out)
}

/// `src` over rows `pos ..` of `dst`, which must own its storage (a step
/// never reallocates: the caller resized it before).
pub(super) fn write_rows_step(
    dev: &Device,
    dst: &mut CudaBuf,
    src: &CudaBuf,
    width: usize,
    step: &CudaStep,
) -> Result<()> {
    if step.pos * width + src.len > dst.len || Arc::get_mut(&mut dst.mem).is_none() {
        return Err(shape_err(
            "write_rows_step",
            format!(
                "{} values at row {} of a buffer of {} (resize it to its own storage first)",
                src.len, step.pos, dst.len
            ),
        ));
    }
    if src.len > 0 {
        dev.launch(
            "write_rows_step_f32",
            Shape::elements(src.len),
            args![dst.ptr(), src.ptr(), width, src.len, step.ptr],
        )?;
    }
    Ok(())
}

pub(super) fn truncate(dst: &mut CudaBuf, n: usize) -> Result<()> {
    // A shared allocation is fine: values past `n` are never read through
    // this buffer, and the next append makes it its own first.
    dst.len = dst.len.min(n);
    Ok(())
}

/// `dst[r·dst_stride + dst_off + c] = src[r·src_stride + src_off + c]`.
#[allow(clippy::too_many_arguments)]
fn copy2d(
    dev: &Device,
    dst: u64,
    dst_stride: usize,
    dst_off: usize,
    src: &CudaBuf,
    src_stride: usize,
    src_off: usize,
    rows: usize,
    cols: usize,
) -> Result<()> {
    if rows * cols == 0 {
        return Ok(());
    }
    dev.launch(
        "copy2d",
        Shape::elements(rows * cols),
        args![
            dst,
            dst_stride,
            dst_off,
            src.ptr(),
            src_stride,
            src_off,
            rows,
            cols
        ],
    )
}

pub(super) fn concat_cols(
    dev: &Device,
    parts: &[(&CudaBuf, usize)],
    rows: usize,
) -> Result<CudaBuf> {
    let width: usize = parts.iter().map(|p| p.1).sum();
    if let Some((p, w)) = parts.iter().find(|(p, w)| p.len != rows * w) {
        return Err(shape_err(
            "concat_cols",
            format!("a part of {} values is not [{rows}, {w}]", p.len),
        ));
    }
    let out = CudaBuf::uninit(dev, rows * width)?;
    let mut off = 0;
    for (p, w) in parts {
        copy2d(dev, out.ptr(), width, off, p, *w, 0, rows, *w)?;
        off += w;
    }
    Ok(out)
}

pub(super) fn split_cols(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[usize],
    repeats: usize,
) -> Result<Vec<CudaBuf>> {
    let period: usize = parts.iter().sum();
    if x.len != rows * period * repeats {
        return Err(shape_err(
            "split_cols",
            format!("{} values are not {rows} rows of {repeats}×{period}", x.len),
        ));
    }
    // Up to four parts (q / k / v, a gate beside its values) in one launch.
    if (1..=4).contains(&parts.len()) && period > 0 {
        let out = parts
            .iter()
            .map(|&p| CudaBuf::uninit(dev, rows * repeats * p))
            .collect::<Result<Vec<_>>>()?;
        let at = |i: usize| out.get(i).map_or(0, |o| o.ptr());
        let width = |i: usize| parts.get(i).copied().unwrap_or(0);
        if x.len > 0 {
            dev.launch(
                "split_cols4",
                Shape::elements(x.len),
                args![
                    at(0),
                    at(1),
                    at(2),
                    at(3),
                    x.ptr(),
                    rows * repeats,
                    width(0),
                    width(1),
                    width(2),
                    width(3)
                ],
            )?;
        }
        return Ok(out);
    }
    let mut off = 0;
    let mut out = Vec::with_capacity(parts.len());
    for &p in parts {
        let o = CudaBuf::uninit(dev, rows * repeats * p)?;
        copy2d(dev, o.ptr(), p, 0, x, period, off, rows * repeats, p)?;
        off += p;
        out.push(o);
    }
    Ok(out)
}

/// [`crate::backend::Backend::row_runs`]: every run in one
/// `copy_row_blocks_f32` launch after one table upload (a batch of 64
/// decode rows took 384 copies a step as runs one by one); while a graph is
/// captured (no uploads there), run by run.
pub(super) fn row_runs(
    dev: &Device,
    x: &CudaBuf,
    width: usize,
    runs: &[(usize, usize)],
) -> Result<CudaBuf> {
    if let Some(&(first, count)) = runs.iter().find(|&&(f, c)| (f + c) * width > x.len) {
        return Err(shape_err(
            "row_runs",
            format!(
                "rows {first}..{} of a {}-row buffer",
                first + count,
                x.len / width.max(1)
            ),
        ));
    }
    if runs.is_empty() {
        return Err(shape_err("row_runs", "no runs".into()));
    }
    let total: usize = runs.iter().map(|r| r.1).sum();
    if dev.pool.capturing() || runs.len() == 1 {
        let mut out = rows(dev, x, width, runs[0].0, runs[0].1)?;
        for &(first, count) in &runs[1..] {
            append(dev, &mut out, &rows(dev, x, width, first, count)?)?;
        }
        return Ok(out);
    }
    let out = CudaBuf::uninit(dev, total * width)?;
    if total == 0 || width == 0 {
        return Ok(out);
    }
    let mut table: Vec<u64> = Vec::with_capacity(5 * runs.len());
    let mut at = 0;
    for &(first, count) in runs {
        table.extend([
            x.ptr() + 4 * (first * width) as u64,
            width as u64,
            count as u64,
            out.ptr() + 4 * (at * width) as u64,
            0,
        ]);
        at += count;
    }
    let max_rows = runs.iter().map(|r| r.1).max().unwrap_or(0);
    let table = dev.upload(&table)?;
    dev.launch(
        "copy_row_blocks_f32",
        Shape::elements(runs.len() * max_rows * width),
        args![table.ptr(), runs.len(), max_rows, width],
    )?;
    Ok(out)
}

/// `Backend::append_head_rows`: every target's column blocks appended in
/// one `copy_row_blocks_f32` launch (each buffer grown first as [`append`]
/// grows it, so the storage is the same as appends one by one).
pub(super) fn append_head_rows(
    dev: &Device,
    width: usize,
    targets: &mut [crate::backend::HeadRows<'_, CudaBuf>],
) -> Result<()> {
    let mut table: Vec<u64> = Vec::new();
    let mut max_rows = 0;
    for t in targets.iter_mut() {
        let stride = t.dsts.len() * width;
        if (t.first + t.rows) * stride > t.src.len {
            return Err(shape_err(
                "append_head_rows",
                format!(
                    "rows {}..{} of a {}-row buffer",
                    t.first,
                    t.first + t.rows,
                    t.src.len / stride.max(1)
                ),
            ));
        }
        if t.rows == 0 {
            continue;
        }
        for (h, dst) in t.dsts.iter_mut().enumerate() {
            let need = dst.len + t.rows * width;
            let capacity = if dst.mem.len() >= need {
                need
            } else {
                need.max(2 * dst.mem.len()).max(64)
            };
            let at = dst.len;
            let base = dst.own(dev, capacity)?;
            table.extend([
                t.src.ptr() + 4 * (t.first * stride + h * width) as u64,
                stride as u64,
                t.rows as u64,
                base + 4 * at as u64,
                0,
            ]);
            dst.len = need;
        }
        max_rows = max_rows.max(t.rows);
    }
    if table.is_empty() || width == 0 {
        return Ok(());
    }
    let n = table.len() / 5;
    let table = dev.upload(&table)?;
    dev.launch(
        "copy_row_blocks_f32",
        Shape::elements(n * max_rows * width),
        args![table.ptr(), n, max_rows, width],
    )
}
