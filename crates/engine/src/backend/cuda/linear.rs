//! Matrix products on the device: `matmul` (f32, Q8_0, Q4_1, and every
//! other stored type through `stored.rs`) and the routed SwiGLU experts
//! (`kernels/matmul.cu`, `kernels/stored.cu`). f32 and stored products
//! follow the CPU reference's reduction sequence; Q8_0 / Q4_1 run a warp per
//! output row in an order of their own. Either way the row loop is inside
//! the kernel, so one compiled code serves every row count.

use super::buf::CudaBuf;
use super::device::{Device, Shape, args, ptr};
use super::elementwise::{ChainFields, chain_args, chain_fields, swiglu, unary_chain};
use super::fast8;
use super::select::CudaRouting;
use super::stored;
use super::weights::{BlockKind, CudaExperts, CudaMatrix, ExpertWeights};
use super::window_rows::{per_row, per_row_window};
use crate::backend::{Epilogue, Unary};
use crate::error::{EngineError, Result};

/// Output columns per block of the product kernels (8 threads each).
const COLUMNS_PER_BLOCK: usize = 32;
/// Output rows per block of the block-format products (a warp each).
const ROWS_PER_BLOCK: usize = 8;
/// Block-format matrices at least this long run `matmul_*_split` (eight
/// warps per output row, so the order depends on k alone): a warp per row
/// left the GPU idle on the hyper-connection mixers' [4, 10240] and
/// [320, 10240], and ran the [2560, 6144] output projections at 15%
/// occupancy (decode 1.01–1.02× split, run 19). Expert stacks (k = 2560 or
/// 640 at full size) never match, so a routed product keeps the bits of
/// `matmul_block`.
const SPLIT_FROM_K: usize = 4096;
/// Blocks along y (pairs of a gathered product) at most; the kernel loops.
const MAX_GRID_Y: usize = 65_535;

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

fn columns(n: usize, pairs: usize) -> Shape {
    Shape {
        grid: (
            n.div_ceil(COLUMNS_PER_BLOCK).max(1) as u32,
            pairs.clamp(1, MAX_GRID_Y) as u32,
        ),
        block: (COLUMNS_PER_BLOCK * 8) as u32,
    }
}

