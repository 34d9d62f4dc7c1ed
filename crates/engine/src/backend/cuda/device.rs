//! One CUDA device as the backend sees it: a context, one stream every op
//! is queued on (so ops run in program order and memory is freed in stream
//! order), the loaded kernel set, and raw kernel launches.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, result as driver,
    sys as driver_sys,
};
use cudarc::nvrtc::Ptx;

use super::fast8::F8Args;
use super::graph::Graphs;
use super::host_gaps::{self, HostGaps};
use super::linear::GroupedF32Args;
use super::linear::ManyArgs;
use super::mem::{DevMem, Pool};
use super::nvrtc;
use super::signature::{self, Param};
use super::staging::Staging;
use crate::backend::KernelSet;
use crate::error::{EngineError, Result};

/// Threads per block of element-wise (grid-stride) kernels.
pub(super) const BLOCK: u32 = 256;
/// Blocks of a grid-stride launch at most (the loop covers the rest).
const MAX_BLOCKS: u64 = 1 << 16;

pub(super) fn dev_err(what: &str, e: impl std::fmt::Debug) -> EngineError {
    EngineError::Device(format!("{what}: {e:?}"))
}

/// A kernel argument: device pointers and sizes are `u64`, as the kernels
/// declare them.
#[derive(Debug, Clone, Copy)]
pub(super) enum Arg {
    U64(u64),
    U32(u32),
    I32(i32),
    F32(f32),
}

impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Arg::U64(v)
    }
}
impl From<usize> for Arg {
    fn from(v: usize) -> Self {
        Arg::U64(v as u64)
    }
}
impl From<u32> for Arg {
    fn from(v: u32) -> Self {
        Arg::U32(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}

/// `args![a, b, …]`: a kernel's argument list.
macro_rules! args {
    ($($a:expr),* $(,)?) => { &[$($crate::backend::cuda::device::Arg::from($a)),*] };
}
pub(super) use args;

/// A launch shape: grid (x, y) and threads per block.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub grid: (u32, u32),
    pub block: u32,
}

impl Shape {
    /// A grid-stride launch over `n` elements.
    pub fn elements(n: usize) -> Self {
        let blocks = (n as u64).div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS);
        Shape {
            grid: (blocks as u32, 1),
            block: BLOCK,
        }
    }

    /// A grid-stride launch over `n` elements, `threads` a block.
    pub fn elements_in(n: usize, threads: u32) -> Self {
        let blocks = (n as u64).div_ceil(threads as u64).clamp(1, MAX_BLOCKS);
        Shape {
            grid: (blocks as u32, 1),
            block: threads,
        }
    }

    /// One block of `threads` per item (grid-stride past the grid limit).
    pub fn blocks(n: usize, threads: u32) -> Self {
        let blocks = (n as u64).clamp(1, MAX_BLOCKS);
        Shape {
            grid: (blocks as u32, 1),
            block: threads,
        }
    }

    /// One warp per item, four warps per block.
    pub fn warps(n: usize) -> Self {
        let blocks = (n as u64).div_ceil(4).clamp(1, MAX_BLOCKS);
        Shape {
            grid: (blocks as u32, 1),
            block: 128,
        }
    }
}

/// A loaded kernel and its parameters.
struct Kernel {
    f: CudaFunction,
    params: Vec<Param>,
    /// Its `__launch_bounds__` threads, where it declares them.
    max_threads: Option<u32>,
}

/// The environment variable choosing programmatic dependent launch:
/// `0` off, `capture` only in captured graphs, anything else (or unset)
/// every launch, where the device has it.
pub const PDL_ENV: &str = "DS4_CUDA_PDL";

/// Which launches may overlap the kernel before them
/// ([`launch_dependent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Pdl {
    Off,
    /// Only launches captured into a graph (decode and verify steps).
    Captures,
    All,
}

