//! Command-line interface definition.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use ds4_engine::backend::KernelSet;
use ds4_engine::families::AutoDepth;

#[derive(Debug, Parser)]
#[command(
    name = "ds4server",
    version,
    about = "Inference server and CLI for Flash-generation MoE models and dense Llama GGUF models"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the OpenAI- and Anthropic-compatible HTTP API.
    Serve(ServeArgs),
    /// Generate one reply and stream it to stdout.
    Run(RunArgs),
    /// Interactive multi-turn chat that reuses the live state between turns.
    Chat(ChatArgs),
    /// Describe a model file or directory: family, config, tensors.
    Inspect(InspectArgs),
    /// Download the default model into the user cache (again, if present).
    Pull,
    /// Write a GGUF from a Hugging Face directory or a GGUF, in a recipe's types.
    Quantize(QuantizeArgs),
    /// Compare quantized GGUFs with their source: logit error, KL, top-1, NLL.
    QuantizeReport(crate::commands::quantize_report::QuantizeReportArgs),
    /// Collect an importance matrix (llama.cpp's GGUF imatrix) over a text.
    Imatrix(crate::commands::imatrix_run::ImatrixArgs),
    /// Measure prefill and decode speed across context lengths (CSV + SVG).
    Bench(BenchArgs),
    /// Tools for replaying and checking individual pieces.
    #[command(subcommand)]
    Debug(DebugCommand),
    /// Show or clear the session checkpoint store.
    #[command(subcommand)]
    Sessions(SessionsCommand),
}

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// List the checkpoints (any model) with their size, key length and age.
    List(CheckpointDirArg),
    /// Remove every checkpoint in the store.
    Clear(CheckpointDirArg),
}

#[derive(Debug, Args, Clone)]
pub struct CheckpointDirArg {
    /// The checkpoint directory. Default: the user cache's `checkpoints`.
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
}

/// The session cache: the in-memory bank and durable checkpoints (off
/// unless asked for), shared by `run`, `chat` and `serve`.
#[derive(Debug, Args, Clone)]
pub struct CheckpointArgs {
    /// Memory budget in MiB of the session bank (earlier sessions kept for
    /// prompts that branch off them; the least useful go first).
    #[arg(long, default_value_t = 1024)]
    pub bank_budget_mib: usize,
    /// For models whose state cannot be cut back (recurrent layers), bank
    /// the prefill state every N prompt tokens (and always at the end of
    /// the prompt), so a prompt that diverges inside a shared prefix
    /// starts from the last boundary before the divergence. 0: only at the
    /// end of each prompt.
    #[arg(long, value_name = "N", default_value_t = ds4_engine::state::warm::DEFAULT_BOUNDARY_EVERY)]
    pub boundary_every: usize,
    /// Reuse and save session checkpoints in DIR (without DIR: the user
    /// cache's `checkpoints`). A prompt that extends a saved session only
    /// prefills the new tokens.
    #[arg(long, value_name = "DIR", num_args = 0..=1)]
    pub checkpoint_dir: Option<Option<PathBuf>>,
    /// Disk budget of the checkpoint store in MiB (least recently used files
    /// go first).
    #[arg(long, default_value_t = 4096)]
    pub checkpoint_budget_mib: u64,
    /// Save a turn only when its session covers at least this many tokens
    /// (short prompts are cheaper to prefill than to load).
    #[arg(long, default_value_t = 256)]
    pub checkpoint_min_tokens: usize,
}

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A .gguf file or a Hugging Face model directory. Default: the default
    /// model (SmolLM2-135M-Instruct Q4_1), pulled on first use.
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Where the model runs: `cuda` (an NVIDIA GPU; builds with the `cuda`
    /// feature), `cpu`, or `auto` (the GPU when its driver loads, else the
    /// CPU, saying so).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// Several GPUs for one model: `cuda:0,cuda:1,…`, the first holding
    /// everything but the routed experts, which are split evenly over all
    /// (expert parallel; the MoE families). Outputs are bit-identical to
    /// one GPU's. A repeated device runs logical shards of one GPU. Rows
    /// cross between GPUs through the host for now. Replaces `--device`.
    #[arg(long, value_name = "LIST", conflicts_with = "device")]
    pub devices: Option<ds4_engine::families::shards::Shards>,
    /// KV cache element type (llama.cpp's `-ctk/-ctv`): `f32` keeps keys and
    /// values as computed (4 bytes a value); `f16` rounds them to half
    /// precision (2 bytes: half the cache memory and half the bytes each
    /// decode step reads at depth; outputs differ from f32 in the last
    /// bits). f16 is for llama-family models on the CPU. `auto` (the
    /// default): f16 where the model can hold it and the fast kernel set
    /// runs (its quality is measured with the set's: bench/README.md),
    /// else f32 (so `--kernels reference` keeps the reference numerics).
    #[arg(long, value_enum, default_value_t = KvCacheArg::Auto)]
    pub kv_cache: KvCacheArg,
    #[command(flatten)]
    pub kernels: KernelsArg,
}

