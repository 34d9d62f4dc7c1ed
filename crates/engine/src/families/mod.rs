//! Model families. Each lives in its own module and touches shared code only
//! through the [`crate::Model`] contract, the op inventory
//! ([`crate::backend::Backend`]) and the shared layers. Every family is
//! registered once, in [`FAMILIES`]: how a file is recognised as that
//! family (Hugging Face `model_type`, GGUF `general.architecture`), its
//! descriptor and its loader. A new family joins by adding its module, one
//! [`LoadedModel`] variant, one [`with_model!`] arm and one registry entry.

pub(crate) mod batch_split;
pub mod deepseek_v4;
pub(crate) mod draft_batch;
pub mod glm5_next;
pub mod llama;
#[cfg(feature = "cuda")]
mod on_cuda;
pub mod qwen4_exp;
pub mod shards;

use std::path::Path;

use crate::error::{EngineError, Result};
use crate::load::ModelFormat;

pub use crate::model::FamilyDescriptor;

/// A registered family: its descriptor and how to load it on the CPU.
pub struct Family {
    pub descriptor: &'static FamilyDescriptor,
    load: fn(&Path, ModelFormat) -> Result<LoadedModel>,
}

/// Every family the engine serves.
pub static FAMILIES: &[Family] = &[
    Family {
        descriptor: &llama::DESCRIPTOR,
        load: |path, format| {
            Ok(LoadedModel::Llama(match format {
                ModelFormat::Gguf => llama::LlamaModel::from_gguf(path)?,
                ModelFormat::HfDir => llama::LlamaModel::from_hf_dir(path)?,
            }))
        },
    },
    Family {
        descriptor: &qwen4_exp::DESCRIPTOR,
        load: |path, _| {
            Ok(LoadedModel::Qwen4Exp(
                qwen4_exp::Qwen4ExpModel::from_hf_dir(path)?,
            ))
        },
    },
    Family {
        descriptor: &deepseek_v4::DESCRIPTOR,
        load: |path, format| {
            Ok(LoadedModel::DeepseekV4(Box::new(match format {
                ModelFormat::Gguf => deepseek_v4::DeepseekV4Model::from_gguf(path)?,
                ModelFormat::HfDir => deepseek_v4::DeepseekV4Model::from_hf_dir(path)?,
            })))
        },
    },
    Family {
        descriptor: &glm5_next::DESCRIPTOR,
        load: |path, _| {
            Ok(LoadedModel::Glm5Next(Box::new(
                glm5_next::Glm5NextModel::from_hf_dir(path)?,
            )))
        },
    },
];

/// The family of the model at `path` (a `.gguf` file or a Hugging Face
/// directory), from its metadata.
pub fn detect(path: &Path) -> Result<(&'static Family, ModelFormat)> {
    let format = crate::load::detect(path)?;
    let (key, value, file) = match format {
        ModelFormat::HfDir => {
            let config = path.join(crate::load::safetensors::CONFIG_FILE);
            let text = std::fs::read_to_string(&config).map_err(|e| EngineError::File {
                path: config.clone(),
                message: format!("cannot read: {e}"),
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| EngineError::File {
                    path: config.clone(),
                    message: format!("invalid JSON: {e}"),
                })?;
            let t = json
                .get("model_type")
                .and_then(|v| v.as_str())
                .ok_or_else(|| EngineError::Config {
                    path: config.clone(),
                    field: "model_type".into(),
                    message: "missing: it names the model family".into(),
                })?;
            ("model_type", t.to_string(), config)
        }
        ModelFormat::Gguf => {
            let g = crate::load::gguf::GgufFile::open(path)?;
            // A GGUF in Hugging Face names is recognised as its directory
            // would be, by the embedded config's `model_type`.
            if let Some(config) = crate::load::checkpoint::embedded_config(&g)? {
                let t = config
                    .get("model_type")
                    .and_then(|v| v.as_str())
                    .ok_or_else(|| EngineError::Config {
                        path: path.to_path_buf(),
                        field: format!("{}.model_type", crate::load::checkpoint::HF_CONFIG_KEY),
                        message: "missing: it names the model family".into(),
                    })?;
                ("model_type", t.to_string(), path.to_path_buf())
            } else {
                let arch = g.string("general.architecture")?.to_string();
                ("general.architecture", arch, path.to_path_buf())
            }
        }
    };
    let by_model_type = key == "model_type";
    let found = FAMILIES.iter().find(|f| {
        if by_model_type {
            f.descriptor.model_types.contains(&value.as_str())
        } else {
            f.descriptor.gguf_architectures.contains(&value.as_str())
        }
    });
    found.map(|f| (f, format)).ok_or_else(|| {
        let known: Vec<&str> = FAMILIES
            .iter()
            .flat_map(|f| {
                if by_model_type {
                    f.descriptor.model_types.iter()
                } else {
                    f.descriptor.gguf_architectures.iter()
                }
            })
            .copied()
            .collect();
        EngineError::Config {
            path: file,
            field: key.into(),
            message: format!(
                "`{value}` is not a supported family (supported: {})",
                known.join(", ")
            ),
        }
    })
}

/// Where a model's weights live and its forwards run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// CUDA device `n` (the `cuda` feature).
    Cuda(usize),
    /// An expert-parallel group of CUDA devices, the home first
    /// (`--devices`, [`crate::backend::split`]): routed experts split
    /// evenly, everything else on the home.
    CudaGroup(shards::Shards),
}

