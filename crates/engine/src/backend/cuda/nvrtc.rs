//! The kernel set: CUDA C sources embedded in the binary, compiled at run
//! time by NVRTC to a cubin for the device's architecture, cached on disk.
//!
//! Compiling takes seconds (all kernels are one program, so one compile per
//! fresh machine); the cache key is a hash of the sources, the options, the
//! NVRTC version and the architecture, so a changed kernel never loads a
//! stale cubin. `DS4_CUDA_KERNELS=<dir>` replaces embedded sources by the
//! files of the same name in `<dir>` (or loads `<dir>/kernels.cubin` as is),
//! for iterating on a GPU machine without rebuilding the binary.
//!
//! The options are part of the arithmetic: `--fmad=false` keeps NVRTC from
//! contracting `a * b + c` into an FMA, so every rounding the sources spell
//! is the rounding that happens (the kernels use `fmaf` where the CPU
//! reference uses `mul_add`).

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};

use crate::error::{EngineError, Result};

/// The sources in compile order (the header first).
pub(super) const SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("kernels/common.cuh")),
    ("memory.cu", include_str!("kernels/memory.cu")),
    ("elementwise.cu", include_str!("kernels/elementwise.cu")),
    ("matmul.cu", include_str!("kernels/matmul.cu")),
    ("stored.cu", include_str!("kernels/stored.cu")),
    ("stored_rows.cu", include_str!("kernels/stored_rows.cu")),
    ("f16w.cu", include_str!("kernels/f16w.cu")),
    ("kq8.cu", include_str!("kernels/kq8.cu")),
    ("kq8_grouped.cu", include_str!("kernels/kq8_grouped.cu")),
    ("kq8_mma.cu", include_str!("kernels/kq8_mma.cu")),
    ("fast8.cu", include_str!("kernels/fast8.cu")),
    ("norms.cu", include_str!("kernels/norms.cu")),
    ("recurrent.cu", include_str!("kernels/recurrent.cu")),
    ("attention.cu", include_str!("kernels/attention.cu")),
    ("compression.cu", include_str!("kernels/compression.cu")),
    ("routing.cu", include_str!("kernels/routing.cu")),
    ("hyper.cu", include_str!("kernels/hyper.cu")),
    ("hc_fn.cu", include_str!("kernels/hc_fn.cu")),
    ("synthetic.cu", include_str!("kernels/synthetic.cu")),
];

/// The environment variable naming a directory of kernel overrides.
pub const KERNELS_ENV: &str = "DS4_CUDA_KERNELS";
/// The environment variable naming the cubin cache directory.
pub const CACHE_ENV: &str = "DS4_CUDA_CACHE";

/// A compiled kernel set.
pub(super) struct Cubin {
    pub image: Vec<u8>,
    /// Hash of what produced it (sources, options, NVRTC, arch): part of
    /// the backend id, so checkpoints name the kernel set that made them.
    pub hash: u64,
    /// Where it came from, for the log line.
    pub origin: String,
    pub compile_seconds: f64,
}

fn dev_err(what: &str, e: impl std::fmt::Debug) -> EngineError {
    EngineError::Device(format!("{what}: {e:?}"))
}

/// FNV-1a, 64-bit: a stable hash (std's hasher is not stable across Rust
/// releases, and the cache outlives a build).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the parts, so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The program text: the embedded sources, each replaced by a file of the
/// same name in the override directory when there is one.
fn program(override_dir: Option<&PathBuf>) -> Result<String> {
    let mut text = String::new();
    for (name, embedded) in SOURCES {
        let replaced = match override_dir {
            Some(dir) if dir.join(name).is_file() => Some(
                std::fs::read_to_string(dir.join(name)).map_err(|e| EngineError::File {
                    path: dir.join(name),
                    message: format!("cannot read a kernel override: {e}"),
                })?,
            ),
            _ => None,
        };
        text.push_str(&format!("// ---- {name}\n"));
        text.push_str(replaced.as_deref().unwrap_or(embedded));
        text.push('\n');
    }
    Ok(text)
}

fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--fmad=false".into()]
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; the library was found by the caller.
    let rc = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(dev_err("nvrtcVersion", rc));
    }
    Ok((major, minor))
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(CACHE_ENV) {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ds4").join("cuda"))
}