/// `--kernels reference|fast`: the kernel set the process runs, fixed
/// before the model loads (`ds4_engine::backend::kernel_set`).
#[derive(Debug, Args, Clone, Copy, Default)]
pub struct KernelsArg {
    /// Kernel set of the products: `reference` (f32 activations, every
    /// weight exactly as its format defines it: the set the transformers
    /// parity is proven on) or `fast` (on the CPU: activations rounded to
    /// int8 with one scale per 32 values and integer dot products for
    /// block-quantized weights; faster, with its own bits, and its own
    /// checkpoint identity). Default: `DS4_KERNELS`, else fast (its
    /// quality against reference is measured on the CPU and on CUDA:
    /// bench/README.md, docs/GPU.md run 38). On CUDA `fast` runs int8
    /// activations for the block types (Q8_0, Q4_1, Q2_K–Q6_K, IQ2_XXS)
    /// and its own mHC projection.
    #[arg(long, value_name = "SET", value_parser = kernel_set)]
    pub kernels: Option<KernelSet>,
}

/// `--kernels`: a kernel set's name.
fn kernel_set(s: &str) -> Result<KernelSet, String> {
    KernelSet::parse(s).map_err(|e| e.to_string())
}

/// `--kv-cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheArg {
    Auto,
    F32,
    F16,
}

impl KvCacheArg {
    /// The cache type for a model that can (`f16_capable`) or cannot hold
    /// f16 rows, under kernel set `set`.
    pub fn kv_type(self, f16_capable: bool, set: KernelSet) -> ds4_engine::state::kv_cache::KvType {
        use ds4_engine::state::kv_cache::KvType;
        match self {
            KvCacheArg::F32 => KvType::F32,
            KvCacheArg::F16 => KvType::F16,
            KvCacheArg::Auto if f16_capable && set == KernelSet::Fast => KvType::F16,
            KvCacheArg::Auto => KvType::F32,
        }
    }
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Debug, Args, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy. Default: the model family's.
    #[arg(long)]
    pub temperature: Option<f64>,
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<i64>,
    /// Only for families whose sampling law has min_p (reported as ignored otherwise).
    #[arg(long)]
    pub min_p: Option<f64>,
    #[arg(long)]
    pub presence_penalty: Option<f64>,
    #[arg(long)]
    pub frequency_penalty: Option<f64>,
    /// Random seed; a fresh one is chosen (and reported) when omitted.
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Debug, Args, Clone)]
pub struct GenerationArgs {
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Stop when this text is generated (repeatable); it is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Prefill chunk size in tokens.
    #[arg(long, default_value_t = ds4_engine::decode::DEFAULT_PREFILL_CHUNK)]
    pub chunk: usize,
    /// MTP speculative draft depth (0 = plain autoregressive decoding), or
    /// `auto`: the depth measured fastest for the model at this run's
    /// temperature and kernel set (see bench/README.md). Default: `auto`
    /// for the default model's head on the CPU's fast kernel set (measured
    /// faster than AR there), else the family's (AR for models without an
    /// MTP head, and for the default model under the reference set).
    #[arg(long = "mtp-depth")]
    pub mtp_depth_arg: Option<MtpDepthArg>,
    /// `mtp_depth_arg` resolved against the loaded model
    /// ([`MtpDepthArg::resolve`]).
    #[arg(skip)]
    pub mtp_depth: Option<usize>,
}

/// `--mtp-depth N|auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtpDepthArg {
    Auto,
    Depth(usize),
}

