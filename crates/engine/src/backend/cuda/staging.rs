//! Page-locked host memory that downloads land in.
//!
//! A copy into pageable memory runs at about a third of the link's speed
//! (the driver stages it through a page-locked buffer of its own), and the
//! `Vec` it filled had to be zeroed first: for the 12.6 MB of logits of a
//! 64-session SmolLM2-shaped batch that was 1.2 ms of zeroing and 1.4 ms
//! of copying in a 10 ms step (run 38's host profile). Here the device
//! writes into one page-locked block kept for the device's lifetime (grown
//! as needed up to [`STAGING_BYTES`]; larger downloads go through it in
//! pieces), and the host copies each piece into a `Vec` that was never
//! zeroed. The bytes are the device's either way.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;
use cudarc::driver::result as driver;

use crate::error::{EngineError, Result};

/// The page-locked block grows to at most this many bytes.
pub const STAGING_BYTES: usize = 64 << 20;
/// ... and starts at this many (a decode row's logits of a large vocabulary).
const FIRST_BYTES: usize = 1 << 20;

/// A page-locked block and its size in bytes.
struct Block {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the block is plain host memory; `Staging` hands it out only
// under its lock.
unsafe impl Send for Block {}

/// The block, allocated at the first download.
pub(super) struct Staging {
    ctx: Arc<CudaContext>,
    block: Mutex<Option<Block>>,
}

impl Staging {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self {
            ctx,
            block: Mutex::new(None),
        }
    }

    /// Run `f` with the block (at least `min(bytes, STAGING_BYTES)` bytes,
    /// its length passed along), held until `f` returns. Its contents are
    /// initialised (zeroed when allocated) but otherwise whatever the last
    /// user left.
    pub fn with<R>(&self, bytes: usize, f: impl FnOnce(*mut u8, usize) -> Result<R>) -> Result<R> {
        let want = bytes.clamp(1, STAGING_BYTES);
        let mut held = self
            .block
            .lock()
            .map_err(|_| EngineError::Device("the download staging lock is poisoned".into()))?;
        if held.as_ref().is_none_or(|b| b.bytes < want) {
            let grown = held.as_ref().map_or(FIRST_BYTES, |b| 2 * b.bytes);
            let size = want.max(grown).min(STAGING_BYTES);
            if let Some(old) = held.take() {
                self.free(old);
            }
            self.bind()?;
            // SAFETY: a plain page-locked allocation on the bound context.
            let ptr = unsafe { driver::malloc_host(size, 0) }
                .map_err(|e| EngineError::Device(format!("page-locked {size} bytes: {e:?}")))?
                as *mut u8;
            // SAFETY: `ptr` holds `size` bytes; zeroed so every read of
            // the block reads initialised memory.
            unsafe { std::ptr::write_bytes(ptr, 0, size) };
            *held = Some(Block { ptr, bytes: size });
        }
        let block = held.as_ref().expect("allocated above");
        f(block.ptr, block.bytes)
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| EngineError::Device(format!("binding the context: {e:?}")))
    }

    fn free(&self, block: Block) {
        if self.bind().is_ok() {
            // SAFETY: allocated by `malloc_host` on this context; nothing
            // refers to it (the lock is held or the owner is dropping).
            let _ = unsafe { driver::free_host(block.ptr.cast()) };
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(block) = self.block.get_mut().ok().and_then(Option::take) {
            self.free(block);
        }
    }
}
