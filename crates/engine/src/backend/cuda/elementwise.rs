//! Element-wise and small per-row ops on the device: maps, SwiGLU, the
//! decay of the delta rule, PLE gate, stream ops and mHC mixing
//! (`kernels/elementwise.cu`, `kernels/hyper.cu`), token compression
//! (`kernels/compression.cu`) and embedding lookup (`kernels/memory.cu`).
//! Every output element is computed alone, in the CPU reference's order.

use super::buf::CudaBuf;
use super::device::{Arg, Device, Shape, args, ptr};
use super::graph::CudaStep;
use super::weights::{BlockKind, CudaTable};
use crate::backend::{GeluForm, UNARY_CHAIN_MAX, Unary};
use crate::error::{EngineError, Result};

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// `y = kernel(y, extra…, n)` over a new buffer of `n` values.
fn map(dev: &Device, name: &'static str, n: usize, inputs: &[Arg]) -> Result<CudaBuf> {
    let y = CudaBuf::uninit(dev, n)?;
    if n > 0 {
        let mut a = vec![Arg::U64(y.ptr())];
        a.extend_from_slice(inputs);
        a.push(Arg::U64(n as u64));
        dev.launch(name, Shape::elements(n), &a)?;
    }
    Ok(y)
}

pub(super) fn gather_rows(dev: &Device, table: &CudaTable, ids: &[u32]) -> Result<CudaBuf> {
    let (rows, _) = table.dims();
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= rows) {
        return Err(shape_err(
            "gather_rows",
            format!("row {bad} of a {rows}-row table"),
        ));
    }
    if dev.pool.capturing() {
        return Err(shape_err(
            "gather_rows",
            "token ids of a captured step come from the step (gather_rows_step)".into(),
        ));
    }
    if ids.is_empty() {
        return CudaBuf::uninit(dev, 0);
    }
    let ids = dev.upload(ids)?;
    gather_at(dev, table, ids.ptr(), ids.len())
}

/// `Backend::gather_rows_step`: the ids are the step's (checked against
/// the vocabulary by the caller before the step's parameters were written).
pub(super) fn gather_rows_step(
    dev: &Device,
    table: &CudaTable,
    step: &CudaStep,
) -> Result<CudaBuf> {
    gather_at(dev, table, step.ids_ptr(), step.rows)
}

/// Rows `ids[0 .. n]` (device u32 at `ids`) of `table`.
fn gather_at(dev: &Device, table: &CudaTable, ids: u64, n: usize) -> Result<CudaBuf> {
    let (_, width) = table.dims();
    let out = CudaBuf::uninit(dev, n * width)?;
    if n * width == 0 {
        return Ok(out);
    }
    let (name, data) = match table {
        CudaTable::Stored { w, .. } => {
            super::stored::table_rows(dev, &out, w, ids, n)?;
            return Ok(out);
        }
        CudaTable::F32 { w, .. } => ("gather_f32", ptr(w)),
        CudaTable::Block {
            kind: BlockKind::Q8_0,
            data,
            ..
        } => ("gather_q8_0", ptr(data)),
        CudaTable::Block {
            kind: BlockKind::Q4_1,
            data,
            ..
        } => ("gather_q4_1", ptr(data)),
    };
    dev.launch(
        name,
        Shape::elements(n * width),
        args![out.ptr(), data, ids, n, width],
    )?;
    Ok(out)
}

fn same_len(op: &str, a: &CudaBuf, b: &CudaBuf) -> Result<()> {
    if a.len() != b.len() {
        return Err(shape_err(op, format!("{} and {} values", a.len(), b.len())));
    }
    Ok(())
}

pub(super) fn add(dev: &Device, a: &CudaBuf, b: &CudaBuf) -> Result<CudaBuf> {
    same_len("add", a, b)?;
    map(dev, "add_f32", a.len(), args![a.ptr(), b.ptr()])
}

pub(super) fn mul(dev: &Device, a: &CudaBuf, b: &CudaBuf) -> Result<CudaBuf> {
    same_len("mul", a, b)?;
    map(dev, "mul_f32", a.len(), args![a.ptr(), b.ptr()])
}

pub(super) fn affine(dev: &Device, x: &CudaBuf, mul: f32, add: f32) -> Result<CudaBuf> {
    map(dev, "affine_f32", x.len(), args![x.ptr(), mul, add])
}