/// Whether NVRTC can be loaded (it is looked up by cudarc at first use, and
/// a missing library would abort the process there).
pub(super) fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// The kernel set for `arch` (`sm_90a`, …): from the override directory's
/// cubin, the disk cache, or a fresh NVRTC compile (then cached).
pub(super) fn kernels(arch: &str) -> Result<Cubin> {
    let override_dir = std::env::var_os(KERNELS_ENV).map(PathBuf::from);
    if let Some(dir) = &override_dir {
        let cubin = dir.join("kernels.cubin");
        if cubin.is_file() {
            let image = std::fs::read(&cubin).map_err(|e| EngineError::File {
                path: cubin.clone(),
                message: format!("cannot read: {e}"),
            })?;
            return Ok(Cubin {
                hash: fnv1a(&[&image]),
                image,
                origin: cubin.display().to_string(),
                compile_seconds: 0.0,
            });
        }
    }
    if !nvrtc_present() {
        return Err(EngineError::Device(
            "NVRTC (libnvrtc.so.13) cannot be loaded: add the CUDA 13 libraries to \
             LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let text = program(override_dir.as_ref())?;
    let opts = options(arch);
    let (major, minor) = nvrtc_version()?;
    let version = format!("nvrtc {major}.{minor}");
    let hash = fnv1a(&[
        text.as_bytes(),
        opts.join(" ").as_bytes(),
        version.as_bytes(),
        arch.as_bytes(),
    ]);
    let cached = cache_dir().map(|d| d.join(format!("kernels-{arch}-{hash:016x}.cubin")));
    if let Some(path) = &cached
        && let Ok(image) = std::fs::read(path)
    {
        return Ok(Cubin {
            image,
            hash,
            origin: path.display().to_string(),
            compile_seconds: 0.0,
        });
    }
    let start = std::time::Instant::now();
    let image = compile(&text, &opts)?;
    let compile_seconds = start.elapsed().as_secs_f64();
    if let Some(path) = &cached {
        store(path, &image);
    }
    Ok(Cubin {
        image,
        hash,
        origin: format!("NVRTC ({version}, {arch})"),
        compile_seconds,
    })
}

/// Write the cache file atomically (a partial file must never load); a
/// failure only costs the next run a compile.
fn store(path: &std::path::Path, image: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok()
        && std::fs::write(&tmp, image).is_ok()
        && std::fs::rename(&tmp, path).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
        tracing::warn!("could not cache the CUDA kernels at {}", path.display());
    }
}

/// NVRTC: source → cubin.
pub(super) fn compile(text: &str, opts: &[String]) -> Result<Vec<u8>> {
    let src = CString::new(text)
        .map_err(|_| EngineError::Device("a kernel source holds a NUL byte".into()))?;
    let name = CString::new("ds4_kernels.cu").expect("no NUL in a literal");
    let prog = nvrtc::create_program(&src, Some(&name)).map_err(|e| dev_err("nvrtc", e))?;
    // SAFETY: `prog` is a live program until destroyed below.
    let out = unsafe { compile_program(prog, opts) };
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    out
}

/// # Safety
/// `prog` is a live NVRTC program.
unsafe fn compile_program(prog: nvrtc_sys::nvrtcProgram, opts: &[String]) -> Result<Vec<u8>> {
    // SAFETY: forwarded from the caller.
    if let Err(e) = unsafe { nvrtc::compile_program(prog, opts) } {
        // SAFETY: as above; the log is a NUL-terminated string.
        let log = unsafe { nvrtc::get_program_log(prog) }
            .map(|raw| {
                let bytes: Vec<u8> = raw
                    .iter()
                    .map(|&c| c as u8)
                    .take_while(|&c| c != 0)
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .unwrap_or_default();
        return Err(EngineError::Device(format!(
            "NVRTC failed to compile the kernels ({e:?}):\n{log}"
        )));
    }
    let mut size = 0usize;
    // SAFETY: out-parameter of a compiled program.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(dev_err("nvrtcGetCUBINSize", rc));
    }
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds exactly the reported size.
    let rc = unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast()) };
    if rc != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(dev_err("nvrtcGetCUBIN", rc));
    }
    Ok(image)
}

/// Compile the embedded kernels for `arch` without a device (a CPU-side
/// check that they build, where NVRTC is installed).
pub fn compile_embedded(arch: &str) -> Result<usize> {
    if !nvrtc_present() {
        return Err(EngineError::Device("NVRTC cannot be loaded".into()));
    }
    Ok(compile(&program(None)?, &options(arch))?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_separates_parts_and_is_stable() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        // Pinned: a changed hash function would silently orphan caches and
        // change every CUDA checkpoint tag.
        assert_eq!(fnv1a(&[b"ds4"]), 0xe91f_0566_d80d_e9f9);
    }

    /// Every embedded kernel compiles for the H200 (no GPU needed: NVRTC
    /// from PyPI's `nvidia-cuda-nvrtc==13.0.88`, its `nvidia/cu13/lib` on
    /// `LD_LIBRARY_PATH`; docs/GPU.md).
    #[test]
    #[ignore = "needs NVRTC 13 (libnvrtc.so.13) on the library path"]
    fn embedded_kernels_compile_for_sm_90a() {
        let bytes = compile_embedded("sm_90a").unwrap();
        assert!(bytes > 100_000, "a cubin of {bytes} bytes");
    }

    #[test]
    fn program_starts_with_the_header() {
        let text = program(None).unwrap();
        assert!(text.starts_with("// ---- common.cuh"));
        // Each source once, under its own header line (sources have
        // section comments of the same form, so count whole headers).
        for (name, _) in SOURCES {
            assert_eq!(
                text.matches(&format!("// ---- {name}\n")).count(),
                1,
                "{name}"
            );
        }
    }
}