impl Pdl {
    /// Compute capability 9.0 (Hopper) brought `griddepcontrol`.
    fn for_device(major: i32, env: Option<&str>) -> Self {
        match env {
            _ if major < 9 => Pdl::Off,
            Some("0") => Pdl::Off,
            Some("capture") => Pdl::Captures,
            _ => Pdl::All,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            v if v == Pdl::All as u8 => Pdl::All,
            v if v == Pdl::Captures as u8 => Pdl::Captures,
            _ => Pdl::Off,
        }
    }

    fn applies(self, capturing: bool) -> bool {
        match self {
            Pdl::Off => false,
            Pdl::Captures => capturing,
            Pdl::All => true,
        }
    }
}

/// Kernels launched with more dynamic shared memory than a block gets
/// unasked, and how much (allowed at open where the device has room).
pub(super) const DYNAMIC_SHARED: &[(&str, usize)] = &[
    ("st_matmul_deep_f16", super::stored::DEEP_SMEM),
    ("st_matmul_deep_bf16", super::stored::DEEP_SMEM),
    (
        "attention_causal_staged_batch_f32",
        super::attention::STAGED_SHARED_MAX,
    ),
    (
        "attention_window_staged_f32",
        super::attention::WINDOW_STAGED_SHARED_MAX,
    ),
];

/// Kernel arguments at most (the longest signature has 20).
const MAX_ARGS: usize = 24;

pub(super) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// Work that must not join a capture on `stream` (allocations, the
    /// constants a captured step uploads).
    side: Arc<CudaStream>,
    /// Activations, caches and workspaces (weights are allocated apart).
    pub(super) pool: Arc<Pool>,
    /// Captured decode / verify steps and their parameter buffer.
    pub(super) graphs: Graphs,
    /// Every kernel, loaded at open, with its parameters from the sources
    /// (read-only afterwards: a launch takes no lock).
    kernels: HashMap<String, Kernel>,
    pub arch: String,
    pub name: String,
    pub kernels_hash: u64,
    /// Where the kernels came from and how long compiling took (0 when
    /// loaded from the cache or a cubin).
    pub kernels_origin: String,
    pub compile_seconds: f64,
    /// Which kernels launch with programmatic stream serialization
    /// (`dep_entry` in `kernels/common.cuh`): a [`Pdl`] as u8, changeable
    /// at run time ([`Device::set_pdl`]).
    pdl: AtomicU8,
    /// Whether the device has it (compute capability 9.0 and later).
    pdl_supported: bool,
    /// Dynamic shared memory a block may opt in to, in bytes (the
    /// `st_matmul_deep_*` ring needs `stored::DEEP_SMEM`).
    pub shared_optin: usize,
    /// Whether products run the fast kernel set (`backend::kernel_set`):
    /// the process's set at open, changeable for side-by-side runs and
    /// tests ([`Device::set_kernel_set`]).
    fast: AtomicBool,
    /// Heads a block of the few-query window attention takes
    /// (`attention::WINDOW_STAGED_HEADS`): `DS4_CUDA_WINDOW_HEADS` at open
    /// (8 unless set), changeable for side-by-side runs and tests
    /// ([`Device::set_window_heads`]). A head's partial has the same bits
    /// whichever block computes it; fewer heads a block make more blocks
    /// (a DeepSeek-V4 decode row's 64 heads over 2–5 tiles are 16–40
    /// blocks of 8 heads, 27 µs a layer in run 47's table), each staging
    /// its tile's keys again.
    window_heads: AtomicUsize,
    /// Kernels launched so far (for launch-count reports).
    pub launches: AtomicU64,
    /// Nanoseconds the host has waited in [`Device::sync`] (so a report
    /// can tell the host's share of a step from the device's).
    pub sync_wait_ns: AtomicU64,
    /// Host-to-device copies made (for reports).
    pub copies: AtomicU64,
    /// The host's gaps between driver calls, per call (profiling only).
    pub(super) gaps: HostGaps,
    /// Page-locked memory downloads land in.
    staging: Staging,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.arch)
    }
}

