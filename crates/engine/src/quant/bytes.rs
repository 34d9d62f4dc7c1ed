//! [`WeightBytes`]: a cheap, shareable view of stored weight bytes (a range
//! of a memory-mapped file, or an owned buffer).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// A byte range of a shared owner (a `memmap2::Mmap`, a `Vec<u8>`). Cloning
/// and slicing never copy.
#[derive(Clone)]
pub struct WeightBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl WeightBytes {
    /// All of `owner`.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Self {
        let len = (*owner).as_ref().len();
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
    pub fn range(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> Option<Self> {
        let total = (*owner).as_ref().len();
        (range.start <= range.end && range.end <= total).then_some(Self {
            owner,
            start: range.start,
            len: range.end - range.start,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
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
