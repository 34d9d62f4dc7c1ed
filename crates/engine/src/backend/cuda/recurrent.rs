//! The recurrent mixers on the device (`kernels/recurrent.cu`): the causal
//! conv with its sliding window, and the gated delta rule token by token
//! (one thread per value column of each head's state, the CPU reference's
//! order along the key dimension).

use super::buf::CudaBuf;
use super::device::{Device, Shape, args};
use crate::backend::{ScanDims, ScanPart};
use crate::error::{EngineError, Result};

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// Rows up to which a convolution runs as one launch (output and window
/// together); a prefill chunk keeps two (the output grid is its size).
const STEP_ROWS: usize = 8;

/// Threads per block of the register-resident delta-rule scans.
const SCAN_THREADS: u32 = 64;

pub(super) fn causal_conv_silu(
    dev: &Device,
    u: &CudaBuf,
    window: &mut CudaBuf,
    w: &CudaBuf,
    channels: usize,
    kernel: usize,
    dilation: usize,
) -> Result<CudaBuf> {
    let hist = kernel.saturating_sub(1) * dilation;
    let bad = channels == 0
        || kernel == 0
        || window.len() != hist * channels
        || w.len() != channels * kernel
        || !u.len().is_multiple_of(channels);
    if bad {
        return Err(shape_err(
            "causal_conv_silu",
            format!(
                "u {} / window {} / weights {} for {channels} channels, kernel {kernel}, \
                 dilation {dilation}",
                u.len(),
                window.len(),
                w.len()
            ),
        ));
    }
    let t_len = u.len() / channels;
    let out = CudaBuf::uninit(dev, u.len())?;
    if t_len == 0 {
        return Ok(out);
    }
    if hist > 0 && t_len <= STEP_ROWS {
        // A decode step or verify window: the output and the new window
        // in one launch (the formulas of the two kernels below).
        let next = CudaBuf::uninit(dev, hist * channels)?;
        dev.launch(
            "causal_conv_silu_window_f32",
            Shape::elements(t_len.max(hist) * channels),
            args![
                out.ptr(),
                next.ptr(),
                u.ptr(),
                window.ptr(),
                w.ptr(),
                t_len,
                channels,
                kernel,
                dilation,
                hist
            ],
        )?;
        *window = next;
        return Ok(out);
    }
    dev.launch(
        "causal_conv_silu_f32",
        Shape::elements(t_len * channels),
        args![
            out.ptr(),
            u.ptr(),
            window.ptr(),
            w.ptr(),
            t_len,
            channels,
            kernel,
            dilation,
            hist
        ],
    )?;
    if hist > 0 {
        // A new window: the old one is read by the kernel queued above.
        let next = CudaBuf::uninit(dev, hist * channels)?;
        dev.launch(
            "conv_window_f32",
            Shape::elements(hist * channels),
            args![next.ptr(), u.ptr(), window.ptr(), t_len, channels, hist],
        )?;
        *window = next;
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn delta_rule_scan(
    dev: &Device,
    d: ScanDims,
    q: &CudaBuf,
    k: &CudaBuf,
    v: &CudaBuf,
    g: &CudaBuf,
    beta: &CudaBuf,
    s: &mut CudaBuf,
) -> Result<CudaBuf> {
    let dims_ok = d.hk > 0 && d.hv > 0 && d.dk > 0 && d.dv > 0 && d.hv.is_multiple_of(d.hk);
    let t_len = if dims_ok { beta.len() / d.hv } else { 0 };
    // `g` holds one log-decay per head (GDN) or per key channel (KDA), as
    // the CPU reference decides.
    let per_channel = g.len() == t_len * d.hv * d.dk && d.dk != 1;
    let ok = dims_ok
        && beta.len() == t_len * d.hv
        && q.len() == t_len * d.hk * d.dk
        && k.len() == q.len()
        && v.len() == t_len * d.hv * d.dv
        && (per_channel || g.len() == t_len * d.hv)
        && s.len() == d.hv * d.dk * d.dv;
    if !ok {
        return Err(shape_err(
            "delta_rule_scan",
            format!(
                "q {} k {} v {} g {} β {} state {} for {d:?}",
                q.len(),
                k.len(),
                v.len(),
                g.len(),
                beta.len(),
                s.len()
            ),
        ));
    }
    let o = CudaBuf::uninit(dev, t_len * d.hv * d.dv)?;
    if t_len == 0 {
        return Ok(o);
    }
    let sp = s.own_ptr(dev)?;
    // The state column in registers for the common key sizes (the same
    // operations in the same order as the generic kernel).
    let name = match d.dk {
        128 => "delta_rule_scan_dk128_f32",
        64 => "delta_rule_scan_dk64_f32",
        _ => "delta_rule_scan_f32",
    };
    let generic = name == "delta_rule_scan_f32";
    if !generic {
        dev.launch(
            name,
            // A thread holds a whole state column (dk registers), so a
            // block of 256 filled an SM's register file and a decode
            // step's 6144 columns ran on 24 SMs; blocks of 64 spread them
            // over 96. Each column's operations are unchanged.
            Shape::elements_in(d.hv * d.dv, SCAN_THREADS),
            args![
                o.ptr(),
                sp,
                q.ptr(),
                k.ptr(),
                v.ptr(),
                g.ptr(),
                beta.ptr(),
                t_len,
                d.hk,
                d.hv,
                d.dv,
                per_channel as i32
            ],
        )?;
        return Ok(o);
    }
    dev.launch(
        "delta_rule_scan_f32",
        Shape::elements(d.hv * d.dv),
        args![
            o.ptr(),
            sp,
            q.ptr(),
            k.ptr(),
            v.ptr(),
            g.ptr(),
            beta.ptr(),
            t_len,
            d.hk,
            d.hv,
            d.dk,
            d.dv,
            per_channel as i32
        ],
    )?;
    Ok(o)
}

/// `Backend::delta_rule_scan_parts`: every session's scan in one launch
/// (`delta_rule_scan_parts_dk{64,128}_f32`, a table of each session's
/// state, inputs, first output row and rows), where a batch made a launch
/// a session and layer (1,084 of a 64-session qwen4_exp batch, run 41);
/// other key sizes, a single part, mixed decay kinds or a capture (no
/// uploads there) are left to the caller to scan part by part (`None`).
/// Each column's operations are those of the session's scan alone.
pub(super) fn delta_rule_scan_parts(
    dev: &Device,
    d: ScanDims,
    parts: &mut [ScanPart<'_, CudaBuf>],
) -> Result<Option<CudaBuf>> {
    let name = match d.dk {
        128 => "delta_rule_scan_parts_dk128_f32",
        64 => "delta_rule_scan_parts_dk64_f32",
        _ => "",
    };
    let dims_ok = d.hk > 0 && d.hv > 0 && d.dv > 0 && d.hv.is_multiple_of(d.hk);
    // Each part's rows, and whether its decay is per key channel.
    let shapes: Vec<Option<(usize, bool)>> = parts
        .iter()
        .map(|p| {
            let t = p.beta.len() / d.hv.max(1);
            let per_channel = p.g.len() == t * d.hv * d.dk && d.dk != 1;
            let ok = dims_ok
                && p.beta.len() == t * d.hv
                && p.q.len() == t * d.hk * d.dk
                && p.k.len() == p.q.len()
                && p.v.len() == t * d.hv * d.dv
                && (per_channel || p.g.len() == t * d.hv)
                && p.s.len() == d.hv * d.dk * d.dv;
            ok.then_some((t, per_channel))
        })
        .collect();
    let one_kind = shapes
        .iter()
        .all(|s| s.is_some_and(|(_, pc)| Some(pc) == shapes[0].map(|s| s.1)));
    if name.is_empty() || parts.len() < 2 || !one_kind || dev.pool.capturing() {
        return Ok(None);
    }
    let total: usize = shapes.iter().flatten().map(|s| s.0).sum();
    let per_channel = shapes[0].is_some_and(|s| s.1);
    let o = CudaBuf::uninit(dev, total * d.hv * d.dv)?;
    let mut table: Vec<u64> = Vec::with_capacity(8 * parts.len());
    let mut at = 0;
    for (p, shape) in parts.iter_mut().zip(&shapes) {
        let t = shape.map_or(0, |s| s.0);
        table.extend([
            p.s.own_ptr(dev)?,
            p.q.ptr(),
            p.k.ptr(),
            p.v.ptr(),
            p.g.ptr(),
            p.beta.ptr(),
            at as u64,
            t as u64,
        ]);
        at += t;
    }
    if total == 0 {
        return Ok(Some(o));
    }
    let table = dev.upload(&table)?;
    dev.launch(
        name,
        Shape::elements_in(parts.len() * d.hv * d.dv, SCAN_THREADS),
        args![
            o.ptr(),
            table.ptr(),
            parts.len(),
            d.hk,
            d.hv,
            d.dv,
            per_channel as i32
        ],
    )?;
    Ok(Some(o))
}
