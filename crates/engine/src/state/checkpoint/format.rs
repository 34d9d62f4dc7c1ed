//! The checkpoint file: one session image, self-describing.
//!
//! ```text
//! magic "DS4CKPT\0" | format version u32 | header length u64 | header (JSON)
//! | payload (tensors, little-endian, in table order, back to back) | crc32 u32
//! ```
//!
//! The CRC covers every byte before it. A reader checks, in this order and
//! before allocating any tensor: magic, format version, header length against
//! the file length, the header itself (identity, token key against the state
//! length, every table entry's size and offset against the payload length),
//! then the checksum (streamed through a fixed buffer). Only then are the
//! tensors read. Writes go to a temporary file in the same directory which
//! is fsynced and renamed over the final name, and the directory is fsynced,
//! so a crash leaves the old file or the new one, never a partial one under
//! a checkpoint name (and a partial temporary file fails its checks anyway).

use std::fs::{self, File};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::decode::SessionImage;
use crate::table::{NamedTensor, TensorData};

pub const MAGIC: &[u8; 8] = b"DS4CKPT\0";
/// Layout of the file (this module). Bumped when the byte layout changes.
pub const FORMAT_VERSION: u32 = 1;
/// Extension of complete checkpoints; temporary files never carry it.
pub const EXTENSION: &str = "ckpt";
/// Prefix of in-progress writes (removed at startup).
pub const TEMP_PREFIX: &str = ".tmp-";
/// A header longer than this is refused before it is read: even a 1M-token
/// key stays well under it.
const MAX_HEADER: u64 = 64 << 20;
/// magic + version + header length.
const PREAMBLE: u64 = 8 + 4 + 8;
const TRAILER: u64 = 4;

/// What a checkpoint must match to be reused: anything that changes what a
/// stored state means. `state_version` is the engine's
/// [`super::STATE_FORMAT_VERSION`] at write time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Fingerprint of the weights (see [`super::fingerprint_path`]) plus,
    /// folded in by the caller, anything else the state depends on (MTP
    /// head, architecture config).
    pub model: String,
    /// Fingerprint of the tokenizer and chat template.
    pub tokenizer: String,
    pub family: String,
    pub state_version: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableEntry {
    pub name: String,
    /// `"f32"` or `"u32"` (both 4 bytes, little-endian).
    pub dtype: String,
    pub shape: Vec<u64>,
    /// Byte offset from the start of the payload.
    pub offset: u64,
    pub len: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    pub identity: Identity,
    /// The token key: exactly the tokens the stored state covers.
    pub tokens: Vec<u32>,
    /// Tokens the stored model state covers (must equal `tokens.len()`).
    pub covered: u64,
    pub tensors: Vec<TableEntry>,
    pub payload_len: u64,
}

/// Why a file was refused (the label is what logs and metrics count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RejectReason {
    Io,
    Truncated,
    BadMagic,
    WrongFormatVersion,
    BadHeader,
    WrongStateVersion,
    OtherModel,
    OtherTokenizer,
    OtherFamily,
    KeyStateMismatch,
    BadTable,
    Checksum,
    BadState,
}

impl RejectReason {
    pub fn label(self) -> &'static str {
        match self {
            RejectReason::Io => "io",
            RejectReason::Truncated => "truncated",
            RejectReason::BadMagic => "bad_magic",
            RejectReason::WrongFormatVersion => "wrong_format_version",
            RejectReason::BadHeader => "bad_header",
            RejectReason::WrongStateVersion => "wrong_state_version",
            RejectReason::OtherModel => "other_model",
            RejectReason::OtherTokenizer => "other_tokenizer",
            RejectReason::OtherFamily => "other_family",
            RejectReason::KeyStateMismatch => "key_state_mismatch",
            RejectReason::BadTable => "bad_table",
            RejectReason::Checksum => "checksum",
            RejectReason::BadState => "bad_state",
        }
    }

    /// A file that belongs to another model or tokenizer is valid, just not
    /// ours: it is skipped, never deleted (the directory may be shared).
    pub fn is_foreign(self) -> bool {
        matches!(
            self,
            RejectReason::OtherModel | RejectReason::OtherTokenizer | RejectReason::OtherFamily
        )
    }
}

#[derive(Debug, thiserror::Error)]
#[error("checkpoint {}: {} ({detail})", path.display(), reason.label())]
pub struct CheckpointError {
    pub path: PathBuf,
    pub reason: RejectReason,
    pub detail: String,
}

fn reject(path: &Path, reason: RejectReason, detail: impl Into<String>) -> CheckpointError {
    CheckpointError {
        path: path.to_path_buf(),
        reason,
        detail: detail.into(),
    }
}