/// `chain(x·wᵀ)`: [`crate::backend::Backend::matmul_unary`] (an empty chain
/// is the plain product). One-row block products apply the chain as they
/// store (one launch); the others run the product, then `unary_chain`.
pub(super) fn matmul(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    w: &CudaMatrix,
    chain: &[Unary],
) -> Result<CudaBuf> {
    let (n, k) = w.dims();
    if x.len() != rows * k {
        return Err(shape_err(
            "matmul",
            format!("{} values are not [{rows}, {k}]", x.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, rows * n)?;
    if rows == 0 || n == 0 {
        return Ok(y);
    }
    let shape = columns(n, 1);
    match w {
        // The fast set's int8 products apply the chain as they store.
        CudaMatrix::Fast { .. } => {
            let part = fast_part(w, chain)
                .ok_or_else(|| shape_err("matmul", format!("{w:?} is not a fast matrix")))?;
            let mut ys = fast8::products(dev, x, rows, &[part])?;
            return ys
                .pop()
                .ok_or_else(|| shape_err("matmul", "no output".into()));
        }
        CudaMatrix::F32 { w, .. } => dev.launch(
            "matmul_f32",
            shape,
            args![y.ptr(), x.ptr(), rows, ptr(w), n, k],
        )?,
        // Stored types: the CPU's f32 sequence over exactly dequantized
        // weights (any chain as a second launch).
        CudaMatrix::Stored { w, .. } => stored::matmul(dev, &y, x, rows, w)?,
        CudaMatrix::Block {
            kind, dm, quants, ..
        } => {
            // One warp per output row; for few long rows a block of eight
            // warps per output row (the kernel's own order, chosen by the
            // matrix's shape alone so every row count gives the same bits).
            let split = split_form(k);
            // A verify window's few rows run the one-row kernels once per
            // row (`window_rows.rs`).
            let window = per_row_window(rows);
            let one = rows == 1 || window;
            let shape = if split {
                Shape::blocks(n, 256)
            } else if one {
                warp_rows(n.div_ceil(ONE_ROWS))
            } else {
                warp_rows(n)
            };
            // One activation row (decode) has kernels of its own: the same
            // arithmetic, loading ahead, without the several-row path's
            // registers (`kernels/matmul.cu`).
            let name = match (kind, split, one) {
                (BlockKind::Q4_1, false, false) => "matmul_q4_1",
                (BlockKind::Q8_0, false, false) => "matmul_q8_0",
                (BlockKind::Q4_1, true, false) => "matmul_q4_1_split",
                (BlockKind::Q8_0, true, false) => "matmul_q8_0_split",
                (BlockKind::Q4_1, false, true) => "matmul_q4_1_one",
                (BlockKind::Q8_0, false, true) => "matmul_q8_0_one",
                (BlockKind::Q4_1, true, true) => "matmul_q4_1_split_one",
                (BlockKind::Q8_0, true, true) => "matmul_q8_0_split_one",
            };
            if one {
                // The one-row kernels take their row from blockIdx.y.
                let shape = per_row(shape, rows);
                let mut a = args![y.ptr(), x.ptr(), ptr(dm), ptr(quants), n, k].to_vec();
                a.extend(chain_args("matmul_unary", chain)?);
                dev.launch(name, shape, &a)?;
                return Ok(y);
            } else {
                dev.launch(
                    name,
                    shape,
                    args![y.ptr(), x.ptr(), rows, ptr(dm), ptr(quants), n, k],
                )?
            }
        }
    }
    if chain.is_empty() {
        Ok(y)
    } else {
        unary_chain(dev, &y, chain)
    }
}

/// Output rows per warp of the one-row block products (`matmul_block_one`
/// in `matmul.cu`).
const ONE_ROWS: usize = 2;

/// Output rows per warp of the routed block products without SwiGLU
/// (`four_row_sums` in `matmul.cu`).
const GATHER_ROWS: usize = 4;

/// Products in one `matmul_*_many` launch at most (`MANY_PARTS` in
/// `matmul.cu`).
const MANY_PARTS: usize = 4;

/// One part of a `Many` launch: `ManyPart` of `matmul.cu`, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ManyPart {
    dm: u64,
    quants: u64,
    y: u64,
    n: u64,
    first: u64,
    x_off: u64,
    y_stride: u64,
    swiglu: i32,
    has_limit: i32,
    limit: f32,
    chain: ChainFields,
}

/// Groups one `matmul_f32_grouped` launch takes (`GF32_GROUPS` in
/// `matmul.cu`).
const GF32_GROUPS: usize = 64;

/// The `GroupedF32` parameter of `matmul.cu`'s `matmul_f32_grouped`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupedF32Args {
    y: u64,
    x: u64,
    rows: u64,
    n: u64,
    k: u64,
    x_stride: u64,
    y_stride: u64,
    w: [u64; GF32_GROUPS],
}

/// [`matmul_grouped`] of f32 matrices of one shape: `matmul_f32_grouped`,
/// up to [`GF32_GROUPS`] groups a launch (each output `matmul_f32`'s
/// sequence, so the bits of the split, per-group products and join).
/// `None` when the parts are not all f32 of one shape.
fn grouped_f32(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[&CudaMatrix],
) -> Result<Option<CudaBuf>> {
    let Some(CudaMatrix::F32 { out, inp, .. }) = parts.first().copied() else {
        return Ok(None);
    };
    let (g, n, k) = (parts.len(), *out, *inp);
    let mut ws = Vec::with_capacity(g);
    for w in parts {
        match w {
            CudaMatrix::F32 { w, out, inp } if *out == n && *inp == k => ws.push(ptr(w)),
            _ => return Ok(None),
        }
    }
    if x.len() != rows * g * k {
        return Err(shape_err(
            "matmul_grouped",
            format!("{} values are not [{rows}, {g}×{k}]", x.len()),
        ));
    }
    let y = CudaBuf::uninit(dev, rows * g * n)?;
    if rows == 0 || n == 0 {
        return Ok(Some(y));
    }
    // f32 values: 4 bytes each.
    for (c, chunk) in ws.chunks(GF32_GROUPS).enumerate() {
        let g0 = c * GF32_GROUPS;
        let mut w = [0u64; GF32_GROUPS];
        w[..chunk.len()].copy_from_slice(chunk);
        let a = GroupedF32Args {
            y: y.ptr() + (4 * g0 * n) as u64,
            x: x.ptr() + (4 * g0 * k) as u64,
            rows: rows as u64,
            n: n as u64,
            k: k as u64,
            x_stride: (g * k) as u64,
            y_stride: (g * n) as u64,
            w,
        };
        dev.launch_grouped_f32(columns(n, chunk.len()), &a)?;
    }
    Ok(Some(y))
}

/// The `Many` parameter of `matmul.cu`'s `matmul_*_many` kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ManyArgs {
    x: u64,
    k: u64,
    x_stride: u64,
    parts: u64,
    p: [ManyPart; MANY_PARTS],
}

