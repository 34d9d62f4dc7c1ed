//! Expert parallel: one model over a group of devices of one backend
//! (issue 49's plan; the GPUs' transport is the collective library's, the
//! stand-in here copies through the host).
//!
//! [`Split`] is a backend: a family runs on it unchanged. Every op runs on
//! the home device (`devices[0]`: embeddings, attention, caches, dense and
//! shared weights, routing, norms, the head) except the routed experts:
//! each stack is cut by [`ExpertSplit`] into contiguous expert ranges, one
//! per device, and a layer's experts run by the [`exchange`] (rows out,
//! slot outputs back, the sum on the home in slot order). Its bits are the
//! home's alone, so [`Backend::id`] is the home's: a state made on a group
//! resumes on one device and the reverse.

pub mod exchange;
pub mod plan;

mod delegate;

use std::fmt;
use std::sync::Arc;

use crate::backend::{Backend, HostWeight};
use crate::error::{EngineError, Result};
use crate::quant::QuantTensor;

pub use exchange::{HostCopy, SplitExperts, Stats, Transport};
pub use plan::ExpertSplit;

/// A device group running one model (see the module documentation).
#[derive(Clone)]
pub struct Split<B: Backend> {
    devices: Arc<[B]>,
    plan: ExpertSplit,
    transport: Arc<dyn Transport<B>>,
    stats: Arc<exchange::Stats>,
}

impl<B: Backend> fmt::Debug for Split<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Split")
            .field("devices", &self.devices.len())
            .field("plan", &self.plan)
            .field("transport", &self.transport)
            .finish()
    }
}

impl<B: Backend> Split<B> {
    /// `devices` (the home first), each stack of experts cut by `plan`,
    /// buffers moved by `transport`.
    pub fn new(
        devices: Vec<B>,
        plan: ExpertSplit,
        transport: Arc<dyn Transport<B>>,
    ) -> Result<Self> {
        if devices.is_empty() || devices.len() != plan.devices() {
            return Err(EngineError::Device(format!(
                "an expert split over {} devices was given {}",
                plan.devices(),
                devices.len()
            )));
        }
        let home = devices[0].id();
        if let Some(other) = devices.iter().map(|d| d.id()).find(|id| *id != home) {
            // Kernels that differ would give a slot other bits than the home's.
            return Err(EngineError::Device(format!(
                "every device of a group must run the same kernels: {home} and {other}"
            )));
        }
        Ok(Self {
            stats: Arc::new(exchange::Stats::new(devices.len())),
            devices: devices.into(),
            plan,
            transport,
        })
    }

    /// The device that holds everything but the routed experts.
    pub fn home(&self) -> &B {
        &self.devices[0]
    }

    pub fn devices(&self) -> &[B] {
        &self.devices
    }

    pub fn plan(&self) -> &ExpertSplit {
        &self.plan
    }

    /// What the group's exchanges have moved so far.
    pub fn stats(&self) -> &exchange::Stats {
        &self.stats
    }

    fn group(&self) -> exchange::Group<'_, B> {
        exchange::Group {
            devices: &self.devices,
            transport: &*self.transport,
            stats: &self.stats,
        }
    }

    /// Place a stack `[E, out, in]`: each device its plan's experts.
    fn place_experts(
        &self,
        w: HostWeight,
        e: usize,
        out: usize,
        inp: usize,
    ) -> Result<SplitExperts<B>> {
        let ranges = self.plan.ranges(e);
        let w = w.on_host()?;
        let mut parts = Vec::with_capacity(ranges.len());
        for (dev, r) in self.devices.iter().zip(&ranges) {
            parts.push(if r.is_empty() {
                None
            } else {
                let part = expert_rows(&w, r.start, r.end, out, inp)?;
                Some(dev.experts(part, r.len(), out, inp)?)
            });
        }
        Ok(SplitExperts { ranges, parts })
    }
}

/// Experts `e0..e1` of a host stack `[E, out, in]`.
fn expert_rows(w: &HostWeight, e0: usize, e1: usize, out: usize, inp: usize) -> Result<HostWeight> {
    match w {
        HostWeight::F32(t) => {
            let t = t.reshape((t.elem_count() / (out * inp), out, inp))?;
            Ok(HostWeight::F32(t.narrow(0, e0, e1 - e0)?.contiguous()?))
        }
        HostWeight::Quant(q) => {
            let (r0, r1) = (e0 * out, e1 * out);
            if !q.can_cut(r0, r1) {
                return Err(EngineError::Device(format!(
                    "experts {e0}..{e1} cut a {} scale block",
                    q.ty
                )));
            }
            let mut part: QuantTensor = q.row_range(r0, r1);
            part.dims = vec![e1 - e0, out, inp];
            Ok(HostWeight::Quant(Arc::new(part)))
        }
        HostWeight::Synthetic(_) | HostWeight::Rows(_) => Err(EngineError::Unsupported(
            "an expert stack of mixed row types cannot be split across devices".into(),
        )),
    }
}