/// A loaded model of any family. Generic code receives the concrete model
/// through [`with_model!`], so decode loops are monomorphised per family
/// (and per backend: the `…Cuda` variants run on
/// [`crate::backend::CudaOps`]).
pub enum LoadedModel {
    Llama(llama::LlamaModel),
    Qwen4Exp(qwen4_exp::Qwen4ExpModel),
    DeepseekV4(Box<deepseek_v4::DeepseekV4Model>),
    Glm5Next(Box<glm5_next::Glm5NextModel>),
    #[cfg(feature = "cuda")]
    LlamaCuda(Box<llama::LlamaModel<crate::backend::CudaOps>>),
    #[cfg(feature = "cuda")]
    Qwen4ExpCuda(Box<qwen4_exp::Qwen4ExpModel<crate::backend::CudaOps>>),
    #[cfg(feature = "cuda")]
    DeepseekV4Cuda(Box<deepseek_v4::DeepseekV4Model<crate::backend::CudaOps>>),
    #[cfg(feature = "cuda")]
    Glm5NextCuda(Box<glm5_next::Glm5NextModel<crate::backend::CudaOps>>),
    #[cfg(feature = "cuda")]
    Qwen4ExpCudaGroup(Box<qwen4_exp::Qwen4ExpModel<CudaGroup>>),
    #[cfg(feature = "cuda")]
    DeepseekV4CudaGroup(Box<deepseek_v4::DeepseekV4Model<CudaGroup>>),
    #[cfg(feature = "cuda")]
    Glm5NextCudaGroup(Box<glm5_next::Glm5NextModel<CudaGroup>>),
}

/// An expert-parallel group of CUDA devices ([`Device::CudaGroup`]).
#[cfg(feature = "cuda")]
pub type CudaGroup = crate::backend::split::Split<crate::backend::CudaOps>;

/// The draft depths `--mtp-depth auto` runs, by whether a request samples:
/// a sampled cycle also samples its draft and verify rows, so a deeper
/// chain pays more per cycle than at temperature 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoDepth {
    /// Temperature 0.
    pub greedy: usize,
    /// Temperature above 0.
    pub sampled: usize,
}

/// How much faster (relative, by the pieces) a deeper greedy chain must be
/// to be chosen over a shallower one ([`LoadedModel::measure_greedy_mtp_depth`]).
const GREEDY_DEPTH_MARGIN: f64 = 0.01;

impl AutoDepth {
    /// The depth for a request at `temperature`.
    pub fn for_temperature(self, temperature: f64) -> usize {
        if temperature > 0.0 {
            self.sampled
        } else {
            self.greedy
        }
    }
}

/// The error of a CUDA device asked of a build without the backend.
#[cfg(not(feature = "cuda"))]
fn no_cuda() -> EngineError {
    EngineError::Unsupported("this build has no CUDA backend (build with `--features cuda`)".into())
}

impl LoadedModel {
    /// Load the model at `path` (a `.gguf` file or a Hugging Face directory)
    /// on the CPU, choosing the family from its metadata ([`detect`]).
    pub fn load(path: &Path) -> Result<Self> {
        let (family, format) = detect(path)?;
        (family.load)(path, format)
    }

