//! `ds4server inspect`: what a model holds, without loading its weights.

use ds4_engine::backend::{CpuOps, KernelSet};
use ds4_engine::families::Device;
use ds4_engine::inspect as load;
use serde_json::json;

use crate::args::InspectArgs;
use crate::model_source;

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let path = model_source::resolve(args.path.as_deref())?;
    let info = load::inspect(&path)?;
    // The tokenizer is part of what a user needs to know (which kind, and
    // whether a chat template is present); a model without one still inspects.
    let tokenizer = model_source::load_tokenizer(&path);
    let (tokenizer_kind, template) = match &tokenizer {
        Ok(t) => (t.kind(), t.chat_template().is_some()),
        Err(e) => (format!("unavailable: {e:#}"), false),
    };
    let head = mtp_head(&path);
    let kernels = kernels(&args)?;
    if args.json {
        let mut value = serde_json::to_value(&info)?;
        value["mtp_head"] = head.clone();
        value["path"] = json!(path.display().to_string());
        value["tokenizer"] = json!(tokenizer_kind);
        value["chat_template"] = json!(template);
        value["kernels"] = kernels.json();
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("path:          {}", path.display());
    println!("format:        {:?}", info.format);
    println!(
        "architecture:  {}",
        info.architecture.as_deref().unwrap_or("(unknown)")
    );
    println!(
        "family:        {}",
        info.family.unwrap_or("(no family accepts it)")
    );
    println!("parameters:    {}", group_thousands(info.parameter_count));
    println!("tokenizer:     {tokenizer_kind}");
    println!("chat template: {}", if template { "yes" } else { "no" });
    println!("kernels:       {}", kernels.line());
    match head["status"].as_str() {
        Some("ok") => println!(
            "mtp head:      {} ({} parameters, vocabulary subset {}, sha256 {} checked; \
             depths: on the CPU's fast set default = auto, greedy measured at load from this \
             machine's cycle costs and the head's greedy acceptance {} per cycle at depths 1-3 \
             (if timing fails: {}) / {} sampled, elsewhere \
             default 0 = AR and auto {} greedy / {} sampled, max {}; on the CPU's reference set drafting \
             stops before a greedy draft below {} head confidence)",
            head["path"].as_str().unwrap_or_default(),
            group_thousands(head["parameters"].as_u64().unwrap_or(0)),
            head["vocab_subset"],
            head["sha256"].as_str().unwrap_or_default(),
            head["fast_greedy_accepted_per_cycle"],
            head["auto_depth_fast"],
            head["auto_depth_sampled_fast"],
            head["auto_depth"],
            head["auto_depth_sampled"],
            head["max_depth"],
            head["cpu_reference_draft_stop"],
        ),
        Some(status) => println!("mtp head:      {status}"),
        None => println!("mtp head:      none"),
    }
    let histogram: Vec<String> = info
        .dtype_histogram
        .iter()
        .map(|(dtype, n)| format!("{dtype} ×{n}"))
        .collect();
    println!("storage types: {}", histogram.join(", "));
    println!(
        "weights:       {} (resident on the CPU, read in place; uploaded as stored to a GPU; caches extra)",
        human_bytes(info.weight_bytes)
    );
    println!("tensor groups ({}):", info.groups.len());
    let gw = info.groups.iter().map(|g| g.group.len()).max().unwrap_or(0);
    for g in &info.groups {
        println!(
            "  {:gw$}  {:>4} × {:<10} {:>10}",
            g.group,
            g.tensors,
            g.dtypes.join("+"),
            human_bytes(g.bytes)
        );
    }
    println!("config:");
    if let Some(map) = info.config.as_object() {
        for (key, value) in map {
            println!("  {key} = {value}");
        }
    }
    println!("tensors ({}):", info.tensors.len());
    let width = info.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0);
    for t in &info.tensors {
        println!("  {:width$}  {:>6}  {:?}", t.name, t.dtype, t.shape);
    }
    Ok(())
}

/// The kernels a load of this model would run (`--device`, `--kernels`,
/// `DS4_KERNELS`), without loading it.
struct Kernels {
    set: KernelSet,
    /// The backend id (`cpu-avx512-fast`); `None` for a GPU, whose id
    /// names its architecture, known once the device is opened.
    backend: Option<String>,
    device: Device,
}

impl Kernels {
    fn line(&self) -> String {
        match (&self.backend, self.device) {
            (Some(id), _) => format!("{id} ({} set)", self.set),
            (None, Device::Cuda(n)) => format!("cuda device {n}, {} set", self.set),
            (None, Device::CudaGroup(g)) => format!("cuda devices {g}, {} set", self.set),
            (None, Device::Cpu) => format!("cpu, {} set", self.set),
        }
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "set": self.set.name(),
            "backend": self.backend,
            "device": match self.device {
                Device::Cpu => "cpu".to_string(),
                Device::Cuda(n) => format!("cuda:{n}"),
                Device::CudaGroup(g) => g.to_string(),
            },
        })
    }
}

fn kernels(args: &InspectArgs) -> anyhow::Result<Kernels> {
    let device = model_source::device(args.device)?;
    let set = model_source::kernels_for(device, args.kernels.kernels)?;
    let backend = match device {
        Device::Cpu => Some(CpuOps::id_for(set).to_string()),
        Device::Cuda(_) | Device::CudaGroup(_) => None,
    };
    Ok(Kernels {
        set,
        backend,
        device,
    })
}

/// The MTP head shipped for this model (checked as at load), as JSON:
/// `null` when the model has none.
fn mtp_head(path: &std::path::Path) -> serde_json::Value {
    use ds4_engine::families::llama::mtp::{MTP_MAX_DEPTH, MTP_MIN_DRAFT_CONFIDENCE};
    match ds4_models::mtp_head_for(path) {
        None => serde_json::Value::Null,
        Some(Err(e)) => json!({ "status": format!("refused: {e} (the model runs without MTP)") }),
        Some(Ok(head)) => match load::inspect(&head) {
            Ok(h) => json!({
                "status": "ok",
                "path": head.display().to_string(),
                "sha256": ds4_models::DEFAULT_MTP_HEAD.sha256,
                "parameters": h.parameter_count,
                "vocab_subset": h.tensors.iter().find(|t| t.name == "mtp.vocab_subset")
                    .and_then(|t| t.shape.first().copied()),
                "auto_depth": ds4_engine::families::llama::MTP_AUTO_DEPTH,
                "auto_depth_sampled": ds4_engine::families::llama::MTP_AUTO_DEPTH_SAMPLED,
                "auto_depth_fast": ds4_engine::families::llama::MTP_AUTO_DEPTH_FAST,
                "fast_greedy_accepted_per_cycle":
                    ds4_models::DEFAULT_MTP_HEAD.fast_greedy_accepted_per_cycle,
                "auto_depth_sampled_fast":
                    ds4_engine::families::llama::MTP_AUTO_DEPTH_SAMPLED_FAST,
                "max_depth": MTP_MAX_DEPTH,
                // printed as written (an f32 widened to f64 shows its binary tail)
                "cpu_reference_draft_stop": (f64::from(MTP_MIN_DRAFT_CONFIDENCE) * 1e6).round() / 1e6,
            }),
            Err(e) => json!({ "status": format!("unreadable: {e}") }),
        },
    }
}

/// Bytes in binary units with one decimal (`1.5 GiB`).
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
