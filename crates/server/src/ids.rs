//! Response and tool-call ids: unique per process, unpredictable enough that
//! clients cannot confuse two responses.

use std::sync::atomic::{AtomicU64, Ordering};

pub fn new_id(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // A fresh seed is randomly keyed per call; mixing in the counter keeps
    // two ids distinct even if the randomness repeated.
    let r = ds4_sampling::resolve_seed(None, None);
    format!("{prefix}{:08x}{:08x}", r as u32, n as u32)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
