//! The checkpoint directory: an index rebuilt from file headers at startup
//! (the files are the only source of truth), lookup by longest exact token
//! prefix, rejection counting, and a disk budget with LRU eviction (a hit
//! refreshes the file's modification time, so recency survives restarts).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::fnv_hex;
use super::format::{self, CheckpointError, EXTENSION, Identity, RejectReason, TEMP_PREFIX};
use crate::decode::LiveSession;
use crate::model::Model;

#[derive(Debug, Clone)]
pub struct StoreEntry {
    pub path: PathBuf,
    pub tokens: Vec<u32>,
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// A checkpoint file as `sessions list` shows it (any identity).
#[derive(Debug, Clone)]
pub struct FileInfo {
    pub path: PathBuf,
    pub bytes: u64,
    pub modified: Option<SystemTime>,
    /// The header, or why it was refused.
    pub header: Result<(Identity, usize), String>,
}

pub struct CheckpointStore {
    dir: PathBuf,
    identity: Identity,
    budget: u64,
    entries: Vec<StoreEntry>,
    rejections: BTreeMap<&'static str, u64>,
    /// Valid files of other models or tokenizers, left alone.
    foreign: usize,
}

impl CheckpointStore {
    /// Open (creating) `dir` and index the checkpoints of `identity`.
    /// Leftover temporary files of interrupted writes are removed; files
    /// that fail their header checks are removed and counted; other
    /// identities' files are skipped. Then the budget is enforced.
    pub fn open(dir: &Path, identity: Identity, budget: u64) -> std::io::Result<Self> {
        fs::create_dir_all(dir)?;
        let mut store = Self {
            dir: dir.to_path_buf(),
            identity,
            budget,
            entries: Vec::new(),
            rejections: BTreeMap::new(),
            foreign: 0,
        };
        for e in fs::read_dir(dir)? {
            let path = e?.path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.starts_with(TEMP_PREFIX) {
                let _ = fs::remove_file(&path);
                continue;
            }
            if path.extension().is_none_or(|x| x != EXTENSION) {
                continue;
            }
            match format::open(&path, Some(&store.identity)) {
                Ok(o) => {
                    let last_used = fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    store.entries.push(StoreEntry {
                        path,
                        tokens: o.header.tokens,
                        bytes: o.file_len,
                        last_used,
                    });
                }
                Err(e) if e.reason.is_foreign() => store.foreign += 1,
                Err(e) => store.reject(e),
            }
        }
        store.evict(None);
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn entries(&self) -> &[StoreEntry] {
        &self.entries
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Refused files by reason label (for logs and /metrics).
    pub fn rejections(&self) -> &BTreeMap<&'static str, u64> {
        &self.rejections
    }

    pub fn foreign_files(&self) -> usize {
        self.foreign
    }

    fn reject(&mut self, e: CheckpointError) {
        tracing::warn!("{e}");
        *self.rejections.entry(e.reason.label()).or_default() += 1;
        if !e.reason.is_foreign() {
            let _ = fs::remove_file(&e.path);
        }
        self.entries.retain(|x| x.path != e.path);
    }

    fn path_for(&self, tokens: &[u32]) -> PathBuf {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.dir
            .join(format!("{}-{}.{EXTENSION}", fnv_hex(&bytes), tokens.len()))
    }

    /// The stored session sharing the longest exact prefix with `prompt`,
    /// loaded, fully validated and rewound to that prefix (see
    /// [`LiveSession::rewind_for`]). A session that is a prefix of `prompt`
    /// is used whole; one that only shares a shorter prefix is used only if
    /// its state can be truncated (attention-only families; a recurrent
    /// state is restorable only at its stored end). A file that fails is
    /// removed, counted, and the next candidate tried; `None` means a cold
    /// start.
    pub fn lookup<M: Model>(&mut self, model: &M, prompt: &[u32]) -> Option<LiveSession<M>> {
        let mut order: Vec<(usize, PathBuf)> = self
            .entries
            .iter()
            .map(|e| {
                let common = e
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                (common, e.path.clone())
            })
            .filter(|(c, _)| *c > 0)
            .collect();
        order.sort_by(|a, b| b.cmp(a));
        for (_, path) in order {
            let loaded = format::read(&path, &self.identity).and_then(|image| {
                LiveSession::import(model, image).map_err(|e| CheckpointError {
                    path: path.clone(),
                    reason: RejectReason::BadState,
                    detail: e.to_string(),
                })
            });
            let mut session = match loaded {
                Ok(s) => s,
                Err(e) => {
                    self.reject(e);
                    continue;
                }
            };
            if session.rewind_for(model, prompt) == 0 {
                continue;
            }
            let now = SystemTime::now();
            if let Ok(f) = fs::File::options().write(true).open(&path) {
                let _ = f.set_modified(now);
            }
            if let Some(e) = self.entries.iter_mut().find(|e| e.path == path) {
                e.last_used = now;
            }
            return Some(session);
        }
        None
    }

    /// Write `session` as a checkpoint (replacing one with the same key),
    /// then evict least recently used files until the store fits its budget.
    pub fn save<M: Model>(&mut self, session: &LiveSession<M>) -> crate::error::Result<PathBuf> {
        let image = session.export()?;
        let path = self.path_for(&image.tokens);
        let bytes = format::write(&path, &self.identity, &image).map_err(|e| {
            crate::error::EngineError::File {
                path: path.clone(),
                message: format!("writing checkpoint: {e}"),
            }
        })?;
        self.entries.retain(|e| e.path != path);
        self.entries.push(StoreEntry {
            path: path.clone(),
            tokens: image.tokens,
            bytes,
            last_used: SystemTime::now(),
        });
        self.evict(Some(&path));
        Ok(path)
    }

    /// Remove least recently used entries until the total fits; `keep` goes
    /// last (only if it alone exceeds the budget).
    fn evict(&mut self, keep: Option<&Path>) {
        while self.total_bytes() > self.budget && !self.entries.is_empty() {
            let victim = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| (Some(e.path.as_path()) == keep, e.last_used))
                .map(|(i, _)| i)
                .unwrap_or(0);
            let e = self.entries.remove(victim);
            let _ = fs::remove_file(&e.path);
        }
    }
}

/// Every checkpoint file in `dir` with its header (any identity).
pub fn list(dir: &Path) -> std::io::Result<Vec<FileInfo>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().is_none_or(|x| x != EXTENSION) {
            continue;
        }
        let meta = fs::metadata(&path)?;
        let header = format::open(&path, None)
            .map(|o| (o.header.identity, o.header.tokens.len()))
            .map_err(|e| e.reason.label().to_string());
        out.push(FileInfo {
            path,
            bytes: meta.len(),
            modified: meta.modified().ok(),
            header,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Remove every checkpoint (and leftover temporary file) in `dir`; returns
/// how many files and bytes were removed.
pub fn clear(dir: &Path) -> std::io::Result<(usize, u64)> {
    let (mut n, mut bytes) = (0, 0);
    if !dir.exists() {
        return Ok((0, 0));
    }
    for e in fs::read_dir(dir)? {
        let path = e?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if path.extension().is_some_and(|x| x == EXTENSION) || name.starts_with(TEMP_PREFIX) {
            bytes += fs::metadata(&path).map_or(0, |m| m.len());
            fs::remove_file(&path)?;
            n += 1;
        }
    }
    Ok((n, bytes))
}