/// The environment variable choosing the heads of a few-query window
/// attention block ([`Device::set_window_heads`]).
pub const WINDOW_HEADS_ENV: &str = "DS4_CUDA_WINDOW_HEADS";

fn window_heads_valid(heads: usize) -> Result<usize> {
    if super::attention::WINDOW_STAGED_HEADS.contains(&heads) {
        Ok(heads)
    } else {
        Err(EngineError::Device(format!(
            "a window attention block takes 1, 2, 4 or 8 heads, not {heads}"
        )))
    }
}

fn window_heads_from_env() -> Result<usize> {
    match std::env::var(WINDOW_HEADS_ENV) {
        Err(_) => Ok(8),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| EngineError::Device(format!("{WINDOW_HEADS_ENV}={v}: not a number")))
            .and_then(window_heads_valid),
    }
}

/// A block of `block` threads for kernel `name` compiled for at most
/// `max_threads` (its `__launch_bounds__`), or the typed error.
fn within_bounds(name: &str, max_threads: Option<u32>, block: u32) -> Result<()> {
    match max_threads {
        Some(max) if block > max => Err(EngineError::Device(format!(
            "kernel `{name}` is compiled for at most {max} threads a block, launched with {block}"
        ))),
        _ => Ok(()),
    }
}

/// `cuLaunchKernelEx` with programmatic stream serialization: the kernel
/// may start before the one queued before it completes, and its
/// `dep_entry` (`kernels/common.cuh`) holds it until that one has.
///
/// # Safety
/// As `cudarc::driver::result::launch_kernel`.
unsafe fn launch_dependent(
    f: driver_sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared: u32,
    stream: driver_sys::CUstream,
    params: &mut [*mut c_void],
) -> std::result::Result<(), driver::DriverError> {
    // SAFETY: an all-zero attribute is a valid (empty) value of the C
    // struct; the id and the one field the id selects are set next.
    let mut attr: driver_sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id =
        driver_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = driver_sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: shared,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as the caller promises; `config` and `attr` outlive the call.
    unsafe {
        driver_sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()).result()
    }
}

/// Whether the CUDA driver library can be loaded at all (cudarc aborts the
/// process on first use when it cannot, so this is asked first).
pub(super) fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { driver_sys::is_culib_present() }
}