    /// Load the model at `path` onto `device`.
    pub fn load_on(path: &Path, device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Self::load(path),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => {
                let (family, format) = detect(path)?;
                on_cuda::load(family.descriptor, path, format, n)
            }
            #[cfg(feature = "cuda")]
            Device::CudaGroup(shards) => {
                let (family, format) = detect(path)?;
                on_cuda::load_group(family.descriptor, path, format, shards)
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) | Device::CudaGroup(_) => Err(EngineError::Unsupported(
                "this build has no CUDA backend (build with `--features cuda`)".into(),
            )),
        }
    }

    /// `family` at a synthetic configuration ([`crate::load::synthetic`]:
    /// random weights from `seed`, with the MTP head when `mtp`) on
    /// `device`, bound by the family's own loader; also the bytes of every
    /// weight the source handed out, by name.
    pub fn synthetic(
        family: &str,
        config: &serde_json::Value,
        seed: u64,
        mtp: bool,
        device: Device,
    ) -> Result<(Self, crate::load::synthetic::Ledger)> {
        if family != qwen4_exp::DESCRIPTOR.name {
            return Err(EngineError::Unsupported(format!(
                "no synthetic weights for family `{family}` (qwen4_exp)"
            )));
        }
        let path = std::path::PathBuf::from(format!("synthetic:{family}"));
        let parsed = qwen4_exp::Qwen4ExpConfig::from_hf(&path, config)?;
        let mut src = crate::load::synthetic::SyntheticSource::new(seed, mtp, family);
        let model = match device {
            Device::Cpu => LoadedModel::Qwen4Exp(qwen4_exp::Qwen4ExpModel::load_from(
                &mut src,
                &path,
                parsed,
                crate::backend::CpuOps,
            )?),
            #[cfg(feature = "cuda")]
            Device::Cuda(n) => {
                LoadedModel::Qwen4ExpCuda(Box::new(qwen4_exp::Qwen4ExpModel::load_from(
                    &mut src,
                    &path,
                    parsed,
                    crate::backend::CudaOps::new(n)?,
                )?))
            }
            #[cfg(feature = "cuda")]
            Device::CudaGroup(shards) => {
                LoadedModel::Qwen4ExpCudaGroup(Box::new(qwen4_exp::Qwen4ExpModel::load_from(
                    &mut src,
                    &path,
                    parsed,
                    on_cuda::group(shards)?,
                )?))
            }
            #[cfg(not(feature = "cuda"))]
            Device::Cuda(_) | Device::CudaGroup(_) => {
                return Err(EngineError::Unsupported(
                    "this build has no CUDA backend (build with `--features cuda`)".into(),
                ));
            }
        };
        Ok((model, src.ledger().clone()))
    }

    /// `family` (deepseek_v4 or glm5_next) with random weights in a
    /// checkpoint's real stored types ([`crate::load::synthetic::stored`]:
    /// antirez/ds4's q2 / q4 recipe), without the MTP head, on `device`,
    /// bound by the family's own loader; also every tensor's type and
    /// bytes, by name.
    pub fn synthetic_stored(
        family: &str,
        config: &serde_json::Value,
        seed: u64,
        recipe: crate::load::synthetic::stored::Ds4Recipe,
        device: Device,
    ) -> Result<(Self, crate::load::synthetic::stored::StoredLedger)> {
        use crate::load::synthetic::stored::{StoredFamily, StoredSource};
        let kind = StoredFamily::of(family).ok_or_else(|| {
            EngineError::Unsupported(format!(
                "{}: stored-type synthetic weights are for deepseek_v4 and glm5_next, not `{family}`",
                recipe.name()
            ))
        })?;
        let path = std::path::PathBuf::from(format!("synthetic:{family}:{}", recipe.name()));
        // `$load` with `$ops` the backend of `device`, as the family's
        // CPU / CUDA / CUDA-group variant.
        macro_rules! on_device {
            ($cpu:ident, $cuda:ident, $group:ident, |$ops:ident| $load:expr) => {
                match device {
                    Device::Cpu => {
                        let $ops = crate::backend::CpuOps;
                        LoadedModel::$cpu(Box::new($load))
                    }
                    #[cfg(feature = "cuda")]
                    Device::Cuda(n) => {
                        let $ops = crate::backend::CudaOps::new(n)?;
                        LoadedModel::$cuda(Box::new($load))
                    }
                    #[cfg(feature = "cuda")]
                    Device::CudaGroup(shards) => {
                        let $ops = on_cuda::group(shards)?;
                        LoadedModel::$group(Box::new($load))
                    }
                    #[cfg(not(feature = "cuda"))]
                    Device::Cuda(_) | Device::CudaGroup(_) => return Err(no_cuda()),
                }
            };
        }
        let (model, src) = match kind {
            StoredFamily::DeepseekV4 => {
                let cfg = deepseek_v4::DeepseekV4Config::from_hf(&path, config)?;
                let mut src =
                    StoredSource::for_family(kind, seed, recipe, cfg.n_routed_experts, family);
                let model = on_device!(DeepseekV4, DeepseekV4Cuda, DeepseekV4CudaGroup, |ops| {
                    deepseek_v4::DeepseekV4Model::load_synthetic(&mut src, cfg, ops)?
                });
                (model, src)
            }
            StoredFamily::Glm5Next => {
                let cfg = glm5_next::Glm5NextConfig::from_hf(&path, config)?;
                let mut src =
                    StoredSource::for_family(kind, seed, recipe, cfg.n_routed_experts, family);
                let model = on_device!(Glm5Next, Glm5NextCuda, Glm5NextCudaGroup, |ops| {
                    glm5_next::Glm5NextModel::load_synthetic(&mut src, cfg, ops)?
                });
                (model, src)
            }
        };
        Ok((model, src.into_ledger()))
    }

    pub fn descriptor(&self) -> &'static FamilyDescriptor {
        match self {
            LoadedModel::Llama(_) => &llama::DESCRIPTOR,
            LoadedModel::Qwen4Exp(_) => &qwen4_exp::DESCRIPTOR,
            LoadedModel::DeepseekV4(_) => &deepseek_v4::DESCRIPTOR,
            LoadedModel::Glm5Next(_) => &glm5_next::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::LlamaCuda(_) => &llama::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::Qwen4ExpCuda(_) => &qwen4_exp::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::DeepseekV4Cuda(_) => &deepseek_v4::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::Glm5NextCuda(_) => &glm5_next::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::Qwen4ExpCudaGroup(_) => &qwen4_exp::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::DeepseekV4CudaGroup(_) => &deepseek_v4::DESCRIPTOR,
            #[cfg(feature = "cuda")]
            LoadedModel::Glm5NextCudaGroup(_) => &glm5_next::DESCRIPTOR,
        }
    }

    /// The backend the model runs on (`cpu-avx512`, `cuda-sm_90a`, …).
    pub fn backend(&self) -> crate::backend::BackendId {
        crate::with_model!(self, m => crate::model::Model::backend(m))
    }

    /// The CUDA ops a model on a GPU runs on (its launch counts and host
    /// profile, for the benches); `None` on the CPU.
    #[cfg(feature = "cuda")]
    pub fn cuda_ops(&self) -> Option<&crate::backend::CudaOps> {
        match self {
            LoadedModel::LlamaCuda(m) => Some(m.ops()),
            LoadedModel::Qwen4ExpCuda(m) => Some(m.ops()),
            LoadedModel::DeepseekV4Cuda(m) => Some(m.ops()),
            LoadedModel::Glm5NextCuda(m) => Some(m.ops()),
            _ => None,
        }
    }

    pub fn family_name(&self) -> &'static str {
        self.descriptor().name
    }

    /// Choose the KV cache element type of the states the model makes
    /// (`--kv-cache`). f32 is every family's; f16 is the llama family's on
    /// the CPU (elsewhere refused, naming what to use instead). Changes the
    /// model's backend tag, so checkpoints of one type are refused under
    /// the other.
    pub fn set_kv_type(&mut self, kv_type: crate::state::kv_cache::KvType) -> Result<()> {
        use crate::state::kv_cache::KvType;
        match self {
            LoadedModel::Llama(m) => m.set_kv_type(kv_type),
            #[cfg(feature = "cuda")]
            LoadedModel::LlamaCuda(m) => m.set_kv_type(kv_type),
            _ if kv_type == KvType::F32 => Ok(()),
            _ => Err(EngineError::Unsupported(format!(
                "{}: an f16 KV cache is for the llama family (use `--kv-cache f32`)",
                self.family_name()
            ))),
        }
    }

    /// Whether [`Self::set_kv_type`] takes f16 (the llama family on the
    /// CPU; CUDA has no f16 rows).
    pub fn holds_f16_kv(&self) -> bool {
        matches!(self, LoadedModel::Llama(_))
    }

    /// The KV cache element type of the states the model makes (f32 for
    /// families without a choice).
    pub fn kv_type(&self) -> crate::state::kv_cache::KvType {
        match self {
            LoadedModel::Llama(m) => m.kv_type(),
            #[cfg(feature = "cuda")]
            LoadedModel::LlamaCuda(m) => m.kv_type(),
            _ => crate::state::kv_cache::KvType::F32,
        }
    }

    /// Attach the MTP head in the file `path`: the llama family's (the head
    /// `tools/mtp_head` trains) or deepseek_v4's (ds4's MTP GGUF,
    /// `deepseek_v4::gguf`). A head that does not fit is refused and the
    /// model stays as it was.
    pub fn attach_mtp_head(&mut self, path: &Path) -> Result<()> {
        match self {
            LoadedModel::Llama(m) => m.attach_mtp_head(path),
            #[cfg(feature = "cuda")]
            LoadedModel::LlamaCuda(m) => m.attach_mtp_head(path),
            LoadedModel::DeepseekV4(m) => m.attach_mtp_gguf(path),
            #[cfg(feature = "cuda")]
            LoadedModel::DeepseekV4Cuda(m) => m.attach_mtp_gguf(path),
            #[cfg(feature = "cuda")]
            LoadedModel::DeepseekV4CudaGroup(m) => m.attach_mtp_gguf(path),
            _ => Err(EngineError::Unsupported(format!(
                "{}: MTP head files are for the llama and deepseek_v4 families",
                self.family_name()
            ))),
        }
    }

    /// The depths `--mtp-depth auto` runs: the llama head's measured best
    /// for the kernel set it runs ([`llama::MTP_AUTO_DEPTH`] /
    /// [`llama::MTP_AUTO_DEPTH_SAMPLED`] on the reference set and CUDA,
    /// [`llama::MTP_AUTO_DEPTH_FAST`] / [`llama::MTP_AUTO_DEPTH_SAMPLED_FAST`]
    /// on the CPU's fast set, whose greedy depth
    /// [`Self::measure_greedy_mtp_depth`] replaces with this machine's), the
    /// family default for other heads, 0 (AR) without a head.
    pub fn mtp_auto_depth(&self) -> AutoDepth {
        let llama = if self.runs_cpu_fast_set() {
            AutoDepth {
                greedy: llama::MTP_AUTO_DEPTH_FAST,
                sampled: llama::MTP_AUTO_DEPTH_SAMPLED_FAST,
            }
        } else {
            AutoDepth {
                greedy: llama::MTP_AUTO_DEPTH,
                sampled: llama::MTP_AUTO_DEPTH_SAMPLED,
            }
        };
        match self {
            LoadedModel::Llama(m) if m.mtp_head().is_some() => AutoDepth {
                greedy: m.measured_greedy_depth().unwrap_or(llama.greedy),
                ..llama
            },
            #[cfg(feature = "cuda")]
            LoadedModel::LlamaCuda(m) if m.mtp_head().is_some() => llama,
            _ => {
                let d = crate::with_model!(self, m => crate::model::Model::mtp_contract(m))
                    .map_or(0, |c| c.default_depth);
                AutoDepth {
                    greedy: d,
                    sampled: d,
                }
            }
        }
    }

    /// The depths a run or request that asks for none gets, where they
    /// differ from the family's contract: the llama head on the CPU's fast
    /// set drafts by default (`auto`), because there it was measured faster
    /// than AR at temperature 0 and 0.7 on prompts it was neither trained
    /// nor tuned on (`bench/README.md`); elsewhere `None` (the family's
    /// default, AR for the llama head under the reference set, whose verify
    /// rows cost a quarter of a step each).
    pub fn mtp_default_depth(&self) -> Option<AutoDepth> {
        match self {
            LoadedModel::Llama(m) if m.mtp_head().is_some() && self.runs_cpu_fast_set() => {
                Some(self.mtp_auto_depth())
            }
            _ => None,
        }
    }

    /// Time one MTP cycle's pieces on this machine and keep the greedy
    /// depth they make fastest for a head that accepts
    /// `accepted_per_cycle[d - 1]` drafts per cycle at depth d (greedy, so
    /// a property of the head and the trunk's bits, not of the machine):
    /// the llama family on the CPU's fast set with a head attached, else
    /// `None` and nothing changes. Greedy MTP emits the AR tokens at every
    /// depth, so this moves speed only ([`crate::decode::mtp_pieces`]).
    /// Nine rounds of timed pieces on a 128-token context, ~0.3 s on 2 cores.
    pub fn measure_greedy_mtp_depth(
        &mut self,
        accepted_per_cycle: &[f64],
    ) -> Result<Option<(usize, crate::decode::mtp_pieces::PieceCosts)>> {
        if !self.runs_cpu_fast_set() {
            return Ok(None);
        }
        let LoadedModel::Llama(m) = self else {
            return Ok(None);
        };
        if m.mtp_head().is_none() || accepted_per_cycle.is_empty() {
            return Ok(None);
        }
        // Any tokens time the same; ids spread over the vocabulary.
        let vocab = crate::model::Model::vocab_size(&*m) as u64;
        let prompt: Vec<u32> = (0..128u64)
            .map(|i| ((i * 7919 + 17) % vocab) as u32)
            .collect();
        let costs =
            crate::decode::mtp_pieces::measure_pieces(&*m, &prompt, accepted_per_cycle.len(), 9)?;
        let depth = costs.best_depth(accepted_per_cycle, GREEDY_DEPTH_MARGIN);
        m.set_measured_greedy_depth(depth);
        Ok(Some((depth, costs)))
    }

    /// Whether the model runs on the CPU under the fast kernel set.
    fn runs_cpu_fast_set(&self) -> bool {
        // Backend and kernels, not the tag: an f16 KV cache adds `+kv-f16`
        // to the tag and runs the same products.
        let (id, fast) = (
            self.backend(),
            crate::backend::CpuOps::id_for(crate::backend::KernelSet::Fast),
        );
        id.backend == fast.backend && id.kernels == fast.kernels
    }
}