impl std::str::FromStr for MtpDepthArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(MtpDepthArg::Auto);
        }
        s.parse().map(MtpDepthArg::Depth).map_err(|_| {
            format!("`{s}` is not a draft depth: give a number (0 = no MTP) or `auto`")
        })
    }
}

impl MtpDepthArg {
    /// The depths to run on `model`, greedy and sampled (`auto`: its
    /// measured best for each, 0 without a head; a number: that depth for
    /// both).
    pub fn resolve(self, model: &ds4_engine::families::LoadedModel) -> AutoDepth {
        match self {
            MtpDepthArg::Auto => model.mtp_auto_depth(),
            MtpDepthArg::Depth(d) => AutoDepth {
                greedy: d,
                sampled: d,
            },
        }
    }
}

impl GenerationArgs {
    /// Resolve `--mtp-depth` for this run's temperature (`sampling`'s, or
    /// the family's default when none is given).
    pub fn resolve_mtp_depth(
        &mut self,
        model: &ds4_engine::families::LoadedModel,
        sampling: &SamplingArgs,
    ) {
        let temperature = sampling
            .temperature
            .unwrap_or(model.descriptor().sampling_defaults.temperature);
        self.mtp_depth = self
            .mtp_depth_arg
            .map(|d| d.resolve(model))
            .or_else(|| model.mtp_default_depth())
            .map(|d| d.for_temperature(temperature));
    }
}