pub(super) fn add_bias(dev: &Device, x: &CudaBuf, b: &CudaBuf, width: usize) -> Result<CudaBuf> {
    if width == 0 || b.len() != width || !x.len().is_multiple_of(width) {
        return Err(shape_err(
            "add_bias",
            format!(
                "{} values, a bias of {} for rows of {width}",
                x.len(),
                b.len()
            ),
        ));
    }
    map(dev, "add_bias_f32", x.len(), args![x.ptr(), b.ptr(), width])
}

pub(super) fn gelu(dev: &Device, x: &CudaBuf, form: GeluForm) -> Result<CudaBuf> {
    let name = match form {
        GeluForm::Erf => "gelu_erf_f32",
        GeluForm::Tanh => "gelu_tanh_f32",
    };
    map(dev, name, x.len(), args![x.ptr()])
}

pub(super) fn silu(dev: &Device, x: &CudaBuf) -> Result<CudaBuf> {
    map(dev, "silu_f32", x.len(), args![x.ptr()])
}

pub(super) fn sigmoid(dev: &Device, x: &CudaBuf) -> Result<CudaBuf> {
    map(dev, "sigmoid_f32", x.len(), args![x.ptr()])
}

/// [`crate::backend::Backend::unary_chain`] in one launch.
pub(super) fn unary_chain(dev: &Device, x: &CudaBuf, chain: &[Unary]) -> Result<CudaBuf> {
    if chain.is_empty() {
        return Err(shape_err(
            "unary_chain",
            format!("0 steps (1 to {UNARY_CHAIN_MAX})"),
        ));
    }
    let mut a: Vec<Arg> = vec![Arg::U64(x.ptr())];
    a.extend(chain_args("unary_chain", chain)?);
    map(dev, "unary_chain_f32", x.len(), &a)
}

/// A chain of at most four steps as the kernels take it (`Chain` in
/// `elementwise.cu`): the step count, then (kind, mul, add) for each of
/// four slots.
pub(super) fn chain_args(op: &str, chain: &[Unary]) -> Result<Vec<Arg>> {
    let f = chain_fields(op, chain)?;
    let mut a = vec![Arg::I32(f.steps)];
    for i in 0..UNARY_CHAIN_MAX {
        a.extend([Arg::I32(f.kinds[i]), Arg::F32(f.mul[i]), Arg::F32(f.add[i])]);
    }
    Ok(a)
}

/// The fields of a kernel's `Chain` (`elementwise.cu`), in its layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ChainFields {
    pub steps: i32,
    pub kinds: [i32; UNARY_CHAIN_MAX],
    pub mul: [f32; UNARY_CHAIN_MAX],
    pub add: [f32; UNARY_CHAIN_MAX],
}

pub(super) fn chain_fields(op: &str, chain: &[Unary]) -> Result<ChainFields> {
    if chain.len() > UNARY_CHAIN_MAX {
        return Err(shape_err(
            op,
            format!("{} steps (at most {UNARY_CHAIN_MAX})", chain.len()),
        ));
    }
    let mut f = ChainFields {
        steps: chain.len() as i32,
        ..Default::default()
    };
    for i in 0..UNARY_CHAIN_MAX {
        let (kind, m, b) = match chain.get(i) {
            Some(Unary::Affine(m, b)) => (0, *m, *b),
            Some(Unary::Silu) => (1, 0.0, 0.0),
            Some(Unary::Sigmoid) | None => (2, 0.0, 0.0),
        };
        (f.kinds[i], f.mul[i], f.add[i]) = (kind, m, b);
    }
    Ok(f)
}

pub(super) fn swiglu(
    dev: &Device,
    gu: &CudaBuf,
    inter: usize,
    limit: Option<f32>,
) -> Result<CudaBuf> {
    if inter == 0 || !gu.len().is_multiple_of(2 * inter) {
        return Err(shape_err(
            "swiglu",
            format!("{} values are not rows of 2×{inter}", gu.len()),
        ));
    }
    let rows = gu.len() / (2 * inter);
    let y = CudaBuf::uninit(dev, rows * inter)?;
    if rows > 0 {
        dev.launch(
            "swiglu_f32",
            Shape::elements(rows * inter),
            args![
                y.ptr(),
                gu.ptr(),
                rows,
                inter,
                limit.is_some() as i32,
                limit.unwrap_or(0.0)
            ],
        )?;
    }
    Ok(y)
}

