//! [`WeightBytes`]: a cheap, shareable view of stored weight bytes (a range
//! of a memory-mapped file, or an owned buffer).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// What holds stored weight bytes: a read-only file map or a buffer.
pub trait WeightOwner: Send + Sync {
    fn bytes(&self) -> &[u8];
    /// The bytes of `range` will not be read again soon: a file map drops
    /// its resident pages (they are read back from the file if they are),
    /// a buffer keeps them.
    fn release(&self, _range: Range<usize>) {}
}

impl WeightOwner for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl WeightOwner for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn release(&self, range: Range<usize>) {
        // Whole pages inside the range only: a neighbouring tensor's pages
        // stay.
        let page = 4096;
        let start = range.start.div_ceil(page) * page;
        let end = range.end / page * page;
        if start < end {
            // SAFETY: the map is read-only and private; MADV_DONTNEED drops
            // clean file pages, which the kernel reads back from the file
            // on the next access, so no value changes. An error only means
            // the pages stay resident.
            let _ = unsafe {
                self.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

/// A byte range of a shared owner (a `memmap2::Mmap`, a `Vec<u8>`). Cloning
/// and slicing never copy.
#[derive(Clone)]
pub struct WeightBytes {
    owner: Arc<dyn WeightOwner>,
    start: usize,
    len: usize,
}

impl WeightBytes {
    /// All of `owner`.
    pub fn new(owner: Arc<dyn WeightOwner>) -> Self {
        let len = owner.bytes().len();
        Self {
            owner,
            start: 0,
            len,
        }
    }

    /// An owned buffer.
    pub fn owned(bytes: Vec<u8>) -> Self {
        Self::new(Arc::new(bytes))
    }

    /// `range` of `owner`; `None` when it does not fit.
    pub fn range(owner: Arc<dyn WeightOwner>, range: Range<usize>) -> Option<Self> {
        let total = owner.bytes().len();
        (range.start <= range.end && range.end <= total).then_some(Self {
            owner,
            start: range.start,
            len: range.end - range.start,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.owner.bytes()[self.start..self.start + self.len]
    }

    /// These bytes were copied into another layout (a backend's repack or
    /// upload): a file map may drop their pages, so resident memory is
    /// the copy, not the copy plus the file.
    pub fn release(&self) {
        self.owner.release(self.start..self.start + self.len);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A sub-range (relative to this view). Panics when out of range: callers
    /// compute ranges from shapes they validated.
    pub fn slice(&self, range: Range<usize>) -> Self {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "weight byte range {range:?} outside a view of {} bytes",
            self.len
        );
        Self {
            owner: self.owner.clone(),
            start: self.start + range.start,
            len: range.end - range.start,
        }
    }
}

impl fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WeightBytes({} bytes)", self.len)
    }
}