/// Whether `matmul` runs a block matrix `[n, k]` in the split form.
fn split_form(k: usize) -> bool {
    k >= SPLIT_FROM_K
}

/// [`crate::backend::Backend::matmul_many`]: one launch when the call is
/// one activation row (or a verify window's 2..=4, `window_rows.rs`) and every part is a block matrix of one format and
/// one kernel form (SwiGLU parts only in the warp form); otherwise the
/// parts one by one. Either way each part has the bits of its own
/// `matmul_unary` (or `matmul` then `swiglu`).
pub(super) fn matmul_many(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[(&CudaMatrix, Epilogue<'_>)],
) -> Result<Vec<CudaBuf>> {
    if let Some(outs) = many_in_one(dev, x, rows, parts)? {
        return Ok(outs);
    }
    if let Some(outs) = many_fast(dev, x, rows, parts)? {
        return Ok(outs);
    }
    parts
        .iter()
        .map(|&(w, then)| match then {
            Epilogue::Chain(chain) => matmul(dev, x, rows, w, chain),
            Epilogue::Swiglu(limit) => {
                let gu = matmul(dev, x, rows, w, &[])?;
                swiglu(dev, &gu, w.dims().0 / 2, limit)
            }
        })
        .collect()
}

/// A fast-set matrix as `fast8` reads it, with the chain it stores
/// through (`None` for the other forms).
fn fast_part<'a>(w: &CudaMatrix, chain: &'a [Unary]) -> Option<fast8::F8Matrix<'a>> {
    match w {
        CudaMatrix::Fast {
            kind,
            dm,
            quants,
            out,
            inp,
        } => Some(fast8::F8Matrix {
            kind: *kind,
            dm: ptr(dm),
            quants: ptr(quants),
            out: *out,
            inp: *inp,
            chain,
        }),
        _ => None,
    }
}

