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

/// Values of a piece from which its runs are copied on several threads.
const PARALLEL_COPY_MIN: usize = 1 << 20;
/// Threads of such a copy at most.
const COPY_THREADS: usize = 8;

/// Append each run `(part, start, len)` of `piece` to its part (`parts`
/// starts at part `first`; a part has at most one run a piece). A large
/// piece of many parts — a 64-session batch's logits, 12.6 MB for the
/// SmolLM2 shape — is copied by several threads, a run each at a time,
/// where one thread's copy took a millisecond of the batch; the values
/// are the same either way.
pub(super) fn copy_runs<T: Clone + Send + Sync>(
    parts: &mut [Vec<T>],
    first: usize,
    runs: &[(usize, usize, usize)],
    piece: &[T],
) {
    let threads = if piece.len() >= PARALLEL_COPY_MIN {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(COPY_THREADS)
            .min(runs.len())
    } else {
        1
    };
    let copy = |targets: &mut [Vec<T>], runs: &[(usize, usize, usize)], base: usize| {
        for &(p, start, len) in runs {
            targets[p - base].extend_from_slice(&piece[start..start + len]);
        }
    };
    if threads <= 1 {
        return copy(parts, runs, first);
    }
    // Contiguous groups of runs (so of parts), about equal in values.
    let per = piece.len().div_ceil(threads);
    std::thread::scope(|s| {
        let (mut rest, mut base, mut i) = (parts, first, 0);
        while i < runs.len() {
            let mut j = i;
            let mut values = 0;
            while j < runs.len() && (j == i || values + runs[j].2 <= per) {
                values += runs[j].2;
                j += 1;
            }
            let last = runs[j - 1].0;
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(last + 1 - base);
            let group = &runs[i..j];
            let group_base = base;
            if j == runs.len() {
                copy(mine, group, group_base);
            } else {
                s.spawn(move || copy(mine, group, group_base));
            }
            (rest, base, i) = (tail, last + 1, j);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs copied on several threads land in their parts as one thread
    /// copies them: parts of every size (empty ones too), a piece that
    /// starts inside a part and ends inside another.
    #[test]
    fn runs_copied_in_parallel_equal_one_copy() {
        let lens: Vec<usize> = (0..70)
            .map(|i| if i % 9 == 0 { 0 } else { 30_000 + 977 * i })
            .collect();
        let n: usize = lens.iter().sum();
        assert!(n > PARALLEL_COPY_MIN);
        let values: Vec<u32> = (0..n as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        // The piece: values[skip..], part 3 already holding `skip` - (parts
        // before it) values.
        let before: usize = lens[..3].iter().sum();
        let skip = before + 1234;
        let mut parts: Vec<Vec<u32>> = lens.iter().map(|&l| Vec::with_capacity(l)).collect();
        for (p, part) in parts.iter_mut().enumerate().take(3) {
            let at: usize = lens[..p].iter().sum();
            part.extend_from_slice(&values[at..at + lens[p]]);
        }
        parts[3].extend_from_slice(&values[before..skip]);
        let mut runs = Vec::new();
        let (mut part, mut filled, mut from) = (3, 1234, 0);
        while from < n - skip {
            while filled == lens[part] {
                (part, filled) = (part + 1, 0);
            }
            let take = (lens[part] - filled).min(n - skip - from);
            runs.push((part, from, take));
            (from, filled) = (from + take, filled + take);
        }
        assert!(runs.len() > COPY_THREADS);
        copy_runs(&mut parts[3..], 3, &runs, &values[skip..]);
        let mut at = 0;
        for (p, part) in parts.iter().enumerate() {
            assert_eq!(part.as_slice(), &values[at..at + lens[p]], "part {p}");
            at += lens[p];
        }
    }
}