impl Device {
    /// Open device `ordinal` and load the kernel set.
    pub fn open(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(EngineError::Device(
                "the CUDA driver (libcuda.so) cannot be loaded".into(),
            ));
        }
        let count = CudaContext::device_count().map_err(|e| dev_err("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(EngineError::Device(format!(
                "no CUDA device {ordinal} ({count} present)"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| dev_err("cuCtxCreate", e))?;
        // One stream, in program order: cudarc's cross-stream event
        // tracking is pure overhead here (and gets in the way of graph
        // capture).
        // SAFETY: nothing has been allocated on this context yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(|e| dev_err("cuStreamCreate", e))?;
        // Allocations made while `stream` is capturing a graph.
        let side = ctx.new_stream().map_err(|e| dev_err("cuStreamCreate", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| dev_err("compute capability", e))?;
        // Hopper's and Blackwell's arch-specific targets (`sm_90a`) cover
        // every instruction of the device; the cubin only has to run here.
        let arch = if major >= 9 {
            format!("sm_{major}{minor}a")
        } else {
            format!("sm_{major}{minor}")
        };
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let cubin = nvrtc::kernels(&arch)?;
        tracing::info!(
            "CUDA kernels for {name} ({arch}) from {} ({:.2}s)",
            cubin.origin,
            cubin.compile_seconds
        );
        let module = ctx
            .load_module(Ptx::from_binary(cubin.image))
            .map_err(|e| dev_err("loading the kernel cubin", e))?;
        let text: String = nvrtc::SOURCES.iter().map(|(_, s)| *s).collect();
        // A kernel that could return before its wait would let the next
        // kernel overtake the one before it: refuse such a set outright.
        signature::check_waits(&text).map_err(EngineError::Device)?;
        let pdl = Pdl::for_device(major, std::env::var(PDL_ENV).ok().as_deref());
        let mut kernels = HashMap::new();
        for (name, sig) in signature::parse(&text).map_err(EngineError::Device)? {
            let f = module
                .load_function(&name)
                .map_err(|e| dev_err(&format!("kernel `{name}`"), e))?;
            kernels.insert(
                name,
                Kernel {
                    f,
                    params: sig.params,
                    max_threads: sig.max_threads,
                },
            );
        }
        let staging = Staging::new(ctx.clone());
        // Kernels whose ring is dynamic shared memory past the 48 KB a
        // block gets without asking: allowed once here, where the device
        // has room (the launcher checks `shared_optin` before using them).
        let shared_optin = ctx
            .attribute(
                driver_sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| dev_err("shared memory opt-in", e))?
            .max(0) as usize;
        for (name, bytes) in DYNAMIC_SHARED {
            if let Some(k) = kernels.get(*name)
                && *bytes <= shared_optin
            {
                k.f.set_attribute(
                    driver_sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    *bytes as i32,
                )
                .map_err(|e| dev_err(&format!("kernel `{name}` shared memory"), e))?;
            }
        }
        let pool = Pool::new(stream.clone(), side.clone());
        Ok(Self {
            ctx,
            graphs: Graphs::new(&pool)?,
            pool,
            side,
            stream,
            kernels,
            arch,
            name,
            kernels_hash: cubin.hash,
            kernels_origin: cubin.origin,
            compile_seconds: cubin.compile_seconds,
            pdl: AtomicU8::new(pdl as u8),
            pdl_supported: major >= 9,
            shared_optin,
            fast: AtomicBool::new(crate::backend::kernel_set::current() == KernelSet::Fast),
            window_heads: AtomicUsize::new(window_heads_from_env()?),
            launches: AtomicU64::new(0),
            sync_wait_ns: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            gaps: HostGaps::new(std::env::var("DS4_CUDA_HOST_PROFILE").is_ok_and(|v| v == "1")),
            staging,
        })
    }

    /// Which launches overlap the kernel before them.
    pub fn pdl(&self) -> Pdl {
        Pdl::from_u8(self.pdl.load(Ordering::Relaxed))
    }

    /// Choose which launches overlap the kernel before them; a device
    /// without it stays [`Pdl::Off`]. Graphs captured before keep the
    /// launches they were captured with.
    pub fn set_pdl(&self, mode: Pdl) {
        let mode = if self.pdl_supported { mode } else { Pdl::Off };
        self.pdl.store(mode as u8, Ordering::Relaxed);
    }

    /// The kernel set the products run.
    pub fn kernel_set(&self) -> KernelSet {
        if self.fast.load(Ordering::Relaxed) {
            KernelSet::Fast
        } else {
            KernelSet::Reference
        }
    }

    /// Choose the kernel set of the products queued from now on (graphs
    /// captured before keep the kernels they were captured with: the
    /// caller drops them).
    pub fn set_kernel_set(&self, set: KernelSet) {
        self.fast.store(set == KernelSet::Fast, Ordering::Relaxed);
    }

    /// Heads a few-query window attention block takes.
    pub fn window_heads(&self) -> usize {
        self.window_heads.load(Ordering::Relaxed)
    }

    /// Choose the heads a few-query window attention block takes (one of
    /// `attention::WINDOW_STAGED_HEADS`): the same bits, other blocks.
    pub fn set_window_heads(&self, heads: usize) -> Result<()> {
        self.window_heads
            .store(window_heads_valid(heads)?, Ordering::Relaxed);
        Ok(())
    }

    /// Queue kernel `name` on the stream.
    pub fn launch(&self, name: &'static str, shape: Shape, args: &[Arg]) -> Result<()> {
        self.launch_shared(name, shape, 0, args)
    }

    /// [`Device::launch`] with `shared` bytes of dynamic shared memory (a
    /// kernel of [`DYNAMIC_SHARED`] past 48 KB, on a device with room).
    pub fn launch_shared(
        &self,
        name: &'static str,
        shape: Shape,
        shared: u32,
        args: &[Arg],
    ) -> Result<()> {
        let k = self
            .kernels
            .get(name)
            .ok_or_else(|| EngineError::Device(format!("no kernel `{name}` in the sources")))?;
        if k.params.len() != args.len()
            || args.len() > MAX_ARGS
            || !k.params.iter().zip(args).all(|(p, a)| p.matches(a))
        {
            return Err(EngineError::Device(format!(
                "kernel `{name}` takes {:?}, was given {args:?}",
                k.params
            )));
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, a) in params.iter_mut().zip(args) {
            *p = match a {
                Arg::U64(v) => v as *const u64 as *mut c_void,
                Arg::U32(v) => v as *const u32 as *mut c_void,
                Arg::I32(v) => v as *const i32 as *mut c_void,
                Arg::F32(v) => v as *const f32 as *mut c_void,
            };
        }
        // SAFETY: `params` points at live values of the types the kernel
        // declares (checked against its signature above); device pointers
        // come from live allocations of this context, and every op queues
        // on this one stream, so buffers outlive the kernels that use them
        // (recycled and freed memory is reused in stream order).
        unsafe { self.launch_raw(name, k, shape, shared, &mut params[..args.len()]) }
    }

    /// The driver launch of kernel `k` on the stream, timed when profiling.
    /// A block wider than its `__launch_bounds__` is a typed error here
    /// rather than the driver's refusal.
    ///
    /// # Safety
    /// `params` must point at values of the types `k` declares, and every
    /// device pointer among them at a live allocation of this context.
    unsafe fn launch_raw(
        &self,
        name: &'static str,
        k: &Kernel,
        shape: Shape,
        shared: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        within_bounds(name, k.max_threads, shape.block)?;
        let f = &k.f;
        self.bind()?;
        // SAFETY: as the caller promises.
        self.gaps
            .call(name, || unsafe {
                let (grid, block) = ((shape.grid.0, shape.grid.1, 1), (shape.block, 1, 1));
                let stream = self.stream.cu_stream();
                if self.pdl().applies(self.pool.capturing()) {
                    launch_dependent(f.cu_function(), grid, block, shared, stream, params)
                } else {
                    driver::launch_kernel(f.cu_function(), grid, block, shared, stream, params)
                }
            })
            .map_err(|e| dev_err(&format!("launching `{name}`"), e))
    }

    /// Queue kernel `name`, whose one parameter is the `Many` struct of
    /// `matmul.cu`, with `value` (its `repr(C)` mirror) as that parameter.
    pub fn launch_many(&self, name: &'static str, shape: Shape, value: &ManyArgs) -> Result<()> {
        // SAFETY: `ManyArgs` mirrors `Many` field for field (`repr(C)`).
        unsafe { self.launch_struct(name, shape, Param::Many, value) }
    }

    /// Queue kernel `name`, whose one parameter is the `Fast8` struct of
    /// `fast8.cu`, with `value` (its `repr(C)` mirror) as that parameter.
    pub fn launch_fast8(&self, name: &'static str, shape: Shape, value: &F8Args) -> Result<()> {
        // SAFETY: `F8Args` mirrors `Fast8` field for field (`repr(C)`).
        unsafe { self.launch_struct(name, shape, Param::Fast8, value) }
    }

    pub fn launch_grouped_f32(&self, shape: Shape, value: &GroupedF32Args) -> Result<()> {
        // SAFETY: `GroupedF32Args` mirrors `GroupedF32` field for field
        // (`repr(C)`).
        unsafe { self.launch_struct("matmul_f32_grouped", shape, Param::GroupedF32, value) }
    }

    /// Queue kernel `name`, whose one parameter is the struct `want` names,
    /// with `value` as that parameter.
    ///
    /// # Safety
    /// `T` must mirror the kernel's struct field for field (`repr(C)`), and
    /// every pointer in it must be a live allocation of this context used
    /// in stream order (as `launch`).
    unsafe fn launch_struct<T>(
        &self,
        name: &'static str,
        shape: Shape,
        want: Param,
        value: &T,
    ) -> Result<()> {
        let k = self
            .kernels
            .get(name)
            .ok_or_else(|| EngineError::Device(format!("no kernel `{name}` in the sources")))?;
        if k.params != [want] {
            return Err(EngineError::Device(format!(
                "kernel `{name}` takes {:?}, not one {want:?}",
                k.params
            )));
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let mut params = [value as *const T as *mut c_void];
        // SAFETY: the kernel's one parameter is the struct `T` mirrors (the
        // caller's promise); the driver copies the parameter at launch.
        unsafe { self.launch_raw(name, k, shape, 0, &mut params) }
    }

    /// Room for `n` elements from the pool, to be fully written by the
    /// kernel or copy that fills it.
    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<DevMem<T>> {
        DevMem::new(&self.pool, n)
    }

    /// `n` zeroed elements from the pool.
    pub fn alloc_zeros<T: DeviceRepr>(&self, n: usize) -> Result<DevMem<T>> {
        let m = self.alloc::<T>(n)?;
        if n > 0 {
            self.bind()?;
            // SAFETY: `m` holds n elements; the memset is queued on the
            // stream like every use of it.
            unsafe {
                driver::memset_d8_async(
                    m.ptr(),
                    0,
                    n * std::mem::size_of::<T>(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| dev_err("memset", e))?;
        }
        Ok(m)
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| dev_err("binding the context", e))
    }

    /// Host values copied to a new block of the pool. During a capture
    /// the copy is made at once (a copy from pageable memory cannot be a
    /// node of a graph) and the block becomes a constant of the graph: so
    /// what a captured step uploads must not change between its replays
    /// (per-step values come from the step parameters).
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DevMem<T>> {
        if self.pool.capturing() {
            let m = DevMem::constant(&self.pool, host.len())?;
            if !host.is_empty() {
                self.bind()?;
                // SAFETY: `m` holds host.len() elements; the copy runs on
                // the side stream (not capturing) and is waited for.
                unsafe { driver::memcpy_htod_async(m.ptr(), host, self.side.cu_stream()) }
                    .map_err(|e| dev_err("host-to-device copy", e))?;
                self.side
                    .synchronize()
                    .map_err(|e| dev_err("side stream synchronize", e))?;
            }
            return Ok(m);
        }
        let m = self.alloc::<T>(host.len())?;
        if !host.is_empty() {
            self.bind()?;
            // SAFETY: `m` holds host.len() elements; a copy from pageable
            // memory returns once the source is staged, so `host` may go.
            self.gaps
                .call(host_gaps::HTOD_COPY, || unsafe {
                    driver::memcpy_htod_async(m.ptr(), host, self.stream.cu_stream())
                })
                .map_err(|e| dev_err("host-to-device copy", e))?;
            self.copies.fetch_add(1, Ordering::Relaxed);
        }
        Ok(m)
    }

    /// Overwrite the first `host.len()` elements of `m` (queued on the
    /// stream: work queued before still reads the old values).
    pub fn write<T: DeviceRepr>(&self, m: &DevMem<T>, host: &[T]) -> Result<()> {
        if host.len() > m.len() {
            return Err(EngineError::Device(format!(
                "writing {} values into a block of {}",
                host.len(),
                m.len()
            )));
        }
        if host.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: in bounds (checked); a copy from pageable memory returns
        // once the source is staged.
        let r = self
            .gaps
            .call(host_gaps::HTOD_WRITE, || unsafe {
                driver::memcpy_htod_async(m.ptr(), host, self.stream.cu_stream())
            })
            .map_err(|e| dev_err("host-to-device copy", e));
        self.copies.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// A weight: allocated apart from the pool, for the model's lifetime.
    pub fn upload_weight<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        if host.is_empty() {
            // SAFETY: never read (an empty weight has no element).
            return unsafe { self.stream.alloc::<T>(1) }.map_err(|e| dev_err("allocation", e));
        }
        self.stream
            .clone_htod(host)
            .map_err(|e| dev_err("host-to-device copy", e))
    }

    /// Room for `n` elements of a weight a kernel fills (apart from the
    /// pool, for the model's lifetime).
    pub fn alloc_weight<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: filled by the kernel queued next on the same stream,
        // before any read.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| dev_err("allocation", e))
    }

    /// The first `n` elements of `m` on the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone + Send + Sync>(
        &self,
        m: &DevMem<T>,
        n: usize,
    ) -> Result<Vec<T>> {
        let mut parts = self.download_parts(m, &[n])?;
        Ok(parts.pop().unwrap_or_default())
    }

    /// The first `Σ lens` elements of `m` on the host as consecutive parts
    /// of `lens[i]` elements (waits for the stream). The device writes into
    /// the page-locked staging block ([`Staging`]), piece by piece where
    /// the whole is larger, and each piece is copied into the parts (never
    /// zeroed first): one host copy of every value.
    pub fn download_parts<T: DeviceRepr + Default + Clone + Send + Sync>(
        &self,
        m: &DevMem<T>,
        lens: &[usize],
    ) -> Result<Vec<Vec<T>>> {
        let n: usize = lens.iter().sum();
        if n > m.len() {
            return Err(EngineError::Device(format!(
                "reading {n} values of a block of {}",
                m.len()
            )));
        }
        let size = std::mem::size_of::<T>().max(1);
        let mut parts: Vec<Vec<T>> = lens.iter().map(|&l| Vec::with_capacity(l)).collect();
        if n == 0 {
            return Ok(parts);
        }
        // Wait for the queued work first: the copies below wait for it
        // inside the driver, where `sync_wait_ns` would not see the host
        // waiting for the device.
        self.sync()?;
        self.bind()?;
        self.staging.with(n * size, |block, bytes| {
            let per = (bytes / size).max(1);
            // The part being filled and how far.
            let (mut part, mut filled) = (0, 0);
            let mut at = 0;
            while at < n {
                let count = per.min(n - at);
                // SAFETY: the block holds `bytes` ≥ count · size bytes and
                // `m` at least `n` elements; the copy is waited for before
                // the block is read.
                self.gaps
                    .call(host_gaps::DTOH_COPY, || unsafe {
                        driver_sys::cuMemcpyDtoHAsync_v2(
                            block.cast::<c_void>(),
                            m.ptr() + (at * size) as u64,
                            count * size,
                            self.stream.cu_stream(),
                        )
                        .result()
                    })
                    .map_err(|e| dev_err("device-to-host copy", e))?;
                self.sync()?;
                // SAFETY: the block is initialised (zeroed when allocated,
                // then written by the copy just waited for), page-aligned
                // and holds `count` values of `T`.
                let piece = unsafe { std::slice::from_raw_parts(block.cast::<T>(), count) };
                // The piece's runs: (part, start in the piece, values).
                let (first_part, mut runs) = (part, Vec::new());
                let mut from = 0;
                while from < count {
                    while filled == lens[part] {
                        (part, filled) = (part + 1, 0);
                    }
                    let take = (lens[part] - filled).min(count - from);
                    runs.push((part, from, take));
                    (from, filled) = (from + take, filled + take);
                }
                super::staging::copy_runs(&mut parts[first_part..=part], first_part, &runs, piece);
                at += count;
            }
            Ok(())
        })?;
        Ok(parts)
    }

    /// Copy `n` elements `src[from ..]` → `dst[to ..]` on the stream.
    pub fn copy<T>(
        &self,
        src: &DevMem<T>,
        from: usize,
        dst: &DevMem<T>,
        to: usize,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if from + n > src.len() || to + n > dst.len() {
            return Err(EngineError::Device(format!(
                "copying {n} values from {from} of {} to {to} of {}",
                src.len(),
                dst.len()
            )));
        }
        let size = std::mem::size_of::<T>();
        self.bind()?;
        // SAFETY: both ranges are inside their blocks (checked above), and
        // the copy is ordered on the stream like every other use.
        self.gaps
            .call(host_gaps::DTOD_COPY, || unsafe {
                driver::memcpy_dtod_async(
                    dst.ptr() + (to * size) as u64,
                    src.ptr() + (from * size) as u64,
                    n * size,
                    self.stream.cu_stream(),
                )
            })
            .map_err(|e| dev_err("device copy", e))
    }

    /// Wait for every queued op (errors of asynchronous kernels surface
    /// here).
    /// Starts (`on`) or stops the profiler's capture range: under
    /// `ncu --profile-from-start off` only the kernels between the two are
    /// profiled (the bench's verify-window profile). Waits for the queued
    /// work first, so the range holds exactly the launches made inside it.
    pub fn profiler_range(&self, on: bool) -> Result<()> {
        self.sync()?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| dev_err("cuCtxSetCurrent", e))?;
        // SAFETY: plain driver calls on the bound context; no pointers.
        let r = unsafe {
            if on {
                driver_sys::cuProfilerStart()
            } else {
                driver_sys::cuProfilerStop()
            }
        };
        r.result().map_err(|e| dev_err("cuProfilerStart/Stop", e))
    }

