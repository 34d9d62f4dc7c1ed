//! One MoE layer across a device group: the exchange order, the transport
//! that moves rows, and the run.
//!
//! Why the bits do not depend on the split: each slot's output
//! `down_e(act(gate_up_e·x_t))` is computed whole by the one device holding
//! expert `e`, with the kernel one device would use ([`Backend::experts_slots`],
//! row-independent); the devices' slot buffers meet on the home, where each
//! slot is non-zero on its owner only, so adding them (`v + 0 = v`; the sign
//! of a zero slot cannot reach the sum, which starts at `+0`) gives the
//! one-device slots; and the weighted sum over slots runs on the home in
//! slot order ([`Backend::sum_slots`]). No reduction ever happens in
//! transit, so neither the topology nor the order of arrival matters.

use std::fmt::Debug;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::Backend;
use crate::error::{EngineError, Result};

/// Moves a buffer between two devices of a group.
pub trait Transport<B: Backend>: Send + Sync + Debug {
    /// `x`, held by `devices[from]`, as a buffer of `devices[to]`.
    fn copy(&self, devices: &[B], from: usize, to: usize, x: &B::Buf) -> Result<B::Buf>;
}

/// The stand-in transport: through host memory (download, upload). Exact,
/// since a copy moves bits; the collective library's send/receive replaces
/// it between GPUs.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostCopy;

impl<B: Backend> Transport<B> for HostCopy {
    fn copy(&self, devices: &[B], from: usize, to: usize, x: &B::Buf) -> Result<B::Buf> {
        let host = devices[from].download(x)?;
        devices[to].upload(&host)
    }
}

/// One step of a layer's exchange, in the order the home runs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The layer's input rows and routing, from the home to device `to`.
    Scatter { to: usize },
    /// Device `device` computes the output of `slots` (routed to experts it
    /// holds), every other slot left zero.
    Compute { device: usize, slots: Vec<usize> },
    /// Device `from`'s slot outputs to the home, added into the merge.
    Gather { from: usize },
    /// The home sums each token's slots in slot order.
    Sum,
}

/// The exchange of one layer: the devices holding a routed slot get the
/// rows (the home has them), compute, and send their slots back, each in
/// device order; the home sums last. Devices with no routed slot take no
/// part. `ranges[d]` are device `d`'s experts, `experts` the routed expert
/// of each slot.
pub fn order(ranges: &[Range<usize>], experts: &[usize]) -> Result<Vec<Step>> {
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); ranges.len()];
    for (j, &e) in experts.iter().enumerate() {
        let d = ranges.iter().position(|r| r.contains(&e)).ok_or_else(|| {
            EngineError::State(format!("slot {j}: expert {e} is held by no device"))
        })?;
        slots[d].push(j);
    }
    let busy: Vec<usize> = (0..ranges.len())
        .filter(|&d| !slots[d].is_empty())
        .collect();
    let mut steps: Vec<Step> = busy
        .iter()
        .filter(|&&d| d != 0)
        .map(|&to| Step::Scatter { to })
        .collect();
    for &d in &busy {
        steps.push(Step::Compute {
            device: d,
            slots: std::mem::take(&mut slots[d]),
        });
    }
    steps.extend(
        busy.iter()
            .filter(|&&d| d != 0)
            .map(|&from| Step::Gather { from }),
    );
    steps.push(Step::Sum);
    Ok(steps)
}

/// A projection's stack of routed experts over a group: device `d` holds
/// experts `ranges[d]` (global ids), placed by its own backend.
#[derive(Debug)]
pub struct SplitExperts<B: Backend> {
    pub ranges: Vec<Range<usize>>,
    /// One per device; `None` where its range is empty.
    pub parts: Vec<Option<B::Experts>>,
}

/// The group a layer runs on: its devices (the home first), transport and
/// counters.
pub struct Group<'a, B: Backend> {
    pub devices: &'a [B],
    pub transport: &'a dyn Transport<B>,
    pub stats: &'a Stats,
}

/// What a group's exchanges have moved, since it was made.
#[derive(Debug)]
pub struct Stats {
    /// Layers run over the group.
    pub layers: AtomicU64,
    /// Slots computed on each device, by device.
    pub slots: Box<[AtomicU64]>,
    /// Buffers moved between devices (scatters and gathers).
    pub copies: AtomicU64,
}

impl Stats {
    /// Zero counters for a group of `devices`.
    pub fn new(devices: usize) -> Self {
        Self {
            layers: AtomicU64::new(0),
            slots: (0..devices).map(|_| AtomicU64::new(0)).collect(),
            copies: AtomicU64::new(0),
        }
    }