fn io(path: &Path, e: std::io::Error) -> CheckpointError {
    let reason = if e.kind() == std::io::ErrorKind::UnexpectedEof {
        RejectReason::Truncated
    } else {
        RejectReason::Io
    };
    reject(path, reason, e.to_string())
}

/// Write `image` to `path` atomically (temp file, fsync, rename, fsync dir).
/// Returns the file size.
pub fn write(path: &Path, identity: &Identity, image: &SessionImage) -> std::io::Result<u64> {
    let mut tensors = Vec::with_capacity(image.tensors.len());
    let mut offset = 0u64;
    for t in &image.tensors {
        let len = t.byte_len() as u64;
        tensors.push(TableEntry {
            name: t.name.clone(),
            dtype: match t.data {
                TensorData::F32(_) => "f32".into(),
                TensorData::U32(_) => "u32".into(),
            },
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            offset,
            len,
        });
        offset += len;
    }
    let header = Header {
        identity: identity.clone(),
        tokens: image.tokens.clone(),
        covered: image.covered as u64,
        tensors,
        payload_len: offset,
    };
    let header = serde_json::to_vec(&header).map_err(std::io::Error::other)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = dir.join(format!(
        "{TEMP_PREFIX}{name}.{}.{nanos}",
        std::process::id()
    ));
    let result = (|| {
        let file = File::options().write(true).create_new(true).open(&tmp)?;
        let mut w = HashingWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            crc: crc32fast::Hasher::new(),
        };
        w.write_all(MAGIC)?;
        w.write_all(&FORMAT_VERSION.to_le_bytes())?;
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        let mut buf = Vec::with_capacity(1 << 16);
        for t in &image.tensors {
            write_data(&mut w, &t.data, &mut buf)?;
        }
        let crc = w.crc.clone().finalize();
        let mut inner = w.inner;
        inner.write_all(&crc.to_le_bytes())?;
        let file = inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let size = file.metadata()?.len();
        drop(file);
        fs::rename(&tmp, path)?;
        // The rename is durable only once the directory entry is.
        File::open(dir)?.sync_all()?;
        Ok(size)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_data(w: &mut impl Write, data: &TensorData, buf: &mut Vec<u8>) -> std::io::Result<()> {
    // Convert in bounded chunks: a 4K-token state is hundreds of MB.
    const CHUNK: usize = 1 << 14;
    match data {
        TensorData::F32(v) => {
            for c in v.chunks(CHUNK) {
                buf.clear();
                c.iter()
                    .for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
                w.write_all(buf)?;
            }
        }
        TensorData::U32(v) => {
            for c in v.chunks(CHUNK) {
                buf.clear();
                c.iter()
                    .for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
                w.write_all(buf)?;
            }
        }
    }
    Ok(())
}

struct HashingWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// An opened, header-validated checkpoint (no tensor read yet).
pub struct Opened {
    pub path: PathBuf,
    pub header: Header,
    pub file_len: u64,
    header_len: u64,
    file: File,
}

/// Read and check everything but the checksum and the tensors. With
/// `expected`, the identity must match it.
pub fn open(path: &Path, expected: Option<&Identity>) -> Result<Opened, CheckpointError> {
    let mut file = File::open(path).map_err(|e| io(path, e))?;
    let file_len = file.metadata().map_err(|e| io(path, e))?.len();
    if file_len < PREAMBLE + TRAILER {
        return Err(reject(
            path,
            RejectReason::Truncated,
            format!("{file_len} bytes is shorter than the fixed preamble"),
        ));
    }
    let mut pre = [0u8; PREAMBLE as usize];
    file.read_exact(&mut pre).map_err(|e| io(path, e))?;
    if &pre[..8] != MAGIC {
        return Err(reject(path, RejectReason::BadMagic, "not a ds4 checkpoint"));
    }
    let version = u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]);
    if version != FORMAT_VERSION {
        return Err(reject(
            path,
            RejectReason::WrongFormatVersion,
            format!("format version {version}, this build reads {FORMAT_VERSION}"),
        ));
    }
    let mut hl = [0u8; 8];
    hl.copy_from_slice(&pre[12..20]);
    let header_len = u64::from_le_bytes(hl);
    if header_len > MAX_HEADER || header_len > file_len - PREAMBLE - TRAILER {
        return Err(reject(
            path,
            RejectReason::Truncated,
            format!("header of {header_len} bytes does not fit a {file_len}-byte file"),
        ));
    }
    let mut raw = vec![0u8; header_len as usize];
    file.read_exact(&mut raw).map_err(|e| io(path, e))?;
    let header: Header = serde_json::from_slice(&raw)
        .map_err(|e| reject(path, RejectReason::BadHeader, e.to_string()))?;
    if let Some(want) = expected {
        check_identity(path, &header.identity, want)?;
    }
    if header.covered != header.tokens.len() as u64 {
        return Err(reject(
            path,
            RejectReason::KeyStateMismatch,
            format!(
                "token key of {} tokens, stored state covers {}",
                header.tokens.len(),
                header.covered
            ),
        ));
    }
    let payload_len = file_len - PREAMBLE - header_len - TRAILER;
    if header.payload_len != payload_len {
        return Err(reject(
            path,
            RejectReason::Truncated,
            format!(
                "payload of {payload_len} bytes, the header promises {}",
                header.payload_len
            ),
        ));
    }
    let mut offset = 0u64;
    for t in &header.tensors {
        let elems = t
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|e| e.checked_mul(4));
        let ok_dtype = t.dtype == "f32" || t.dtype == "u32";
        if !ok_dtype || elems != Some(t.len) || t.offset != offset {
            return Err(reject(
                path,
                RejectReason::BadTable,
                format!(
                    "tensor `{}` ({} {:?}, {} bytes at {}) is inconsistent",
                    t.name, t.dtype, t.shape, t.len, t.offset
                ),
            ));
        }
        offset = offset.saturating_add(t.len);
    }
    if offset != payload_len {
        return Err(reject(
            path,
            RejectReason::BadTable,
            format!("tensor table covers {offset} of {payload_len} payload bytes"),
        ));
    }
    Ok(Opened {
        path: path.to_path_buf(),
        header,
        file_len,
        header_len,
        file,
    })
}