/// Parts that are all fast-set matrices of one format and length: one
/// rounding of `x` and one launch per four (SwiGLU parts then `swiglu`),
/// each output the bits of its own `matmul_unary` / `matmul` + `swiglu`.
fn many_fast(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[(&CudaMatrix, Epilogue<'_>)],
) -> Result<Option<Vec<CudaBuf>>> {
    let mut fast = Vec::with_capacity(parts.len());
    for &(w, then) in parts {
        let chain = match then {
            Epilogue::Chain(chain) => chain,
            Epilogue::Swiglu(_) => &[],
        };
        let Some(p) = fast_part(w, chain) else {
            return Ok(None);
        };
        fast.push(p);
    }
    let same = fast
        .windows(2)
        .all(|w| w[0].kind == w[1].kind && w[0].inp == w[1].inp);
    if parts.len() < 2 || !same {
        return Ok(None);
    }
    let outs = fast8::products(dev, x, rows, &fast)?;
    parts
        .iter()
        .zip(outs)
        .map(|(&(w, then), y)| match then {
            Epilogue::Chain(_) => Ok(y),
            Epilogue::Swiglu(limit) => swiglu(dev, &y, w.dims().0 / 2, limit),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn many_in_one(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[(&CudaMatrix, Epilogue<'_>)],
) -> Result<Option<Vec<CudaBuf>>> {
    if parts.len() < 2 || parts.len() > MANY_PARTS {
        return Ok(None);
    }
    let (_, k) = parts[0].0.dims();
    let mut form = None;
    for &(w, then) in parts {
        let CudaMatrix::Block { kind, out, inp, .. } = w else {
            return Ok(None);
        };
        let this = (*kind, split_form(*inp));
        let swiglu = matches!(then, Epilogue::Swiglu(_));
        let fits = *inp == k
            && *out > 0
            && form.is_none_or(|f| f == this)
            && !(swiglu && (this.1 || out % 2 != 0));
        if !fits {
            return Ok(None);
        }
        form = Some(this);
    }
    let Some((kind, split)) = form else {
        return Ok(None);
    };
    let window = per_row_window(rows);
    if rows != 1 && !window {
        return Ok(None);
    }
    if x.len() != rows * k {
        return Err(shape_err(
            "matmul_many",
            format!("{} values are not [{rows}, {k}]", x.len()),
        ));
    }
    let mut a = ManyArgs {
        x: x.ptr(),
        k: k as u64,
        x_stride: k as u64,
        parts: parts.len() as u64,
        ..Default::default()
    };
    let mut outs = Vec::with_capacity(parts.len());
    let mut first = 0;
    for (i, &(w, then)) in parts.iter().enumerate() {
        let CudaMatrix::Block {
            dm, quants, out, ..
        } = w
        else {
            unreachable!("checked above")
        };
        let (n, swiglu, limit, chain) = match then {
            Epilogue::Chain(chain) => (*out, false, None, chain_fields("matmul_many", chain)?),
            Epilogue::Swiglu(limit) => (out / 2, true, limit, ChainFields::default()),
        };
        let y = CudaBuf::uninit(dev, rows * n)?;
        a.p[i] = ManyPart {
            dm: ptr(dm),
            quants: ptr(quants),
            y: y.ptr(),
            n: n as u64,
            first: first as u64,
            x_off: 0,
            y_stride: n as u64,
            swiglu: swiglu as i32,
            has_limit: limit.is_some() as i32,
            limit: limit.unwrap_or(0.0),
            chain,
        };
        first += n;
        outs.push(y);
    }
    // SwiGLU parts have kernels of their own (the two-row path's registers).
    let swiglu = parts.iter().any(|(_, e)| matches!(e, Epilogue::Swiglu(_)));
    let (name, shape) = match (kind, split) {
        (BlockKind::Q4_1, false) if swiglu => ("matmul_q4_1_many_swiglu", warp_rows(first)),
        (BlockKind::Q8_0, false) if swiglu => ("matmul_q8_0_many_swiglu", warp_rows(first)),
        (BlockKind::Q4_1, false) => ("matmul_q4_1_many", warp_rows(first)),
        (BlockKind::Q8_0, false) => ("matmul_q8_0_many", warp_rows(first)),
        (BlockKind::Q4_1, true) => ("matmul_q4_1_split_many", Shape::blocks(first, 256)),
        (BlockKind::Q8_0, true) => ("matmul_q8_0_split_many", Shape::blocks(first, 256)),
    };
    // One row of blocks per activation row (grid y).
    dev.launch_many(name, per_row(shape, rows), &a)?;
    Ok(Some(outs))
}

/// [`crate::backend::Backend::matmul_grouped`] in `matmul_*_many` launches
/// of up to [`MANY_PARTS`] groups each, where the call is one activation
/// row (or a verify window's 2..=4) and the groups are block matrices of
/// one format and shape: each group reads its own columns of `x` and writes
/// its own columns of the output, with its own `matmul`'s bits; fast-set
/// groups of one shape in `fast8::grouped` at any row count. `None`: the
/// caller runs the composed form.
pub(super) fn matmul_grouped(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    parts: &[&CudaMatrix],
) -> Result<Option<CudaBuf>> {
    if let Some(y) = grouped_f32(dev, x, rows, parts)? {
        return Ok(Some(y));
    }
    let fast: Option<Vec<_>> = parts.iter().map(|w| fast_part(w, &[])).collect();
    if let Some(fast) = fast
        && !fast.is_empty()
    {
        let (kind, out, inp) = (fast[0].kind, fast[0].out, fast[0].inp);
        if fast
            .iter()
            .all(|p| p.kind == kind && p.out == out && p.inp == inp)
        {
            return fast8::grouped(dev, x, rows, &fast).map(Some);
        }
        return Ok(None);
    }
    let Some(CudaMatrix::Block { kind, out, inp, .. }) = parts.first().copied() else {
        return Ok(None);
    };
    let (kind, out, inp) = (*kind, *out, *inp);
    let same = parts.iter().all(|w| {
        matches!(w, CudaMatrix::Block { kind: k2, out: o2, inp: i2, .. }
            if *k2 == kind && *o2 == out && *i2 == inp)
    });
    let (g, n, k) = (parts.len(), out, inp);
    if !same || n == 0 || k == 0 || !(rows == 1 || per_row_window(rows)) {
        return Ok(None);
    }
    if x.len() != rows * g * k {
        return Err(shape_err(
            "matmul_grouped",
            format!("{} values are not [{rows}, {g}×{k}]", x.len()),
        ));
    }
    let split = split_form(k);
    let y = CudaBuf::uninit(dev, rows * g * n)?;
    let chain = chain_fields("matmul_grouped", &[])?;
    for (c, chunk) in parts.chunks(MANY_PARTS).enumerate() {
        let mut a = ManyArgs {
            x: x.ptr(),
            k: k as u64,
            x_stride: (g * k) as u64,
            parts: chunk.len() as u64,
            ..Default::default()
        };
        for (i, w) in chunk.iter().enumerate() {
            let CudaMatrix::Block { dm, quants, .. } = w else {
                unreachable!("checked above")
            };
            let group = c * MANY_PARTS + i;
            a.p[i] = ManyPart {
                dm: ptr(dm),
                quants: ptr(quants),
                y: y.ptr() + (4 * group * n) as u64,
                n: n as u64,
                first: (i * n) as u64,
                x_off: (group * k) as u64,
                y_stride: (g * n) as u64,
                swiglu: 0,
                has_limit: 0,
                limit: 0.0,
                chain,
            };
        }
        let units = chunk.len() * n;
        let (name, shape) = match (kind, split) {
            (BlockKind::Q4_1, false) => ("matmul_q4_1_many", warp_rows(units)),
            (BlockKind::Q8_0, false) => ("matmul_q8_0_many", warp_rows(units)),
            (BlockKind::Q4_1, true) => ("matmul_q4_1_split_many", Shape::blocks(units, 256)),
            (BlockKind::Q8_0, true) => ("matmul_q8_0_split_many", Shape::blocks(units, 256)),
        };
        dev.launch_many(name, per_row(shape, rows), &a)?;
    }
    Ok(Some(y))
}

/// A warp per output row, [`ROWS_PER_BLOCK`] warps per block.
fn warp_rows(n: usize) -> Shape {
    Shape {
        grid: (n.div_ceil(ROWS_PER_BLOCK) as u32, 1),
        block: (ROWS_PER_BLOCK * 32) as u32,
    }
}

/// Stream gates at most in `matmul_*_gated_mean` (`MEAN_STREAMS` in
/// `matmul.cu`).
const MEAN_STREAMS: usize = 8;

/// [`crate::backend::Backend::matmul_gated_mean`]: one launch for one
/// activation row (or a verify window's 2..=4, `window_rows.rs`) and a block
/// matrix in the warp form (a warp per output
/// column computes its `C` gate rows, then the mean with the streams, as
/// `gated_mean_streams_f32`), else the product then the mix.
pub(super) fn matmul_gated_mean(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    w: &CudaMatrix,
    streams: &CudaBuf,
    c: usize,
    h: usize,
) -> Result<CudaBuf> {
    let (n, k) = w.dims();
    // One row, or a verify window's rows with the one-row kernel once per
    // row (grid y, `window_rows.rs`).
    let window = per_row_window(rows);
    if let CudaMatrix::Block {
        kind, dm, quants, ..
    } = w
        && (rows == 1 || window)
        && c > 0
        && c <= MEAN_STREAMS
        && n == c * h
        && !split_form(k)
    {
        if x.len() != rows * k || streams.len() != rows * n {
            return Err(shape_err(
                "matmul_gated_mean",
                format!(
                    "{} inputs and {} stream values for {rows} rows of [{n}, {k}] in {c} streams",
                    x.len(),
                    streams.len()
                ),
            ));
        }
        let y = CudaBuf::uninit(dev, rows * h)?;
        let name = match kind {
            BlockKind::Q4_1 => "matmul_q4_1_gated_mean",
            BlockKind::Q8_0 => "matmul_q8_0_gated_mean",
        };
        let inv = (1f64 / c as f64) as f32;
        dev.launch(
            name,
            per_row(warp_rows(h), rows),
            args![
                y.ptr(),
                x.ptr(),
                ptr(dm),
                ptr(quants),
                streams.ptr(),
                c,
                h,
                k,
                inv
            ],
        )?;
        return Ok(y);
    }
    let g = matmul(dev, x, rows, w, &[])?;
    super::elementwise::gated_mean_streams(dev, &g, streams, c, h)
}

/// `x: [rows, H]`, a routing of `rows` rows, and stacks that chain
/// (`gate_up: [E, 2I, H]`, `down: [E, H, I]`): the shapes every routed
/// product checks.
pub(super) fn check_stacks(
    op: &str,
    x: &CudaBuf,
    rows: usize,
    routing: &CudaRouting,
    gate_up: &CudaExperts,
    down: &CudaExperts,
) -> Result<()> {
    let (h, two_i) = (gate_up.inp, gate_up.out);
    let inter = two_i / 2;
    let ok = x.len() == rows * h
        && routing.rows == rows
        && two_i == 2 * inter
        && down.e == gate_up.e
        && down.out == h
        && down.inp == inter;
    if ok {
        return Ok(());
    }
    Err(shape_err(
        op,
        format!(
            "{} values for {rows} rows, routing of {} rows, {gate_up:?} / {down:?}",
            x.len(),
            routing.rows
        ),
    ))
}

/// `out[t] = Σ_k w[t,k]·down_e(act(gate_up_e·x_t))`: gate/up for every
/// (token, slot) pair in one launch, SwiGLU, down in one launch, then the
/// slots summed in order; with `gated = (shared, gate)`, plus
/// `shared[t]·sigmoid(gate[t])` as `add_gated_rows_f32` adds it, in the
/// summing launch.
#[allow(clippy::too_many_arguments)]
pub(super) fn experts_swiglu(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    routing: &CudaRouting,
    gate_up: &CudaExperts,
    down: &CudaExperts,
    limit: Option<f32>,
    gated: Option<(&CudaBuf, &CudaBuf)>,
) -> Result<CudaBuf> {
    check_stacks("experts_swiglu", x, rows, routing, gate_up, down)?;
    if routing.n_experts > gate_up.e {
        return Err(shape_err(
            "experts_swiglu",
            format!("a routing over {} experts, {gate_up:?}", routing.n_experts),
        ));
    }
    let h = gate_up.inp;
    if let Some((shared, gate)) = gated
        && (shared.len() != rows * h || gate.len() != rows)
    {
        return Err(shape_err(
            "experts_swiglu_gated",
            format!(
                "shared {} and gate {} values for {rows} rows of {h}",
                shared.len(),
                gate.len()
            ),
        ));
    }
    let k = routing.k;
    let pairs = rows * k;
    if pairs == 0 {
        let zeros = super::buf::zeros(dev, rows * h)?;
        return match gated {
            Some((shared, gate)) if rows > 0 => {
                super::elementwise::add_gated_rows(dev, &zeros, shared, gate, h)
            }
            _ => Ok(zeros),
        };
    }
    let ys = slot_outputs(
        dev,
        x,
        pairs,
        k,
        routing.experts.ptr(),
        gate_up,
        down,
        limit,
    )?;
    let out = CudaBuf::uninit(dev, rows * h)?;
    match gated {
        None => dev.launch(
            "experts_combine",
            Shape::elements(rows * h),
            args![out.ptr(), ys.ptr(), routing.weights.ptr(), rows, k, h],
        )?,
        Some((shared, gate)) => dev.launch(
            "experts_combine_gated",
            Shape::elements(rows * h),
            args![
                out.ptr(),
                ys.ptr(),
                routing.weights.ptr(),
                rows,
                k,
                h,
                shared.ptr(),
                gate.ptr()
            ],
        )?,
    }
    Ok(out)
}

/// The unweighted output of every (token, slot) pair, `[pairs, H]`:
/// `down_e(act(gate_up_e·x_{p / k}))` with `e = experts[p]` (device ids
/// into these stacks, `pairs ≥ 1`): gate/up for every pair in one launch,
/// SwiGLU, down in one launch. Each pair's output depends on its row and
/// expert alone (the sum over slots is the caller's).
#[allow(clippy::too_many_arguments)]
pub(super) fn slot_outputs(
    dev: &Device,
    x: &CudaBuf,
    pairs: usize,
    k: usize,
    experts: u64,
    gate_up: &CudaExperts,
    down: &CudaExperts,
    limit: Option<f32>,
) -> Result<CudaBuf> {
    let (h, two_i) = (gate_up.inp, gate_up.out);
    let inter = two_i / 2;
    let act = CudaBuf::uninit(dev, pairs * inter)?;
    if let ExpertWeights::Block { kind, dm, quants } = &gate_up.w {
        // Block stacks: gate, up and SwiGLU in one launch (the bits of the
        // gathered product then `swiglu_f32`, `kernels/matmul.cu`).
        let name = match kind {
            BlockKind::Q4_1 => "matmul_q4_1_gather_swiglu",
            BlockKind::Q8_0 => "matmul_q8_0_gather_swiglu",
        };
        dev.launch(
            name,
            gather_rows(inter, pairs),
            args![
                act.ptr(),
                x.ptr(),
                k,
                experts,
                pairs,
                ptr(dm),
                ptr(quants),
                two_i,
                h,
                limit.is_some() as i32,
                limit.unwrap_or(0.0)
            ],
        )?;
    } else {
        let gu = CudaBuf::uninit(dev, pairs * two_i)?;
        gather_product(dev, &gu, x, k, experts, pairs, gate_up)?;
        dev.launch(
            "swiglu_f32",
            Shape::elements(pairs * inter),
            args![
                act.ptr(),
                gu.ptr(),
                pairs,
                inter,
                limit.is_some() as i32,
                limit.unwrap_or(0.0)
            ],
        )?;
    }
    let ys = CudaBuf::uninit(dev, pairs * h)?;
    gather_product(dev, &ys, &act, 1, experts, pairs, down)?;
    Ok(ys)
}

/// `y[p] = w_{experts[p]} · x[p / x_div]` for every pair, one launch.
fn gather_product(
    dev: &Device,
    y: &CudaBuf,
    x: &CudaBuf,
    x_div: usize,
    experts: u64,
    pairs: usize,
    w: &CudaExperts,
) -> Result<()> {
    let (n, k) = (w.out, w.inp);
    match &w.w {
        ExpertWeights::F32(wf) => dev.launch(
            "matmul_f32_gather",
            columns(n, pairs),
            args![y.ptr(), x.ptr(), x_div, experts, pairs, ptr(wf), n, k],
        ),
        ExpertWeights::Block { kind, dm, quants } => {
            let name = match kind {
                BlockKind::Q4_1 => "matmul_q4_1_gather",
                BlockKind::Q8_0 => "matmul_q8_0_gather",
            };
            dev.launch(
                name,
                gather_rows(n.div_ceil(GATHER_ROWS), pairs),
                args![
                    y.ptr(),
                    x.ptr(),
                    x_div,
                    experts,
                    pairs,
                    ptr(dm),
                    ptr(quants),
                    n,
                    k
                ],
            )
        }
        ExpertWeights::Stored(sw) => stored::gather(dev, y, x, x_div, experts, pairs, sw, n),
    }
}

/// A warp per output row and pair of a gathered block product.
fn gather_rows(n: usize, pairs: usize) -> Shape {
    Shape {
        grid: (
            n.div_ceil(ROWS_PER_BLOCK) as u32,
            pairs.clamp(1, MAX_GRID_Y) as u32,
        ),
        block: (ROWS_PER_BLOCK * 32) as u32,
    }
}
