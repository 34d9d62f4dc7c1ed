//! Decode and verify steps as captured CUDA graphs.
//!
//! An eagerly launched decode step of a small model is launch-bound (~720
//! kernels and ~270 copies at 3–4.5 µs of host time each, against ~25 µs
//! of memory traffic). A step is captured once per key (the model, its row
//! count, the storage of the caches it writes) and replayed: what changes
//! from one step to the next — the token ids and the cache length — is
//! read by the step ops from a small device buffer written by one copy
//! before each launch ([`CudaStep`]), never passed as a launch argument.
//! Everything the step allocates is taken before or during the capture and
//! kept by the graph ([`Arena`]); the caches it writes were sized before
//! (`Backend::resize`), so a replay never reallocates.
//!
//! Capture failing (a driver refusal, an eager-only op inside the body) is
//! never silently wrong: one log line says why, graphs are turned off for
//! the device and the step runs eagerly.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cudarc::driver::{CudaGraph, sys as driver_sys};

use super::buf::{self, CudaBuf};
use super::device::{Device, dev_err};
use super::host_gaps;
use super::mem::{Arena, DevMem, Pool};
use crate::backend::{PureBody, StepBody};
use crate::error::{EngineError, Result};

/// Rows a step may have at most (a decode step is 1, an MTP verify window
/// K + 1 ≤ 4; longer forwards are prefill chunks and run eagerly).
pub const MAX_STEP_ROWS: usize = 8;
/// Captured graphs kept (least recently used dropped first): each state
/// whose caches moved (a snapshot, a growth point) makes a new key.
const MAX_GRAPHS: usize = 16;
/// Captured pure units kept (least recently used dropped first): a model
/// keeps one or two per layer and row count.
const MAX_PURE: usize = 512;

/// The step parameters as the step ops see them: `ptr` is the device
/// buffer `[pos, ids[0], …]` (u32), written before the step runs; `pos`
/// and `rows` are the host's copy, for shape checks at capture.
#[derive(Debug)]
pub struct CudaStep {
    pub(super) ptr: u64,
    pub(super) pos: usize,
    pub(super) rows: usize,
}

impl CudaStep {
    /// The device address of the token ids.
    pub(super) fn ids_ptr(&self) -> u64 {
        self.ptr + 4
    }
}

/// A graph executable, launched only under the cache's lock.
struct Exec(CudaGraph);

// SAFETY: the driver's graph and executable handles may be used from any
// thread that binds the context (cudarc's `launch` does); the cache's mutex
// serialises every use.
unsafe impl Send for Exec {}
// SAFETY: as above; no `&Exec` is used without the lock.
unsafe impl Sync for Exec {}

struct StepGraph {
    key: Vec<u64>,
    graph: Exec,
    /// The body's outputs, written by every replay (copied out for the
    /// caller, so a replay never overwrites what a caller holds).
    outputs: Vec<CudaBuf>,
    _arena: Arena,
}

/// A captured pure unit ([`run_pure`]): the buffers it reads its inputs
/// from, and those its outputs are written to.
struct PureGraph {
    key: Vec<u64>,
    graph: Exec,
    inputs: Vec<CudaBuf>,
    outputs: Vec<CudaBuf>,
    _arena: Arena,
}

pub(super) struct Graphs {
    params: DevMem<u32>,
    cache: Mutex<Vec<StepGraph>>,
    pure: Mutex<Vec<PureGraph>>,
    enabled: AtomicBool,
    pub captures: AtomicU64,
    pub replays: AtomicU64,
}

impl Graphs {
    pub fn new(pool: &std::sync::Arc<Pool>) -> Result<Self> {
        let off = std::env::var("DS4_CUDA_GRAPHS").is_ok_and(|v| v == "0");
        Ok(Self {
            params: DevMem::new(pool, MAX_STEP_ROWS + 1)?,
            cache: Mutex::new(Vec::new()),
            pure: Mutex::new(Vec::new()),
            enabled: AtomicBool::new(!off),
            captures: AtomicU64::new(0),
            replays: AtomicU64::new(0),
        })
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turn graphs on or off (off also drops the captured ones).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
        if !on {
            self.drop_captured();
        }
    }

    /// Drop every captured graph (steps and pure units), so the next ones
    /// are captured anew: after a setting that changes what a launch is
    /// (the kernel set, the window heads, dependent launches).
    pub fn drop_captured(&self) {
        if let Ok(mut c) = self.cache.lock() {
            c.clear();
        }
        if let Ok(mut c) = self.pure.lock() {
            c.clear();
        }
    }
}

fn copies(dev: &Device, outputs: &[CudaBuf]) -> Result<Vec<CudaBuf>> {
    let outs = outputs
        .iter()
        .map(|o| CudaBuf::uninit(dev, o.len()))
        .collect::<Result<Vec<_>>>()?;
    let pairs: Vec<(&CudaBuf, &CudaBuf)> = outs.iter().zip(outputs).collect();
    buf::copy_many(dev, &pairs)?;
    Ok(outs)
}

/// A body captured as a graph: its outputs (written by every replay), the
/// graph, and the blocks it uses.
struct Captured {
    outputs: Vec<CudaBuf>,
    graph: CudaGraph,
    arena: Arena,
}