    /// Slots computed by device `d`.
    pub fn slots_on(&self, d: usize) -> u64 {
        self.slots.get(d).map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// `experts_swiglu` over the group: `x: [rows, H]` and `routing` on the
/// home; the result on the home, bit for bit the one-device result.
pub fn experts_swiglu<B: Backend>(
    group: &Group<'_, B>,
    x: &B::Buf,
    rows: usize,
    routing: &B::Routing,
    gate_up: &SplitExperts<B>,
    down: &SplitExperts<B>,
    limit: Option<f32>,
) -> Result<B::Buf> {
    let home = &group.devices[0];
    if gate_up.ranges != down.ranges || gate_up.ranges.len() != group.devices.len() {
        return Err(EngineError::State(format!(
            "expert split: gate/up over {:?}, down over {:?}, {} devices",
            gate_up.ranges,
            down.ranges,
            group.devices.len()
        )));
    }
    let width = home.len(x) / rows.max(1);
    let (experts, weights) = home.routing_to_host(routing)?;
    let k = experts.len() / rows.max(1);
    // Each device's copy of the rows and the routing (taken at Scatter).
    let mut inputs: Vec<Option<(B::Buf, B::Routing)>> = vec![None; group.devices.len()];
    let mut outputs: Vec<Option<B::Buf>> = vec![None; group.devices.len()];
    let mut merged: Option<B::Buf> = None;
    group.stats.layers.fetch_add(1, Ordering::Relaxed);
    for step in order(&gate_up.ranges, &experts)? {
        match step {
            Step::Scatter { to } => {
                group.stats.copies.fetch_add(1, Ordering::Relaxed);
                let dev = &group.devices[to];
                let xs = group.transport.copy(group.devices, 0, to, x)?;
                inputs[to] = Some((xs, dev.routing_upload(&experts, &weights, k)?));
            }
            Step::Compute { device, slots } => {
                if let Some(c) = group.stats.slots.get(device) {
                    c.fetch_add(slots.len() as u64, Ordering::Relaxed);
                }
                let dev = &group.devices[device];
                let (gu, dn) = match (&gate_up.parts[device], &down.parts[device]) {
                    (Some(gu), Some(dn)) => (gu, dn),
                    _ => {
                        return Err(EngineError::State(format!(
                            "expert split: device {device} has routed slots but no experts"
                        )));
                    }
                };
                let first = gate_up.ranges[device].start;
                let ys = match &inputs[device] {
                    Some((xs, r)) => dev.experts_slots(xs, rows, r, gu, dn, limit, first)?,
                    None => dev.experts_slots(x, rows, routing, gu, dn, limit, first)?,
                };
                if device == 0 {
                    merged = Some(ys);
                } else {
                    outputs[device] = Some(ys);
                }
            }
            Step::Gather { from } => {
                let Some(ys) = outputs[from].take() else {
                    return Err(EngineError::State(format!(
                        "expert split: device {from} gathered before it computed"
                    )));
                };
                group.stats.copies.fetch_add(1, Ordering::Relaxed);
                let ys = group.transport.copy(group.devices, from, 0, &ys)?;
                merged = Some(match merged {
                    Some(m) => home.add(&m, &ys)?,
                    None => ys,
                });
            }
            Step::Sum => {}
        }
    }
    let merged = match merged {
        Some(m) => m,
        None => home.zeros(experts.len() * width)?,
    };
    home.sum_slots(&merged, rows, routing, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn computed(steps: &[Step]) -> Vec<(usize, Vec<usize>)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Compute { device, slots } => Some((*device, slots.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn every_slot_is_computed_once_by_its_owner() {
        let ranges = vec![0..3, 3..5, 5..8];
        // 4 tokens, top-2.
        let experts = [0, 7, 3, 4, 6, 5, 1, 2];
        let steps = order(&ranges, &experts).unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Scatter { to: 1 },
                Step::Scatter { to: 2 },
                Step::Compute {
                    device: 0,
                    slots: vec![0, 6, 7]
                },
                Step::Compute {
                    device: 1,
                    slots: vec![2, 3]
                },
                Step::Compute {
                    device: 2,
                    slots: vec![1, 4, 5]
                },
                Step::Gather { from: 1 },
                Step::Gather { from: 2 },
                Step::Sum,
            ]
        );
        let mut all: Vec<usize> = computed(&steps)
            .into_iter()
            .flat_map(|(d, s)| {
                for &j in &s {
                    assert!(ranges[d].contains(&experts[j]));
                }
                s
            })
            .collect();
        all.sort();
        assert_eq!(all, (0..experts.len()).collect::<Vec<_>>());
    }

    #[test]
    fn idle_devices_take_no_part_and_the_home_never_sends_to_itself() {
        let ranges = vec![0..2, 2..4, 4..6];
        // Only device 2's experts are routed.
        let steps = order(&ranges, &[4, 5, 5, 4]).unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Scatter { to: 2 },
                Step::Compute {
                    device: 2,
                    slots: vec![0, 1, 2, 3]
                },
                Step::Gather { from: 2 },
                Step::Sum,
            ]
        );
        // Only the home's: no exchange at all.
        let steps = order(&ranges, &[0, 1]).unwrap();
        assert_eq!(
            steps,
            vec![
                Step::Compute {
                    device: 0,
                    slots: vec![0, 1]
                },
                Step::Sum
            ]
        );
        // No rows: only the (empty) sum.
        assert_eq!(order(&ranges, &[]).unwrap(), vec![Step::Sum]);
    }

    #[test]
    fn an_expert_no_device_holds_is_an_error() {
        let err = order(&[0..2, 2..4], &[1, 4]).unwrap_err().to_string();
        assert!(err.contains("slot 1: expert 4"), "{err}");
    }
}