#[derive(Debug, Args)]
#[group(id = "prompt_source", required = true, multiple = false)]
pub struct PromptSource {
    /// The prompt text.
    #[arg(short = 'p', long = "prompt")]
    pub text: Option<String>,
    /// Read the prompt text from a file.
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// The prompt as token ids, comma-separated (no template, no BOS).
    #[arg(long, value_delimiter = ',')]
    pub prompt_tokens: Option<Vec<u32>>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt: PromptSource,
    /// Tokenize the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// System message for the chat template.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub generation: GenerationArgs,
    /// Print one JSON object (tokens, text, finish_reason, seed, speeds)
    /// instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System message for the whole conversation.
    #[arg(long)]
    pub system: Option<String>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub generation: GenerationArgs,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (loopback by default: exposing the server is a
    /// deliberate choice).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model id clients use (default: the model file or directory name).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Another name `/v1/models` lists for the served model (repeatable).
    /// Any requested name is served anyway unless --strict-model-names.
    #[arg(long = "model-alias", value_name = "NAME")]
    pub model_aliases: Vec<String>,
    /// Answer 404 to a request naming a model other than the id, an alias
    /// or a family alias (default: serve any name with the loaded model).
    #[arg(long)]
    pub strict_model_names: bool,
    /// Reply length in tokens for requests that set none (agents such as
    /// Codex send no limit); 0: up to the context.
    #[arg(long, default_value_t = ds4_server::DEFAULT_MAX_TOKENS)]
    pub default_max_tokens: u64,
    /// Context limit in tokens (default and maximum: the model's; a larger
    /// value is capped, with a warning).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Requests that may wait behind the running ones, a cap besides
    /// --max-queue-tokens (default: no count cap); more get 503.
    #[arg(long, value_name = "N")]
    pub max_queue: Option<usize>,
    /// Session-cache rows the waiting requests may reserve together, each
    /// its prompt plus its output limit (default: 16 contexts); a request
    /// past it gets 503 with Retry-After, unless nothing waits.
    #[arg(long, value_name = "TOKENS")]
    pub max_queue_tokens: Option<usize>,
    /// Turns run at once, their forwards batched (1: one turn at a time).
    /// Each of the N lanes keeps its own live session and a bank of
    /// --bank-budget-mib / N; a conversation's next turn goes back to the
    /// lane holding it. Only the first lane uses --checkpoint-dir. With
    /// N > 1 requests that name no MTP depth run without drafts (the
    /// model's MTP default applies to one lane only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256), value_name = "N")]
    pub max_batch: u64,
    /// Rows one batched forward takes at most (decode rows and prefill
    /// chunks of every running turn; with --max-batch above 1). A smaller
    /// value bounds a step's latency for the running streams; a larger one
    /// prefills more prompts at once.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..=65536), value_name = "ROWS")]
    pub max_batch_tokens: u64,
    /// Images one request may carry (models that read images); more get 400.
    #[arg(long, default_value_t = ds4_server::DEFAULT_MAX_IMAGES)]
    pub max_images: usize,
    /// Bytes one image may have once decoded; a larger one gets 400.
    #[arg(long, default_value_t = ds4_server::DEFAULT_MAX_IMAGE_BYTES)]
    pub max_image_bytes: usize,
    /// Pixels (width x height) one image may have, read from its header
    /// before it is decoded; a larger one gets 400. Default: the model's
    /// image processor's limit.
    #[arg(long)]
    pub max_image_pixels: Option<u64>,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`) on
    /// every route but `/health` and the embedded page.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Let pages from this origin (`https://app.example:3000`) call the API
    /// from a browser; repeatable; `*` for any origin.
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Vec<String>,
    /// Without --api-key, also answer requests for this host name (loopback
    /// names and IP addresses always pass); repeatable; `*` for any.
    #[arg(long, value_name = "HOST")]
    pub allowed_host: Vec<String>,
    /// Seconds a client has to send a request's headers, counted from when
    /// the connection waits for them (also the idle keep-alive limit).
    #[arg(long, default_value = "10", value_parser = seconds, value_name = "SECS")]
    pub header_timeout: std::time::Duration,
    /// Seconds a client has to send a request's body once its headers are in.
    #[arg(long, default_value = "30", value_parser = seconds, value_name = "SECS")]
    pub body_timeout: std::time::Duration,
    /// Connections open at once; more are closed on accept.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds running requests may go on after Ctrl+C or SIGTERM; then they
    /// are cancelled and the live session is saved. A second signal exits
    /// at once.
    #[arg(long, default_value = "5", value_parser = seconds, value_name = "SECS")]
    pub shutdown_grace: std::time::Duration,
    /// Seed for requests that send none (default: a fresh one per request).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Temperature for requests that send none (default: the family's);
    /// 0 decodes greedily.
    #[arg(long, value_parser = temperature, value_name = "T")]
    pub temperature: Option<f64>,
    /// Run every request with the server's --temperature and --seed (those
    /// given), replacing the request's own values, with a warning in the
    /// response when they differ. For clients that always send a
    /// temperature (Claude Code) when replies must be reproducible.
    #[arg(long)]
    pub force_sampling: bool,
    /// MTP draft depth for requests that send no `mtp_depth` (0 = plain
    /// AR decoding), or `auto` (the depth measured fastest for the model
    /// at the request's temperature and the kernel set).
    /// Default: `auto` for the default model's head on the CPU's fast
    /// kernel set (measured faster than AR there), else the family's (AR
    /// for a model without an MTP head, and for the default model under
    /// the reference set). A depth the model cannot run is refused at
    /// startup.
    #[arg(long = "mtp-depth")]
    pub mtp_depth: Option<MtpDepthArg>,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub body_limit: usize,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
}

/// `ds4server quantize` (docs/QUANTIZE.md).
#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// A Hugging Face directory (BF16, F16, F32, FP8, DeepSeek FP4
    /// experts) or a GGUF to requantize.
    pub source: PathBuf,
    /// The GGUF to write (written as OUT.partial, renamed when complete).
    pub out: PathBuf,
    /// ds4-q2, ds4-q4, q8_0, q4_k, f16, bf16 or f32.
    #[arg(long)]
    pub recipe: String,
    /// Override a tensor group's type, e.g. `experts=Q4_K`,
    /// `expert-down=Q2_K`, `attention=Q8_0` (repeatable).
    #[arg(long = "type", value_name = "GROUP=TYPE")]
    pub types: Vec<String>,
    /// llama.cpp's importance matrix (imatrix GGUF or the legacy .dat).
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Quantize IQ2_XXS without an importance matrix (each expert weighted
    /// by its own squared values, ds4's fallback; said in the metadata).
    #[arg(long)]
    pub allow_no_imatrix: bool,
    /// Print the plan (every tensor's group and type) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Quantizer threads (each tensor's rows split between them; the
    /// bytes do not depend on N). Default: the available cores.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A .gguf file or a Hugging Face model directory (default: the default model).
    pub path: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The device whose kernels the `kernels` line names (as for the
    /// commands that load the model; nothing is loaded here).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    #[command(flatten)]
    pub kernels: KernelsArg,
}

#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Print the token ids of a text, or the text of token ids.
    Tokenize(TokenizeArgs),
    /// Write the logits of a token sequence to a safetensors file.
    Logits(LogitsArgs),
    /// Replay sampling decisions from a JSONL file of cases.
    Sample(SampleArgs),
}

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long, conflicts_with_all = ["text_file", "decode"])]
    pub text: Option<String>,
    #[arg(long, conflicts_with = "decode")]
    pub text_file: Option<PathBuf>,
    /// Treat control-token text (like `<|im_start|>`) as those tokens.
    #[arg(long)]
    pub special: bool,
    /// Decode these comma-separated ids instead.
    #[arg(long, value_delimiter = ',')]
    pub decode: Option<Vec<u32>>,
}

