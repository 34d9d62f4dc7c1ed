//! The CUDA backend: the op inventory on an NVIDIA GPU.
//!
//! * The driver and NVRTC are loaded at run time (cudarc with dynamic
//!   loading), so this module builds without a CUDA toolkit; [`CudaOps::new`]
//!   fails with a typed error (never a panic) where no driver or device is
//!   found, and callers fall back to the CPU ([`probe`]).
//! * Kernels are CUDA C sources embedded in the binary (`kernels/*.cu`),
//!   compiled once per machine by NVRTC for the device's architecture and
//!   cached on disk ([`nvrtc`]).
//! * Weights, activations, caches and workspaces live on the device; every
//!   op is queued on one stream. The only read-backs are
//!   [`Backend::download`] (the logits rows, state export) and the trace
//!   helpers; routing and sparse selections are made on the device.
//!
//! Exactness: every kernel computes each output element by one sequence of
//! operations that depends on the reduction length only, with the row loop
//! inside the kernel, so a token's bits never depend on how many rows
//! shared its call (decode step, verify window, prefill chunk). The f32
//! matmul (and the expert projections), the products of every stored type
//! other than Q8_0 / Q4_1 (kept as stored, dequantized in registers:
//! `stored.rs`), the delta rule, the conv, the pooling and the element-wise
//! maps follow the CPU reference's sequence exactly, so they agree with the
//! CPU up to the `exp`/`log` of the device's math library; the Q8_0 / Q4_1
//! matmuls (a warp per row), attention (fixed 64-key tiles merged in tile
//! order) and the norms (a warp per slice) have orders of their own,
//! stated in their kernels. The kernel
//! set (the architecture and a hash of the compiled program) is part of
//! the backend id, so a checkpoint made on the GPU never resumes on the CPU
//! or on another kernel set.

mod attention;
mod buf;
mod device;
mod elementwise;
mod expert_slots;
mod fast8;
mod fused;
mod graph;
mod hc_fn;
mod host_gaps;
pub use device::Pdl;
pub use host_gaps::GapRow;
mod linear;
mod mem;
mod norms;
pub mod nvrtc;
mod ops;
mod recurrent;
mod row_blocks;
mod select;
mod signature;
mod staging;
mod stored;
mod weights;
mod window_rows;

use std::sync::Arc;

pub use buf::CudaBuf;
pub use graph::{CudaStep, MAX_STEP_ROWS};
pub use select::{CudaRouting, CudaSelection};
pub use stored::StoredWeights;
pub use weights::{BlockKind, CudaExperts, CudaMatrix, CudaTable};

use crate::backend::{BackendId, KernelSet};
use crate::error::Result;

/// The CUDA backend: a handle on one device (cheap to clone).
#[derive(Clone)]
pub struct CudaOps {
    dev: Arc<device::Device>,
}

impl std::fmt::Debug for CudaOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaOps({:?})", self.dev)
    }
}

