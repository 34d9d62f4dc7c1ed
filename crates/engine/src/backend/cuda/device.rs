//! One CUDA device as the backend sees it: a context, one stream every op
//! is queued on (so ops run in program order and memory is freed in stream
//! order), the loaded kernel set, and raw kernel launches.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    ValidAsZeroBits, result as driver, sys as driver_sys,
};
use cudarc::nvrtc::Ptx;

use super::nvrtc;
use super::signature::{self, Param};
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

    /// One warp per item, four warps per block.
    pub fn warps(n: usize) -> Self {
        let blocks = (n as u64).div_ceil(4).clamp(1, MAX_BLOCKS);
        Shape {
            grid: (blocks as u32, 1),
            block: 128,
        }
    }
}

pub(super) struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    /// Each kernel's parameters, from the embedded sources.
    signatures: HashMap<String, Vec<Param>>,
    pub arch: String,
    pub name: String,
    pub kernels_hash: u64,
    /// Where the kernels came from and how long compiling took (0 when
    /// loaded from the cache or a cubin).
    pub kernels_origin: String,
    pub compile_seconds: f64,
    /// Kernels launched so far (for launch-count reports).
    pub launches: AtomicU64,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.arch)
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
        let signatures = signature::parse(&text).map_err(EngineError::Device)?;
        Ok(Self {
            ctx,
            stream,
            module,
            functions: Mutex::new(HashMap::new()),
            signatures,
            arch,
            name,
            kernels_hash: cubin.hash,
            kernels_origin: cubin.origin,
            compile_seconds: cubin.compile_seconds,
            launches: AtomicU64::new(0),
        })
    }

    fn function(&self, name: &'static str) -> Result<CudaFunction> {
        let mut cache = self
            .functions
            .lock()
            .map_err(|_| EngineError::Device("the kernel table lock is poisoned".into()))?;
        if let Some(f) = cache.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module
            .load_function(name)
            .map_err(|e| dev_err(&format!("kernel `{name}`"), e))?;
        cache.insert(name, f.clone());
        Ok(f)
    }

    /// Queue kernel `name` on the stream.
    pub fn launch(&self, name: &'static str, shape: Shape, args: &[Arg]) -> Result<()> {
        let sig = self
            .signatures
            .get(name)
            .ok_or_else(|| EngineError::Device(format!("no kernel `{name}` in the sources")))?;
        if sig.len() != args.len() || !sig.iter().zip(args).all(|(p, a)| p.matches(a)) {
            return Err(EngineError::Device(format!(
                "kernel `{name}` takes {sig:?}, was given {args:?}"
            )));
        }
        let f = self.function(name)?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        let mut params: Vec<*mut c_void> = args
            .iter()
            .map(|a| match a {
                Arg::U64(v) => v as *const u64 as *mut c_void,
                Arg::U32(v) => v as *const u32 as *mut c_void,
                Arg::I32(v) => v as *const i32 as *mut c_void,
                Arg::F32(v) => v as *const f32 as *mut c_void,
            })
            .collect();
        self.ctx
            .bind_to_thread()
            .map_err(|e| dev_err("binding the context", e))?;
        // SAFETY: `params` points at live values of the types the kernel
        // declares (each op passes its kernel's signature); device pointers
        // come from live allocations of this context, and every op queues
        // on this one stream, so buffers outlive the kernels that use them
        // (frees are stream-ordered).
        unsafe {
            driver::launch_kernel(
                f.cu_function(),
                (shape.grid.0, shape.grid.1, 1),
                (shape.block, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(|e| dev_err(&format!("launching `{name}`"), e))
    }

    /// An uninitialised allocation of `n` elements (at least one: the
    /// driver refuses empty allocations).
    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller writes the elements it later reads (kernels
        // write their whole output; copies fill their destination).
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| dev_err("allocation", e))
    }

    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .map_err(|e| dev_err("allocation", e))
    }

    /// Copy host values to a new allocation.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        if host.is_empty() {
            return self.alloc(0);
        }
        self.stream
            .clone_htod(host)
            .map_err(|e| dev_err("host-to-device copy", e))
    }

    /// The first `n` elements of `s` on the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        s: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.stream
            .clone_dtoh(&s.slice(..n))
            .map_err(|e| dev_err("device-to-host copy", e))
    }

    /// Copy `n` elements `src[from ..]` → `dst[to ..]` on the stream.
    pub fn copy<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        from: usize,
        dst: &mut CudaSlice<T>,
        to: usize,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let src = src.slice(from..from + n);
        let mut dst = dst.slice_mut(to..to + n);
        self.stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(|e| dev_err("device copy", e))
    }

    /// Wait for every queued op (errors of asynchronous kernels surface
    /// here).
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| dev_err("stream synchronize", e))
    }
}

/// A device allocation's address, as kernels take it.
pub(super) fn ptr<T>(s: &CudaSlice<T>) -> u64 {
    let (p, _record) = s.device_ptr(s.stream());
    p
}