#[derive(Debug, Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    pub tokens: Vec<u32>,
    /// Process the tokens in chunks of N (default: one forward).
    #[arg(long, conflicts_with_all = ["prefill", "steps"])]
    pub chunk: Option<usize>,
    /// Prefill the first P tokens in one forward, then step one token at a time.
    #[arg(long, requires = "steps")]
    pub prefill: Option<usize>,
    /// Number of single-token steps after the prefill.
    #[arg(long, requires = "prefill")]
    pub steps: Option<usize>,
    /// Output safetensors file (tensor `logits`, [rows, vocab], f32).
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct SampleArgs {
    /// The sampling law: nucleus or ds4.
    #[arg(long)]
    pub law: String,
    /// JSONL file, one case per line ("-" for stdin).
    #[arg(long)]
    pub cases: PathBuf,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// First context frontier (tokens).
    #[arg(long, default_value_t = 512)]
    pub ctx_start: usize,
    /// Last context frontier (tokens).
    #[arg(long, default_value_t = 2048)]
    pub ctx_max: usize,
    /// Distance between frontiers (tokens).
    #[arg(long, default_value_t = 512)]
    pub step: usize,
    /// Cold prompts instead of frontiers: for each length (comma-separated,
    /// e.g. `1024,4096,8192`) prefill that many tokens from an empty state,
    /// all of it timed, then decode `--gen` tokens at that depth.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub prompts: Vec<usize>,
    /// Greedy tokens decoded at each frontier.
    #[arg(long = "gen", default_value_t = 64)]
    pub gen_tokens: usize,
    /// Prefill chunk size in tokens.
    #[arg(long, default_value_t = ds4_engine::decode::DEFAULT_PREFILL_CHUNK)]
    pub chunk: usize,
    /// CPU threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Also write the CSV here (it is always printed to stdout).
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write an SVG plot of tok/s against context here.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// MTP mode: AR against MTP at depths 1..=--mtp-max-depth on held-out
    /// chat prompts (`--gen` tokens each): tok/s, speedup, acceptance per
    /// draft position, and the cost of each piece of a cycle.
    #[arg(long)]
    pub mtp: bool,
    /// Random weights at a family's real configuration instead of a model
    /// file (`qwen4_exp`, `deepseek_v4`, `glm5_next`): prefill
    /// `--ctx-start` random tokens, decode `--gen`, verify windows of 1..4
    /// rows, and the bytes a decode step reads against the measured device
    /// copy bandwidth (on CUDA).
    #[arg(long, value_name = "FAMILY")]
    pub synthetic: Option<String>,
    /// The `--synthetic` configuration: `full` (the real one), `tiny` (the
    /// tiny fixture's) or a `config.json` path.
    #[arg(long, default_value = "full")]
    pub shape: String,
    /// Seed of the `--synthetic` weights and prompt.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The stored types of the `--synthetic` weights: `ds4-q2` / `ds4-q4`
    /// (antirez/ds4's DeepSeek-V4-Flash and GLM-5.3-Flash recipes, per
    /// tensor group; the default for deepseek_v4 and glm5_next is
    /// `ds4-q2`) or `q4_1` (every projection
    /// Q4_1 made on the device, small parameters f32: qwen4_exp's default).
    #[arg(long, value_name = "RECIPE", requires = "synthetic")]
    pub weights: Option<String>,
    /// With `--synthetic`: print the weight bytes per stored type of the
    /// shape (from the family's tensor list) without making any weight,
    /// then stop.
    #[arg(long, requires = "synthetic")]
    pub dry_run: bool,
    /// Teacher-forced negative log-likelihood of the model over the text of
    /// FILE instead of speed: tokenized without a chat template (BOS at the
    /// start of each window when the tokenizer adds one to a raw prompt),
    /// cut into windows of `--nll-window` tokens each prefilled from an
    /// empty state; every position but a window's first is scored. Prints
    /// the tokens scored, the mean NLL (nats/token), the perplexity, the
    /// backend and the kernel set.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["mtp", "synthetic", "prompts"])]
    pub nll: Option<PathBuf>,
    /// Tokens per `--nll` window (BOS included when the model takes one).
    #[arg(long, value_name = "N", default_value_t = 1024, requires = "nll")]
    pub nll_window: usize,
    /// Read at most this many tokens of the `--nll` text (its beginning).
    #[arg(long, value_name = "N", requires = "nll")]
    pub nll_max_tokens: Option<usize>,
    /// Continuous batching's throughput instead: for each count N, N
    /// greedy streams (random prompts of the first `--prompts` length,
    /// default 128; `--gen` tokens each) at once through one batching
    /// model; prints the aggregate decode rate against one stream and
    /// whether each stream's tokens equal its turn served alone.
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["mtp", "nll"])]
    pub streams: Vec<usize>,
    /// Draft depth of every `--streams` turn (0: plain AR): MTP turns'
    /// verify windows share the batches with the other streams' rows
    /// (the model needs an MTP head).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "streams")]
    pub streams_mtp_depth: usize,
    /// Prompts for `--mtp`, one per line (default: bench/mtp_prompts.txt,
    /// built in).
    #[arg(long, requires = "mtp")]
    pub mtp_prompts: Option<PathBuf>,
    /// How many of the prompts `--mtp` runs.
    #[arg(long, default_value_t = 16)]
    pub mtp_prompt_count: usize,
    /// Deepest draft chain `--mtp` measures.
    #[arg(long, default_value_t = 3)]
    pub mtp_max_depth: usize,
    /// Temperatures `--mtp` measures (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "0,0.7")]
    pub mtp_temperatures: Vec<f64>,
    /// Repetitions of each timed piece in `--mtp`'s cost table (median).
    #[arg(long, default_value_t = 20)]
    pub mtp_cost_reps: usize,
    /// Draft-stop thresholds `--mtp` measures side by side, each at every
    /// depth (comma-separated; 0 drafts the full depth every cycle): a
    /// cycle stops drafting before a greedy draft whose head row gives its
    /// top token less than this probability. Default: the family's own
    /// threshold (0.3 for the default model's head on the CPU; none
    /// elsewhere).
    #[arg(long, value_delimiter = ',', value_parser = probability)]
    pub mtp_draft_stop: Vec<f32>,
}

