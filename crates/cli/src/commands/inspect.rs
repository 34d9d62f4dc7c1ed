//! `ds4server inspect`: what a model holds, without loading its weights.

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
    if args.json {
        let mut value = serde_json::to_value(&info)?;
        value["path"] = json!(path.display().to_string());
        value["tokenizer"] = json!(tokenizer_kind);
        value["chat_template"] = json!(template);
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
    let histogram: Vec<String> = info
        .dtype_histogram
        .iter()
        .map(|(dtype, n)| format!("{dtype} ×{n}"))
        .collect();
    println!("storage types: {}", histogram.join(", "));
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
