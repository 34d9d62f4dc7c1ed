//! Durable session checkpoints: the file format ([`format`]) and the
//! directory store with its index and disk budget ([`store`]).

pub mod format;
pub mod store;

use std::hash::Hasher;
use std::path::Path;

pub use format::{CheckpointError, Identity, RejectReason};
pub use store::{CheckpointStore, FileInfo, StoreEntry};

/// What stored state means. Bump it whenever a family's export changes, or a
/// fix changes what a cache holds: older files are then rejected rather
/// than trusted. 1: llama KV prefix; qwen4_exp GDN/PLE/QSA caches and MTP
/// history; last logits and last trunk hidden.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// FNV-1a 64 over `bytes`, as 16 hex digits. Used for keys and identity
/// strings (not for integrity: files carry a CRC).
pub fn fnv_hex(bytes: &[u8]) -> String {
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    h.write(bytes);
    format!("{:016x}", h.finish())
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// A cheap fingerprint of model weights on disk: the canonical path, size
/// and modification time of the file, or of every file of a directory (a
/// safetensors model). Re-downloading or editing the weights changes it;
/// hashing gigabytes at every start would not be worth it.
pub fn fingerprint_path(path: &Path) -> std::io::Result<String> {
    let canon = path.canonicalize()?;
    let mut text = canon.to_string_lossy().into_owned();
    let mut files = Vec::new();
    if canon.is_dir() {
        for e in std::fs::read_dir(&canon)? {
            files.push(e?.path());
        }
        files.sort();
    } else {
        files.push(canon.clone());
    }
    for f in files {
        let m = std::fs::metadata(&f)?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        text.push_str(&format!("|{}:{}:{mtime}", f.display(), m.len()));
    }
    Ok(fnv_hex(text.as_bytes()))
}

/// What a checkpoint of the model at `model_path` must match: the weights
/// file(s), the tokenizer and chat template (inside the GGUF, or the
/// directory's tokenizer files), the backend and its kernel set, the family
/// and the engine's state format.
pub fn identity(
    model_path: &Path,
    family: &str,
    backend: &crate::backend::BackendId,
) -> crate::error::Result<Identity> {
    let io_err = |e: std::io::Error| crate::error::EngineError::File {
        path: model_path.to_path_buf(),
        message: format!("fingerprinting the model for checkpoints: {e}"),
    };
    let weights = fingerprint_path(model_path).map_err(io_err)?;
    // The backend and kernel set decide the last bits of every matmul, so
    // a state computed with AVX-512 kernels (or on a GPU) must not seed a
    // warm turn under AVX2 ones (warm must equal cold bit for bit).
    let model = format!("{weights}+{}", backend.tag);
    let tokenizer = if model_path.is_dir() {
        let mut bytes = Vec::new();
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            if let Ok(b) = std::fs::read(model_path.join(name)) {
                bytes.extend_from_slice(name.as_bytes());
                bytes.extend_from_slice(&b);
            }
        }
        fnv_hex(&bytes)
    } else {
        // A GGUF carries its tokenizer and template: the file fingerprint
        // covers them.
        format!("gguf:{weights}")
    };
    Ok(Identity {
        model,
        tokenizer,
        family: family.to_string(),
        state_version: STATE_FORMAT_VERSION,
    })
}