/// A probability in [0, 1].
fn probability(s: &str) -> Result<f32, String> {
    let v: f32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a probability in [0, 1]"))
    }
}

/// A non-negative number of seconds (fractions allowed).
fn seconds(s: &str) -> Result<std::time::Duration, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    std::time::Duration::try_from_secs_f64(v)
        .map_err(|_| format!("{s:?} is not a non-negative number of seconds"))
}

/// `--temperature`: a number from 0 to 2 (OpenAI's range).
fn temperature(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=2.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!(
            "{s} is out of range: the temperature must be between 0 and 2"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ds4_engine::state::kv_cache::KvType;

    /// `auto` is f16 only where the model holds f16 rows and the fast set
    /// runs; an explicit type is kept (the loader refuses f16 where it
    /// cannot be held).
    #[test]
    fn kv_cache_auto_is_f16_for_a_capable_model_on_the_fast_set() {
        use KernelSet::{Fast, Reference};
        let auto = KvCacheArg::Auto;
        assert_eq!(auto.kv_type(true, Fast), KvType::F16);
        assert_eq!(auto.kv_type(true, Reference), KvType::F32);
        assert_eq!(auto.kv_type(false, Fast), KvType::F32);
        for capable in [true, false] {
            for set in [Fast, Reference] {
                assert_eq!(KvCacheArg::F32.kv_type(capable, set), KvType::F32);
                assert_eq!(KvCacheArg::F16.kv_type(capable, set), KvType::F16);
            }
        }
    }
}