impl CudaOps {
    /// Open CUDA device `ordinal`, compiling (or loading the cached) kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        Ok(Self {
            dev: Arc::new(device::Device::open(ordinal)?),
        })
    }

    /// The device's name (`NVIDIA H200`, …).
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The kernel architecture (`sm_90a`, …).
    pub fn arch(&self) -> &str {
        &self.dev.arch
    }

    /// Where the kernel set came from (NVRTC, the disk cache, an override)
    /// and the seconds NVRTC took (0 when nothing was compiled).
    pub fn kernels_origin(&self) -> (&str, f64) {
        (&self.dev.kernels_origin, self.dev.compile_seconds)
    }

    /// Kernels launched on this device so far.
    pub fn launches(&self) -> u64 {
        self.dev.launches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Starts or stops the profiler's capture range
    /// (`Device::profiler_range`: what `ncu --profile-from-start off` sees).
    pub fn profiler_range(&self, on: bool) -> Result<()> {
        self.dev.profiler_range(on)
    }

    /// Nanoseconds the host has waited for the device so far (every
    /// read-back waits for the queued work).
    pub fn sync_wait_ns(&self) -> u64 {
        self.dev
            .sync_wait_ns
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Host-to-device copies made so far, and the blocks taken from the
    /// driver's allocator (not recycled); counted always.
    pub fn host_counts(&self) -> [u64; 2] {
        use std::sync::atomic::Ordering::Relaxed;
        [
            self.dev.copies.load(Relaxed),
            self.dev.pool.driver_allocs.load(Relaxed) as u64,
        ]
    }

    /// The host's gaps between driver calls since the last call of this,
    /// per driver call, largest first (`DS4_CUDA_HOST_PROFILE=1`; empty
    /// otherwise): which op's host-side work a host-bound step waits on, and
    /// the time inside each kind of driver call.
    pub fn host_gaps(&self) -> Vec<host_gaps::GapRow> {
        self.dev.gaps.take()
    }

    /// Whether decode / verify steps run as captured graphs (on unless
    /// `DS4_CUDA_GRAPHS=0`, or after a capture failed).
    pub fn graphs(&self) -> bool {
        self.dev.graphs.enabled()
    }

    /// Turn step graphs on or off for this device (off drops the captured
    /// ones): for side-by-side runs and tests.
    pub fn set_graphs(&self, on: bool) {
        self.dev.graphs.set_enabled(on)
    }

    /// Which launches overlap the kernel before them (programmatic
    /// dependent launch: `DS4_CUDA_PDL`, `docs/ARCHITECTURE.md`).
    pub fn dependent_launch(&self) -> Pdl {
        self.dev.pdl()
    }

    /// Choose which launches overlap the kernel before them (a device
    /// without it stays off): for side-by-side runs and tests. Captured
    /// steps are dropped, so the next ones are captured with it.
    pub fn set_dependent_launch(&self, mode: Pdl) {
        self.dev.set_pdl(mode);
        self.dev.graphs.drop_captured();
    }

    /// The kernel set this device's products run (the process's set,
    /// `backend::kernel_set`, unless [`CudaOps::set_kernel_set`] chose).
    pub fn kernel_set(&self) -> KernelSet {
        self.dev.kernel_set()
    }

    /// Run the products of kernel set `set` from now on: for side-by-side
    /// runs and tests (weights are stored alike for both sets on CUDA).
    /// Captured steps are dropped; states made under the other set carry
    /// its id and must not be continued.
    pub fn set_kernel_set(&self, set: KernelSet) {
        self.dev.set_kernel_set(set);
        self.dev.graphs.drop_captured();
    }

    /// Heads a few-query window attention block takes (`DS4_CUDA_WINDOW_HEADS`
    /// at open, 8 unless set).
    pub fn window_heads(&self) -> usize {
        self.dev.window_heads()
    }

    /// Choose the heads (1, 2, 4 or 8) a few-query window attention block
    /// takes: the same bits in other blocks, for side-by-side runs and
    /// tests. Captured steps are dropped (they keep their launches).
    pub fn set_window_heads(&self, heads: usize) -> Result<()> {
        self.dev.set_window_heads(heads)?;
        self.dev.graphs.drop_captured();
        Ok(())
    }

    /// Steps captured and replayed so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let g = &self.dev.graphs;
        (g.captures.load(Relaxed), g.replays.load(Relaxed))
    }

    /// Wait until every queued op has run (for timing; ops queue
    /// asynchronously, and a download waits by itself).
    pub fn synchronize(&self) -> Result<()> {
        self.dev.sync()
    }

    /// The device's memory in use and in all, bytes (the driver's count:
    /// every allocation on the device, this process's pooled buffers
    /// included — what `nvidia-smi` shows).
    pub fn device_memory(&self) -> Result<(usize, usize)> {
        let (free, total) =
            self.dev.ctx.mem_get_info().map_err(|e| {
                crate::error::EngineError::Device(format!("device memory info: {e}"))
            })?;
        Ok((total.saturating_sub(free), total))
    }

    /// The device copy bandwidth over `bytes` (read + written per second),
    /// the best of `reps` copies: the ceiling a bandwidth-bound step is
    /// measured against.
    pub fn copy_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64> {
        let n = bytes / 4;
        let a = self.dev.alloc_zeros::<f32>(n)?;
        let b = self.dev.alloc::<f32>(n)?;
        self.dev.copy(&a, 0, &b, 0, n)?;
        self.dev.sync()?;
        let mut best = f64::MAX;
        for _ in 0..reps.max(1) {
            let start = std::time::Instant::now();
            self.dev.copy(&a, 0, &b, 0, n)?;
            self.dev.sync()?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(2.0 * (4 * n) as f64 / best)
    }

    fn backend_id(&self) -> BackendId {
        // The architecture and the compiled program: a changed kernel is a
        // different kernel set, whose bits may differ; the fast set's
        // products differ from the reference's, so it has ids of its own
        // (the reference's are the ones checkpoints carried before).
        let (kernels, set_tag) = match self.dev.kernel_set() {
            KernelSet::Reference => (self.dev.arch.clone(), ""),
            KernelSet::Fast => (format!("{}-fast", self.dev.arch), "+q8-activations"),
        };
        BackendId {
            backend: "cuda",
            kernels,
            tag: format!(
                "cuda-kernels:{}:{:016x}{set_tag}",
                self.dev.arch, self.dev.kernels_hash
            ),
        }
    }
}

/// Starts (`on`) or stops the profiler's capture range on the calling
/// thread's current context, for code that holds a model but not its ops
/// (the synthetic bench's `DS4_PROFILE_STEP`): the caller has just run a
/// forward on this thread, so the context is current. `ncu
/// --profile-from-start off` then profiles exactly the launches between
/// the two calls.
pub fn profiler_range_current(on: bool) -> Result<()> {
    // SAFETY: plain driver calls without pointers; without a current
    // context they return an error, which is reported.
    let r = unsafe {
        cudarc::driver::sys::cuCtxSynchronize()
            .result()
            .and_then(|_| {
                if on {
                    cudarc::driver::sys::cuProfilerStart().result()
                } else {
                    cudarc::driver::sys::cuProfilerStop().result()
                }
            })
    };
    r.map_err(|e| crate::error::EngineError::Device(format!("cuProfilerStart/Stop: {e:?}")))
}

/// Whether a CUDA device can be used here: `Ok(name)` of device 0, or why
/// not (no driver library, no device, NVRTC missing …), without aborting
/// the process where the libraries are absent.
pub fn probe() -> std::result::Result<String, String> {
    if !device::driver_present() {
        return Err("the CUDA driver (libcuda.so) is not installed".into());
    }
    if !nvrtc::nvrtc_present() {
        return Err("NVRTC (libnvrtc.so.13) is not on the library path".into());
    }
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(cudarc::driver::CudaContext::new(0)
            .and_then(|c| c.name())
            .unwrap_or_else(|_| "CUDA device 0".into())),
        Ok(_) => Err("the CUDA driver reports no device".into()),
        Err(e) => Err(format!("the CUDA driver failed: {e:?}")),
    }
}
