//! The default model's MTP head: a file of ~9 MB made by `tools/mtp_head`
//! (self-distillation against the model itself), shipped inside this crate
//! and written next to the model in the user cache, where it is read from.
//!
//! Every load checks the file's size and SHA-256 against the pinned values;
//! a wrong or truncated file is refused with a message that says how to
//! restore it (the model then runs without MTP). A missing file is written
//! from the embedded copy (atomically: a temporary file renamed into place).

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::{DEFAULT_MODEL, KnownModel, sha256_file};

/// An MTP head trained for one known model.
#[derive(Debug, Clone, Copy)]
pub struct KnownHead {
    /// The model it belongs to.
    pub model: KnownModel,
    /// File name, next to the model's file.
    pub file_name: &'static str,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: &'static str,
    pub size_bytes: u64,
    /// SHA-256 of the heads this one replaces (earlier releases wrote them
    /// next to the model): such a file is overwritten with this head, not
    /// refused, so an upgrade keeps MTP on.
    pub superseded: &'static [&'static str],
    /// Drafts accepted per cycle at greedy depth d (`[d - 1]`) under the
    /// CPU's fast kernel set, on the tuning prompts (lines 1–8 of
    /// `bench/mtp_prompts.txt`, 64 tokens each): greedy tokens are the same
    /// bits on every machine, so this is the head's alone, and what a load
    /// weighs this machine's timed cycle pieces with to pick `--mtp-depth
    /// auto`'s greedy depth.
    pub fast_greedy_accepted_per_cycle: &'static [f64],
    /// The file itself (what `install` writes).
    bytes: &'static [u8],
}

/// The head of the default model (`tools/mtp_head/README.md` has the
/// command that made it and its training data).
pub const DEFAULT_MTP_HEAD: KnownHead = KnownHead {
    model: DEFAULT_MODEL,
    file_name: "SmolLM2-135M-Instruct.mtp.gguf",
    sha256: "9a700f42347867abf8874f7496c8650e1ed17e60f2795e1e0edbb85d46d820ae",
    size_bytes: 9_524_192,
    // the first head (tools/mtp_head/runs/2026-11-30), the second
    // (runs/2026-12-03) and the third (runs/2026-12-03b), which this one
    // continued training
    superseded: &[
        "ad9110d6c5df8f2fcfbfab55082adc87015cacad10aca716f73a62e45f3f20c0",
        "5b3417abff9c17ca0ae7c6ca69609c4b283d5a89986d65e6deb6a3eb00bfcb84",
        "4379a7341eb73e997bd33d9a97e642f8144a38220e17ee5fbb0c6c163ab9af98",
    ],
    // bench/mtp-2026-12-06-epyc.log (the same on 2026-12-06's Xeon)
    fast_greedy_accepted_per_cycle: &[0.674, 1.179, 1.495],
    bytes: include_bytes!("../assets/SmolLM2-135M-Instruct.mtp.gguf"),
};

#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    #[error(
        "{path}: the MTP head file is {actual} bytes, expected {expected} (truncated or \
         replaced); delete it and it is written again on the next start (or run `ds4server pull`)"
    )]
    Size {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error(
        "{path}: the MTP head file's sha256 is {actual}, expected {expected} (corrupt or \
         replaced); delete it and it is written again on the next start (or run `ds4server pull`)"
    )]
    Checksum {
        path: PathBuf,
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

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> HeadError + '_ {
    move |source| HeadError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl KnownHead {
    /// Where the head of the model file `model` lives: beside it.
    pub fn path_next_to(&self, model: &Path) -> PathBuf {
        model.with_file_name(self.file_name)
    }

    /// Whether `model` is this head's model: same file name and size (a
    /// cheap test; the head is still checked against its own checksum).
    pub fn belongs_to(&self, model: &Path) -> bool {
        model.file_name().and_then(|n| n.to_str()) == Some(self.model.file_name)
            && std::fs::metadata(model).is_ok_and(|m| m.len() == self.model.size_bytes)
    }

    /// Check the file at `path`: size first (cheap), then SHA-256.
    pub fn verify(&self, path: &Path) -> Result<(), HeadError> {
        let size = std::fs::metadata(path).map_err(io_err(path))?.len();
        if size != self.size_bytes {
            return Err(HeadError::Size {
                path: path.to_path_buf(),
                expected: self.size_bytes,
                actual: size,
            });
        }
        let actual = sha256_file(path).map_err(io_err(path))?;
        if actual != self.sha256 {
            return Err(HeadError::Checksum {
                path: path.to_path_buf(),
                expected: self.sha256.to_string(),
                actual,
            });
        }
        Ok(())
    }

    /// Write the embedded head to `path` (a temporary file beside it, then
    /// a rename, so a reader never sees a partial file).
    pub fn install(&self, path: &Path) -> Result<(), HeadError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io_err(dir))?;
        tmp.write_all(self.bytes).map_err(io_err(path))?;
        tmp.as_file().sync_all().map_err(io_err(path))?;
        tmp.persist(path).map_err(|e| HeadError::Io {
            path: path.to_path_buf(),
            source: e.error,
        })?;
        Ok(())
    }

    /// The checked head file for `model`: written beside it first if
    /// missing or if it is a head this one supersedes, then verified. Any
    /// other wrong file is refused (never overwritten: it may be someone's
    /// experiment).
    pub fn ensure_next_to(&self, model: &Path) -> Result<PathBuf, HeadError> {
        let path = self.path_next_to(model);
        if !path.exists() {
            self.install(&path)?;
        }
        // one hash per load; a second only after replacing a superseded head
        match self.verify(&path) {
            Err(HeadError::Checksum { actual, .. })
                if self.superseded.contains(&actual.as_str()) =>
            {
                tracing::info!(
                    "{}: an earlier release's MTP head, replaced by this release's",
                    path.display()
                );
                self.install(&path)?;
                self.verify(&path)?;
            }
            checked => checked?,
        }
        Ok(path)
    }
}

