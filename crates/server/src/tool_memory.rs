//! Exact tool-call replay memory: call id → the exact DSML block the model
//! sampled for it (ds4's "Tool Call Text Memory", `tool_memory_*` in
//! `antirez/ds4:ds4_server.c`).
//!
//! The model speaks DSML; clients send calls back as JSON, which the server
//! can only re-render canonically (key order, spacing and number spelling may
//! differ from what was sampled). Re-rendered bytes break the prefix the
//! session cache holds, so the next request prefills the whole conversation
//! again. With the sampled block remembered under the call ids it produced,
//! the prompt repeats the model's own bytes and the cached state stays
//! usable.
//!
//! A block is replayed for an assistant message only when *every* call id of
//! the message is remembered and all name the same block (otherwise canonical
//! DSML, as ds4). The memory is bounded in entries and bytes and forgets the
//! least recently used ids first.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// ds4's `DS4_TOOL_MEMORY_DEFAULT_MAX_IDS`.
pub const DEFAULT_MAX_IDS: usize = 100_000;
/// ds4's `DS4_TOOL_MEMORY_MAX_BYTES`.
pub const DEFAULT_MAX_BYTES: usize = 512 * 1024 * 1024;

struct Entry {
    block: Arc<str>,
    stamp: u64,
}

#[derive(Default)]
struct Lru {
    by_id: HashMap<String, Entry>,
    /// stamp → id, oldest first.
    order: BTreeMap<u64, String>,
    clock: u64,
    /// Ids plus blocks (a block shared by several ids counted once per id:
    /// an upper bound).
    bytes: usize,
}

/// The shared memory (cheap to clone: one `Arc`).
#[derive(Clone)]
pub struct ToolMemory {
    inner: Arc<Mutex<Lru>>,
    max_ids: usize,
    max_bytes: usize,
}

impl std::fmt::Debug for ToolMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolMemory")
            .field("ids", &self.len())
            .field("max_ids", &self.max_ids)
            .finish_non_exhaustive()
    }
}

impl Default for ToolMemory {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_IDS, DEFAULT_MAX_BYTES)
    }
}

impl ToolMemory {
    pub fn new(max_ids: usize, max_bytes: usize) -> Self {
        Self {
            inner: Arc::default(),
            max_ids,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding the lock cannot leave the maps inconsistent
        // in a way that matters here (at worst an id is missing): keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remember `block` as what the model sampled for the calls `ids`.
    pub fn remember(&self, ids: &[String], block: &str) {
        if block.is_empty() || self.max_ids == 0 {
            return;
        }
        let block: Arc<str> = Arc::from(block);
        let mut m = self.lock();
        for id in ids.iter().filter(|id| !id.is_empty()) {
            m.clock += 1;
            let stamp = m.clock;
            let cost = id.len() + block.len();
            if let Some(old) = m.by_id.insert(
                id.clone(),
                Entry {
                    block: block.clone(),
                    stamp,
                },
            ) {
                m.order.remove(&old.stamp);
                m.bytes -= id.len() + old.block.len();
            }
            m.order.insert(stamp, id.clone());
            m.bytes += cost;
        }
        while m.by_id.len() > self.max_ids || m.bytes > self.max_bytes {
            let Some((_, id)) = m.order.pop_first() else {
                break;
            };
            if let Some(old) = m.by_id.remove(&id) {
                m.bytes -= id.len() + old.block.len();
            }
        }
    }

    /// The block to replay for an assistant message whose calls have `ids`:
    /// every id remembered and all with the same block. Touches the ids.
    pub fn replay(&self, ids: &[&str]) -> Option<Arc<str>> {
        if ids.is_empty() {
            return None;
        }
        let mut m = self.lock();
        let mut found: Option<Arc<str>> = None;
        for id in ids {
            let block = m.by_id.get(*id)?.block.clone();
            match &found {
                Some(b) if **b != *block => return None,
                _ => found = Some(block),
            }
        }
        for id in ids {
            m.clock += 1;
            let stamp = m.clock;
            if let Some(e) = m.by_id.get_mut(*id) {
                let old = std::mem::replace(&mut e.stamp, stamp);
                m.order.remove(&old);
                m.order.insert(stamp, id.to_string());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn replays_only_when_every_id_names_one_block() {
        let m = ToolMemory::default();
        m.remember(&ids(&["a", "b"]), "BLOCK1");
        m.remember(&ids(&["c"]), "BLOCK2");
        assert_eq!(m.replay(&["a", "b"]).as_deref(), Some("BLOCK1"));
        assert_eq!(m.replay(&["a"]).as_deref(), Some("BLOCK1"));
        assert_eq!(m.replay(&["a", "c"]), None, "two blocks");
        assert_eq!(m.replay(&["a", "zzz"]), None, "an unknown id");
        assert_eq!(m.replay(&[]), None);
        m.remember(&ids(&["a"]), "BLOCK3");
        assert_eq!(m.replay(&["a", "b"]), None, "a now names another block");
    }

    #[test]
    fn least_recently_used_ids_go_first_within_both_bounds() {
        let m = ToolMemory::new(2, usize::MAX);
        m.remember(&ids(&["a"]), "A");
        m.remember(&ids(&["b"]), "B");
        assert!(m.replay(&["a"]).is_some(), "touch a");
        m.remember(&ids(&["c"]), "C");
        assert_eq!(m.len(), 2);
        assert!(m.replay(&["b"]).is_none(), "b was the least recent");
        assert!(m.replay(&["a"]).is_some() && m.replay(&["c"]).is_some());

        let m = ToolMemory::new(100, 10);
        m.remember(&ids(&["x"]), "12345");
        m.remember(&ids(&["y"]), "67890");
        assert!(m.replay(&["x"]).is_none(), "over the byte bound");
        assert_eq!(m.replay(&["y"]).as_deref(), Some("67890"));
    }
}