/// Capture `body` on the stream (the pool in capture mode), then launch
/// the graph once for this call. `Err(why)` when the capture failed:
/// nothing of it ran and its blocks are free again.
fn capture(
    dev: &Device,
    body: impl FnOnce() -> Result<Vec<CudaBuf>>,
) -> Result<std::result::Result<Captured, String>> {
    dev.pool.begin_capture()?;
    let begun = dev
        .stream
        .begin_capture(driver_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
    let (r, graph) = match begun {
        Ok(()) => {
            let r = body();
            let graph = dev
                .stream
                .end_capture(driver_sys::CUgraphInstantiate_flags(0));
            (r, graph)
        }
        Err(e) => (Err(dev_err("begin capture", e)), Ok(None)),
    };
    let arena = dev.pool.end_capture();
    match (r, graph) {
        (Ok(outputs), Ok(Some(graph))) => {
            graph.launch().map_err(|e| dev_err("graph launch", e))?;
            Ok(Ok(Captured {
                outputs,
                graph,
                arena,
            }))
        }
        (r, graph) => {
            let why = match (&r, &graph) {
                (Err(e), _) => e.to_string(),
                (_, Err(e)) => format!("{e:?}"),
                _ => "the capture recorded nothing".into(),
            };
            // Nothing of the capture ran: its blocks are free again.
            drop((r, graph, arena));
            Ok(Err(why))
        }
    }
}

/// Graphs off for the device after a failed capture (one log line).
fn give_up(g: &Graphs, what: &str, why: &str) {
    g.enabled.store(false, Ordering::Relaxed);
    tracing::warn!("CUDA graphs off: capturing {what} failed ({why}); it runs eagerly");
}

/// `Backend::run_step` on the device.
pub(super) fn run_step(
    dev: &Device,
    key: &[u64],
    pos: usize,
    ids: &[u32],
    body: &mut StepBody<'_, CudaStep, CudaBuf>,
) -> Result<Vec<CudaBuf>> {
    let g = &dev.graphs;
    if ids.is_empty() || ids.len() > MAX_STEP_ROWS {
        return Err(EngineError::State(format!(
            "a step has 1..={MAX_STEP_ROWS} rows, not {}",
            ids.len()
        )));
    }
    let pos32 = u32::try_from(pos)
        .map_err(|_| EngineError::State(format!("step position {pos} is past u32")))?;
    let mut host = Vec::with_capacity(ids.len() + 1);
    host.push(pos32);
    host.extend_from_slice(ids);
    dev.write(&g.params, &host)?;
    let step = CudaStep {
        ptr: g.params.ptr(),
        pos,
        rows: ids.len(),
    };
    if !g.enabled() {
        return body(&step);
    }
    let mut cache = g
        .cache
        .lock()
        .map_err(|_| EngineError::Device("the graph cache lock is poisoned".into()))?;
    if let Some(i) = cache.iter().position(|s| s.key == key) {
        let s = cache.remove(i);
        dev.gaps
            .call(host_gaps::GRAPH_LAUNCH, || s.graph.0.launch())
            .map_err(|e| dev_err("graph launch", e))?;
        let outs = copies(dev, &s.outputs);
        cache.push(s);
        g.replays.fetch_add(1, Ordering::Relaxed);
        return outs;
    }
    match capture(dev, || body(&step))? {
        Ok(c) => {
            let outs = copies(dev, &c.outputs)?;
            cache.push(StepGraph {
                key: key.to_vec(),
                graph: Exec(c.graph),
                outputs: c.outputs,
                _arena: c.arena,
            });
            if cache.len() > MAX_GRAPHS {
                cache.remove(0);
            }
            g.captures.fetch_add(1, Ordering::Relaxed);
            Ok(outs)
        }
        Err(why) => {
            give_up(g, "a step", &why);
            drop(cache);
            body(&step)
        }
    }
}

/// `Backend::run_pure` on the device: replay the unit captured for `key`
/// (its inputs copied in, its outputs copied out), capturing it on first
/// use; eager while another capture is under way or graphs are off.
pub(super) fn run_pure(
    dev: &Device,
    key: &[u64],
    inputs: &[&CudaBuf],
    body: &mut PureBody<'_, CudaBuf>,
) -> Result<Vec<CudaBuf>> {
    let g = &dev.graphs;
    if !g.enabled() || dev.pool.capturing() {
        return body(inputs);
    }
    let mut cache = g
        .pure
        .lock()
        .map_err(|_| EngineError::Device("the graph cache lock is poisoned".into()))?;
    if let Some(i) = cache.iter().position(|s| s.key == key) {
        let s = cache.remove(i);
        let fits = s.inputs.len() == inputs.len()
            && s.inputs.iter().zip(inputs).all(|(a, b)| a.len() == b.len());
        if fits {
            let pairs: Vec<(&CudaBuf, &CudaBuf)> =
                s.inputs.iter().zip(inputs.iter().copied()).collect();
            buf::copy_many(dev, &pairs)?;
            dev.gaps
                .call(host_gaps::GRAPH_LAUNCH, || s.graph.0.launch())
                .map_err(|e| dev_err("graph launch", e))?;
            let outs = copies(dev, &s.outputs);
            cache.push(s);
            g.replays.fetch_add(1, Ordering::Relaxed);
            return outs;
        }
        // Same key, other shapes: the caller's key is wrong; capture anew.
    }
    // The input buffers belong to the graph: made before the capture.
    let fixed = inputs
        .iter()
        .map(|x| buf::copy_of(dev, x))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&CudaBuf> = fixed.iter().collect();
    match capture(dev, || body(&refs))? {
        Ok(c) => {
            let outs = copies(dev, &c.outputs)?;
            cache.push(PureGraph {
                key: key.to_vec(),
                graph: Exec(c.graph),
                inputs: fixed,
                outputs: c.outputs,
                _arena: c.arena,
            });
            if cache.len() > MAX_PURE {
                cache.remove(0);
            }
            g.captures.fetch_add(1, Ordering::Relaxed);
            Ok(outs)
        }
        Err(why) => {
            give_up(g, "a pure unit", &why);
            drop(cache);
            body(inputs)
        }
    }
}