pub(super) fn softplus_decay(
    dev: &Device,
    a: &CudaBuf,
    neg_a: &CudaBuf,
    dt_bias: &CudaBuf,
) -> Result<CudaBuf> {
    let h = neg_a.len();
    if h == 0 || dt_bias.len() != h || !a.len().is_multiple_of(h) {
        return Err(shape_err(
            "softplus_decay",
            format!("{} values for {h} heads, {} biases", a.len(), dt_bias.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, a.len())?;
    if !a.is_empty() {
        dev.launch(
            "softplus_decay_f32",
            Shape::elements(a.len()),
            args![y.ptr(), a.ptr(), neg_a.ptr(), dt_bias.ptr(), a.len(), h],
        )?;
    }
    Ok(y)
}

pub(super) fn scale_rows(dev: &Device, x: &CudaBuf, s: &CudaBuf, width: usize) -> Result<CudaBuf> {
    if width == 0 || x.len() != s.len() * width {
        return Err(shape_err(
            "scale_rows",
            format!("{} values, {} scales of rows of {width}", x.len(), s.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, x.len())?;
    if !x.is_empty() {
        dev.launch(
            "scale_rows_f32",
            Shape::elements(x.len()),
            args![y.ptr(), x.ptr(), s.ptr(), x.len(), width],
        )?;
    }
    Ok(y)
}

/// [`crate::backend::Backend::add_gated_rows`] in one launch.
pub(super) fn add_gated_rows(
    dev: &Device,
    base: &CudaBuf,
    x: &CudaBuf,
    g: &CudaBuf,
    width: usize,
) -> Result<CudaBuf> {
    same_len("add_gated_rows", base, x)?;
    if width == 0 || x.len() != g.len() * width {
        return Err(shape_err(
            "add_gated_rows",
            format!("{} values, {} gates of rows of {width}", x.len(), g.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, x.len())?;
    if !x.is_empty() {
        dev.launch(
            "add_gated_rows_f32",
            Shape::elements(x.len()),
            args![y.ptr(), base.ptr(), x.ptr(), g.ptr(), x.len(), width],
        )?;
    }
    Ok(y)
}

pub(super) fn ple_gate(
    dev: &Device,
    key: &CudaBuf,
    qry: &CudaBuf,
    val: &CudaBuf,
    c: usize,
    h: usize,
) -> Result<CudaBuf> {
    let tokens = val.len() / h.max(1);
    if h == 0 || val.len() != tokens * h || key.len() != tokens * c * h || qry.len() != key.len() {
        return Err(shape_err(
            "ple_gate",
            format!(
                "key {} / query {} / value {} for {c} streams of {h}",
                key.len(),
                qry.len(),
                val.len()
            ),
        ));
    }
    let y = CudaBuf::uninit(dev, tokens * c * h)?;
    if tokens * c > 0 {
        dev.launch(
            "ple_gate_f32",
            Shape::warps(tokens * c),
            args![
                y.ptr(),
                key.ptr(),
                qry.ptr(),
                val.ptr(),
                tokens,
                c,
                h,
                1.0 / (h as f32).sqrt()
            ],
        )?;
    }
    Ok(y)
}

pub(super) fn tile_streams(dev: &Device, x: &CudaBuf, c: usize, h: usize) -> Result<CudaBuf> {
    if h == 0 || !x.len().is_multiple_of(h) {
        return Err(shape_err(
            "tile_streams",
            format!("{} values in rows of {h}", x.len()),
        ));
    }
    let rows = x.len() / h;
    let y = CudaBuf::uninit(dev, rows * c * h)?;
    if rows * c > 0 {
        dev.launch(
            "tile_streams_f32",
            Shape::elements(rows * c * h),
            args![y.ptr(), x.ptr(), rows, c, h],
        )?;
    }
    Ok(y)
}

pub(super) fn mean_streams(dev: &Device, x: &CudaBuf, c: usize, h: usize) -> Result<CudaBuf> {
    stream_mean(dev, "mean_streams_f32", x, c, h, args![x.ptr()])
}

/// [`crate::backend::Backend::gated_mean_streams`] in one launch.
pub(super) fn gated_mean_streams(
    dev: &Device,
    g: &CudaBuf,
    x: &CudaBuf,
    c: usize,
    h: usize,
) -> Result<CudaBuf> {
    same_len("gated_mean_streams", g, x)?;
    stream_mean(
        dev,
        "gated_mean_streams_f32",
        x,
        c,
        h,
        args![g.ptr(), x.ptr()],
    )
}

/// `y [rows, H]` from streams `x [rows, C·H]` by `kernel`, which takes
/// `(y, inputs…, rows, c, h, 1/C)`.
fn stream_mean(
    dev: &Device,
    kernel: &'static str,
    x: &CudaBuf,
    c: usize,
    h: usize,
    inputs: &[Arg],
) -> Result<CudaBuf> {
    if c == 0 || h == 0 || !x.len().is_multiple_of(c * h) {
        return Err(shape_err(
            kernel.trim_end_matches("_f32"),
            format!("{} values in rows of {c}×{h}", x.len()),
        ));
    }
    let rows = x.len() / (c * h);
    let y = CudaBuf::uninit(dev, rows * h)?;
    if rows > 0 {
        let inv = (1f64 / c as f64) as f32;
        let mut a = vec![Arg::U64(y.ptr())];
        a.extend_from_slice(inputs);
        a.extend([
            Arg::U64(rows as u64),
            Arg::U64(c as u64),
            Arg::U64(h as u64),
            Arg::F32(inv),
        ]);
        dev.launch(kernel, Shape::elements(rows * h), &a)?;
    }
    Ok(y)
}

pub(super) fn inject_streams(
    dev: &Device,
    xs: &CudaBuf,
    y: &CudaBuf,
    inj: &CudaBuf,
    c: usize,
) -> Result<CudaBuf> {
    let rows = inj.len() / c.max(1);
    let h = y.len() / rows.max(1);
    if c == 0 || inj.len() != rows * c || y.len() != rows * h || xs.len() != rows * c * h {
        return Err(shape_err(
            "inject_streams",
            format!(
                "streams {} / y {} / injections {} for {c} streams",
                xs.len(),
                y.len(),
                inj.len()
            ),
        ));
    }
    let out = CudaBuf::uninit(dev, xs.len())?;
    if !xs.is_empty() {
        dev.launch(
            "inject_streams_f32",
            Shape::elements(xs.len()),
            args![out.ptr(), xs.ptr(), y.ptr(), inj.ptr(), rows, c, h],
        )?;
    }
    Ok(out)
}

pub(super) fn hc_sinkhorn(
    dev: &Device,
    z: &CudaBuf,
    base: &CudaBuf,
    scale: &CudaBuf,
    n: usize,
    iters: usize,
    eps: f32,
) -> Result<CudaBuf> {
    let width = (2 + n) * n;
    if n == 0 || base.len() != width || scale.len() != 3 || !z.len().is_multiple_of(width) {
        return Err(shape_err(
            "hc_sinkhorn",
            format!("z {}, base {}, N {n}", z.len(), base.len()),
        ));
    }
    let rows = z.len() / width;
    let y = CudaBuf::uninit(dev, z.len())?;
    if rows > 0 {
        // Four streams (DeepSeek-V4): a warp a row, the same bits.
        let (name, shape) = if n == 4 {
            ("hc_sinkhorn4_f32", Shape::warps(rows))
        } else {
            ("hc_sinkhorn_f32", Shape::elements(rows))
        };
        dev.launch(
            name,
            shape,
            args![
                y.ptr(),
                z.ptr(),
                base.ptr(),
                scale.ptr(),
                rows,
                n as i32,
                iters as i32,
                eps
            ],
        )?;
    }
    Ok(y)
}

/// Rows of a mix `[rows, (2+N)·N]` and the stream width `D` of `xs: [rows,
/// N·D]`.
fn hc_dims(op: &str, xs: &CudaBuf, mix: &CudaBuf, n: usize) -> Result<(usize, usize)> {
    let width = (2 + n) * n;
    let rows = mix.len() / width.max(1);
    if n == 0 || rows == 0 || mix.len() != rows * width || !xs.len().is_multiple_of(rows * n) {
        return Err(shape_err(
            op,
            format!("{} stream values, mix {} for N {n}", xs.len(), mix.len()),
        ));
    }
    Ok((rows, xs.len() / (rows * n)))
}

pub(super) fn hc_pre(dev: &Device, xs: &CudaBuf, mix: &CudaBuf, n: usize) -> Result<CudaBuf> {
    let (rows, d) = hc_dims("hc_pre", xs, mix, n)?;
    let y = CudaBuf::uninit(dev, rows * d)?;
    if d > 0 {
        dev.launch(
            "hc_pre_f32",
            Shape::elements(rows * d),
            args![y.ptr(), xs.ptr(), mix.ptr(), rows, n as i32, d],
        )?;
    }
    Ok(y)
}

pub(super) fn hc_post(
    dev: &Device,
    xs: &CudaBuf,
    y: &CudaBuf,
    mix: &CudaBuf,
    n: usize,
) -> Result<CudaBuf> {
    let (rows, d) = hc_dims("hc_post", xs, mix, n)?;
    if y.len() != rows * d {
        return Err(shape_err(
            "hc_post",
            format!("y of {} values for {rows} rows of {d}", y.len()),
        ));
    }
    let out = CudaBuf::uninit(dev, xs.len())?;
    if d > 0 {
        dev.launch(
            "hc_post_f32",
            Shape::elements(xs.len()),
            args![out.ptr(), xs.ptr(), y.ptr(), mix.ptr(), rows, n as i32, d],
        )?;
    }
    Ok(out)
}

pub(super) fn softmax_pool(
    dev: &Device,
    kv: &CudaBuf,
    gate: &CudaBuf,
    slots: usize,
    dim: usize,
) -> Result<CudaBuf> {
    if kv.len() != gate.len() || slots == 0 || dim == 0 || !kv.len().is_multiple_of(slots * dim) {
        return Err(shape_err(
            "softmax_pool",
            format!(
                "{} kv and {} gate values in groups of {slots}×{dim}",
                kv.len(),
                gate.len()
            ),
        ));
    }
    let n = kv.len() / (slots * dim);
    let y = CudaBuf::uninit(dev, n * dim)?;
    if n > 0 {
        dev.launch(
            "softmax_pool_f32",
            Shape::elements(n * dim),
            args![y.ptr(), kv.ptr(), gate.ptr(), n, slots, dim],
        )?;
    }
    Ok(y)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn index_scores(
    dev: &Device,
    q: &CudaBuf,
    weights: &CudaBuf,
    keys: &CudaBuf,
    rows: usize,
    heads: usize,
    dim: usize,
    scale: f32,
    w_scale: f32,
) -> Result<CudaBuf> {
    if dim == 0
        || q.len() != rows * heads * dim
        || weights.len() != rows * heads
        || !keys.len().is_multiple_of(dim)
    {
        return Err(shape_err(
            "index_scores",
            format!(
                "{} query values, {} weights for {rows} rows of {heads}×{dim}",
                q.len(),
                weights.len()
            ),
        ));
    }
    let e = keys.len() / dim;
    let y = CudaBuf::uninit(dev, rows * e)?;
    if rows * e > 0 {
        dev.launch(
            "index_scores_f32",
            Shape::warps(rows * e),
            args![
                y.ptr(),
                q.ptr(),
                weights.ptr(),
                keys.ptr(),
                rows,
                e,
                heads,
                dim,
                scale,
                w_scale
            ],
        )?;
    }
    Ok(y)
}

pub(super) fn kda_gate(
    dev: &Device,
    f: &CudaBuf,
    a: &CudaBuf,
    dt_bias: &CudaBuf,
    dim: usize,
    lower_bound: Option<f32>,
) -> Result<CudaBuf> {
    let c = dt_bias.len();
    if dim == 0 || c == 0 || c != a.len() * dim || !f.len().is_multiple_of(c) {
        return Err(shape_err(
            "kda_gate",
            format!(
                "{} values, {} heads, {c} biases for heads of {dim}",
                f.len(),
                a.len()
            ),
        ));
    }
    let y = CudaBuf::uninit(dev, f.len())?;
    if !f.is_empty() {
        dev.launch(
            "kda_gate_f32",
            Shape::elements(f.len()),
            args![
                y.ptr(),
                f.ptr(),
                a.ptr(),
                dt_bias.ptr(),
                f.len(),
                c,
                dim,
                lower_bound.is_some() as i32,
                lower_bound.unwrap_or(0.0)
            ],
        )?;
    }
    Ok(y)
}