/// The known head for the model file `model`, checked: `None` when the
/// model has no known head, `Some(Err)` when its head file is wrong.
pub fn mtp_head_for(model: &Path) -> Option<Result<PathBuf, HeadError>> {
    DEFAULT_MTP_HEAD
        .belongs_to(model)
        .then(|| DEFAULT_MTP_HEAD.ensure_next_to(model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hex;
    use sha2::{Digest, Sha256};

    #[test]
    fn embedded_head_matches_its_pins() {
        let h = DEFAULT_MTP_HEAD;
        assert_eq!(h.bytes.len() as u64, h.size_bytes);
        assert_eq!(hex(&Sha256::digest(h.bytes)), h.sha256);
    }

    #[test]
    fn install_then_verify_and_refuse_damaged_files() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join(DEFAULT_MODEL.file_name);
        let path = DEFAULT_MTP_HEAD.path_next_to(&model);
        assert_eq!(path.parent(), Some(dir.path()));
        // missing: written, then verified
        assert_eq!(DEFAULT_MTP_HEAD.ensure_next_to(&model).unwrap(), path);
        DEFAULT_MTP_HEAD.verify(&path).unwrap();

        // one flipped byte: refused by checksum, left as it is
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[4096] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = DEFAULT_MTP_HEAD.ensure_next_to(&model).unwrap_err();
        assert!(matches!(err, HeadError::Checksum { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("sha256") && text.contains("delete it"),
            "{text}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes);

        // truncated: refused by size
        std::fs::write(&path, &bytes[..1000]).unwrap();
        let err = DEFAULT_MTP_HEAD.verify(&path).unwrap_err();
        assert!(matches!(err, HeadError::Size { actual: 1000, .. }), "{err}");
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[test]
    fn a_superseded_head_is_replaced_and_any_other_file_is_kept() {
        let head = KnownHead {
            model: DEFAULT_MODEL,
            file_name: "test.mtp.gguf",
            // sha256 of b"new" and of b"old"
            sha256: "11507a0e2f5e69d5dfa40a62a1bd7b6ee57e6bcd85c67c9b8431b36fff21c437",
            size_bytes: 3,
            superseded: &["cba06b5736faf67e54b07b561eae94395e774c517a7d910a54369e1263ccfbd4"],
            fast_greedy_accepted_per_cycle: &[],
            bytes: b"new",
        };
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join(DEFAULT_MODEL.file_name);
        let path = head.path_next_to(&model);
        std::fs::write(&path, b"old").unwrap();
        assert_eq!(head.ensure_next_to(&model).unwrap(), path);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        // a file of the right size that is no shipped head stays refused
        std::fs::write(&path, b"odd").unwrap();
        let err = head.ensure_next_to(&model).unwrap_err();
        assert!(matches!(err, HeadError::Checksum { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"odd");
    }

    #[test]
    fn only_the_default_model_has_a_head() {
        let dir = tempfile::tempdir().unwrap();
        let other = dir.path().join("other.gguf");
        std::fs::write(&other, b"x").unwrap();
        assert!(mtp_head_for(&other).is_none());
        // the right name but the wrong size is not the default model
        let named = dir.path().join(DEFAULT_MODEL.file_name);
        std::fs::write(&named, b"x").unwrap();
        assert!(mtp_head_for(&named).is_none());
        assert!(!DEFAULT_MTP_HEAD.path_next_to(&named).exists());
    }
}