    pub fn sync(&self) -> Result<()> {
        let start = std::time::Instant::now();
        let r = self
            .gaps
            .call(host_gaps::SYNCHRONIZE, || self.stream.synchronize())
            .map_err(|e| dev_err("stream synchronize", e));
        self.sync_wait_ns
            .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }
}

/// A device allocation's address, as kernels take it.
pub(super) fn ptr<T>(s: &CudaSlice<T>) -> u64 {
    let (p, _record) = s.device_ptr(s.stream());
    p
}

#[cfg(test)]
mod tests {
    use super::{Pdl, within_bounds};

    #[test]
    fn blocks_wider_than_a_kernels_launch_bounds_are_refused() {
        within_bounds("k", Some(256), 256).unwrap();
        within_bounds("k", Some(256), 128).unwrap();
        within_bounds("k", None, 1024).unwrap();
        let e = within_bounds("f16w_one_f16", Some(256), 512).unwrap_err();
        assert!(e.to_string().contains("`f16w_one_f16`") && e.to_string().contains("512"));
    }

    #[test]
    fn dependent_launch_needs_hopper_and_can_be_limited_or_turned_off() {
        assert_eq!(Pdl::for_device(8, None), Pdl::Off);
        assert_eq!(Pdl::for_device(8, Some("1")), Pdl::Off);
        assert_eq!(Pdl::for_device(9, None), Pdl::All);
        assert_eq!(Pdl::for_device(9, Some("0")), Pdl::Off);
        assert_eq!(Pdl::for_device(10, Some("capture")), Pdl::Captures);
        assert!(Pdl::Captures.applies(true) && !Pdl::Captures.applies(false));
        assert!(Pdl::All.applies(false) && !Pdl::Off.applies(true));
        for m in [Pdl::Off, Pdl::Captures, Pdl::All] {
            assert_eq!(Pdl::from_u8(m as u8), m);
        }
    }
}
