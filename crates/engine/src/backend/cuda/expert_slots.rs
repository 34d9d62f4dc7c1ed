//! The expert-parallel ops on the device ([`crate::backend::split`]): a
//! shard's slot outputs, the weighted sum over a group's merged slots, and
//! a routing taken from the host. `experts_swiglu` is exactly
//! `sum_slots(experts_slots(all experts))`: both run its launches.

use std::sync::Arc;

use super::buf::CudaBuf;
use super::device::{Device, Shape, args};
use super::linear::{check_stacks, slot_outputs};
use super::select::CudaRouting;
use super::weights::CudaExperts;
use crate::error::{EngineError, Result};

fn shape_err(op: &str, msg: String) -> EngineError {
    EngineError::State(format!("{op}: {msg}"))
}

/// `Backend::experts_slots`: the unweighted outputs `[rows·k, H]` of the
/// slots whose expert lies in `first .. first + E` (`E` the stacks'
/// experts, the routing's ids global), every other slot zero. An owned
/// slot runs the one-device kernels on its local expert id; another's runs
/// expert 0's product and is zeroed after (so no kernel learns of shards).
#[allow(clippy::too_many_arguments)]
pub(super) fn experts_slots(
    dev: &Device,
    x: &CudaBuf,
    rows: usize,
    routing: &CudaRouting,
    gate_up: &CudaExperts,
    down: &CudaExperts,
    limit: Option<f32>,
    first: usize,
) -> Result<CudaBuf> {
    check_stacks("experts_slots", x, rows, routing, gate_up, down)?;
    let h = gate_up.inp;
    let (k, count) = (routing.k, gate_up.e);
    let pairs = rows * k;
    if pairs == 0 || count == 0 {
        return super::buf::zeros(dev, pairs * h);
    }
    let local = dev.alloc::<u32>(pairs)?;
    let global = routing.experts.ptr();
    dev.launch(
        "experts_local_ids",
        Shape::elements(pairs),
        args![local.ptr(), global, pairs, first, count],
    )?;
    let ys = slot_outputs(dev, x, pairs, k, local.ptr(), gate_up, down, limit)?;
    dev.launch(
        "experts_zero_unowned",
        Shape::elements(pairs * h),
        args![ys.ptr(), global, pairs, h, first, count],
    )?;
    Ok(ys)
}

/// `Backend::sum_slots`: `out[t] = Σ_s w[t,s]·ys[t·k + s]`, slots in order
/// from 0 (`experts_combine`, the launch `experts_swiglu` ends with).
pub(super) fn sum_slots(
    dev: &Device,
    ys: &CudaBuf,
    rows: usize,
    routing: &CudaRouting,
    width: usize,
) -> Result<CudaBuf> {
    let k = routing.k;
    if routing.rows != rows || ys.len() != rows * k * width {
        return Err(shape_err(
            "sum_slots",
            format!(
                "{} values, a routing of {} rows × {k} slots, {rows} rows of width {width}",
                ys.len(),
                routing.rows
            ),
        ));
    }
    if rows * k == 0 || width == 0 {
        return super::buf::zeros(dev, rows * width);
    }
    let out = CudaBuf::uninit(dev, rows * width)?;
    dev.launch(
        "experts_combine",
        Shape::elements(rows * width),
        args![out.ptr(), ys.ptr(), routing.weights.ptr(), rows, k, width],
    )?;
    Ok(out)
}

/// `Backend::routing_upload`: a routing decided elsewhere (the home's,
/// read back), as this device's.
pub(super) fn routing_upload(
    dev: &Device,
    experts: &[usize],
    weights: &[f32],
    k: usize,
) -> Result<CudaRouting> {
    crate::backend::check_routing_upload(experts, weights, k)?;
    let ids = experts
        .iter()
        .map(|&e| u32::try_from(e))
        .collect::<std::result::Result<Vec<u32>, _>>()
        .map_err(|_| shape_err("routing_upload", "an expert id past u32".into()))?;
    Ok(CudaRouting {
        n_experts: experts.iter().max().map_or(0, |&e| e + 1),
        experts: Arc::new(dev.upload(&ids)?),
        weights: Arc::new(dev.upload(weights)?),
        rows: experts.len() / k,
        k,
    })
}