fn check_identity(path: &Path, got: &Identity, want: &Identity) -> Result<(), CheckpointError> {
    let mismatch = if got.state_version != want.state_version {
        Some((
            RejectReason::WrongStateVersion,
            format!(
                "state version {} (this build: {})",
                got.state_version, want.state_version
            ),
        ))
    } else if got.family != want.family {
        Some((
            RejectReason::OtherFamily,
            format!("family `{}`", got.family),
        ))
    } else if got.model != want.model {
        Some((RejectReason::OtherModel, format!("model `{}`", got.model)))
    } else if got.tokenizer != want.tokenizer {
        Some((
            RejectReason::OtherTokenizer,
            format!("tokenizer `{}`", got.tokenizer),
        ))
    } else {
        None
    };
    match mismatch {
        Some((reason, detail)) => Err(reject(path, reason, detail)),
        None => Ok(()),
    }
}

impl Opened {
    /// Verify the checksum (streamed), then read the tensors.
    pub fn load(mut self) -> Result<SessionImage, CheckpointError> {
        let path = self.path.clone();
        let p = path.as_path();
        self.file.seek(SeekFrom::Start(0)).map_err(|e| io(p, e))?;
        let body = self.file_len - TRAILER;
        let mut crc = crc32fast::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = body;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            self.file.read_exact(&mut buf[..n]).map_err(|e| io(p, e))?;
            crc.update(&buf[..n]);
            left -= n as u64;
        }
        let mut stored = [0u8; 4];
        self.file.read_exact(&mut stored).map_err(|e| io(p, e))?;
        if crc.finalize() != u32::from_le_bytes(stored) {
            return Err(reject(p, RejectReason::Checksum, "checksum mismatch"));
        }
        let start = PREAMBLE + self.header_len;
        self.file
            .seek(SeekFrom::Start(start))
            .map_err(|e| io(p, e))?;
        let mut tensors = Vec::with_capacity(self.header.tensors.len());
        let mut bytes = Vec::new();
        for t in &self.header.tensors {
            bytes.resize(t.len as usize, 0);
            self.file.read_exact(&mut bytes).map_err(|e| io(p, e))?;
            let words = bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]);
            let shape = t.shape.iter().map(|&d| d as usize).collect();
            tensors.push(if t.dtype == "f32" {
                NamedTensor::f32(&t.name, shape, words.map(f32::from_le_bytes).collect())
            } else {
                NamedTensor::u32(&t.name, shape, words.map(u32::from_le_bytes).collect())
            });
        }
        Ok(SessionImage {
            tokens: self.header.tokens,
            covered: self.header.covered as usize,
            tensors,
        })
    }
}

/// Open, validate and read a checkpoint in one go.
pub fn read(path: &Path, expected: &Identity) -> Result<SessionImage, CheckpointError> {
    open(path, Some(expected))?.load()
}