/// Run `$body` with `$model` bound to the concrete model inside a
/// [`LoadedModel`]: `with_model!(&loaded, m => generic_fn(m))`. (Two
/// definitions: a macro's `cfg` would be read in the calling crate, so the
/// engine picks the arms by its own features.)
#[cfg(not(feature = "cuda"))]
#[macro_export]
macro_rules! with_model {
    ($loaded:expr, $model:ident => $body:expr) => {
        match $loaded {
            $crate::families::LoadedModel::Llama($model) => $body,
            $crate::families::LoadedModel::Qwen4Exp($model) => $body,
            $crate::families::LoadedModel::DeepseekV4($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::Glm5Next($model) => {
                let $model = &**$model;
                $body
            }
        }
    };
}

/// See the definition without the `cuda` feature; this one adds the models
/// on [`crate::backend::CudaOps`].
#[cfg(feature = "cuda")]
#[macro_export]
macro_rules! with_model {
    ($loaded:expr, $model:ident => $body:expr) => {
        match $loaded {
            $crate::families::LoadedModel::Llama($model) => $body,
            $crate::families::LoadedModel::Qwen4Exp($model) => $body,
            $crate::families::LoadedModel::DeepseekV4($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::Glm5Next($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::LlamaCuda($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::Qwen4ExpCuda($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::DeepseekV4Cuda($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::Glm5NextCuda($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::Qwen4ExpCudaGroup($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::DeepseekV4CudaGroup($model) => {
                let $model = &**$model;
                $body
            }
            $crate::families::LoadedModel::Glm5NextCudaGroup($model) => {
                let $model = &**$model;
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names and recognition keys are unique across the registry, so a
    /// file maps to exactly one family.
    #[test]
    fn registry_keys_are_unique() {
        let mut names = std::collections::BTreeSet::new();
        let mut keys = std::collections::BTreeSet::new();
        for f in FAMILIES {
            let d = f.descriptor;
            assert!(names.insert(d.name), "family {} registered twice", d.name);
            for t in d.model_types {
                assert!(keys.insert(("hf", *t)), "model_type {t} claimed twice");
            }
            for a in d.gguf_architectures {
                assert!(keys.insert(("gguf", *a)), "architecture {a} claimed twice");
            }
            assert!(
                !d.model_types.is_empty() || !d.gguf_architectures.is_empty(),
                "{} is recognised by nothing",
                d.name
            );
        }
    }
}
