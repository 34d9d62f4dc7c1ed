//! `ds4server debug …`: replay and check individual pieces of the pipeline.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};

use anyhow::Context;
use candle_core::{Device, Tensor};
use ds4_engine::{LogitsRows, Model};
use ds4_sampling::Law;
use serde_json::json;

use crate::args::{DebugCommand, LogitsArgs, SampleArgs, TokenizeArgs};
use crate::model_source;

pub fn debug(command: DebugCommand) -> anyhow::Result<()> {
    match command {
        DebugCommand::Tokenize(args) => tokenize(args),
        DebugCommand::Logits(args) => logits(args),
        DebugCommand::Sample(args) => sample(args),
    }
}

fn tokenize(args: TokenizeArgs) -> anyhow::Result<()> {
    let path = model_source::resolve(args.model.model.as_deref())?;
    let tokenizer = model_source::load_tokenizer(&path)?;
    if let Some(ids) = args.decode {
        println!("{}", tokenizer.decode(&ids, false)?);
        return Ok(());
    }
    let text = match (args.text, args.text_file) {
        (Some(text), _) => text,
        (None, Some(file)) => {
            std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?
        }
        (None, None) => anyhow::bail!("give --text, --text-file or --decode"),
    };
    let ids = tokenizer.encode(&text, args.special)?;
    println!("{}", json!({ "ids": ids }));
    Ok(())
}

fn logits(args: LogitsArgs) -> anyhow::Result<()> {
    let loaded = model_source::load(args.model.model.as_deref(), &args.model)?;
    let rows = ds4_engine::with_model!(&loaded.model, model => logits_rows(model, &args))?;
    let vocab = rows.first().map_or(0, Vec::len);
    let flat: Vec<f32> = rows.concat();
    let tensor = Tensor::from_vec(flat, (args.tokens.len(), vocab), &Device::Cpu)?;
    let tensors = HashMap::from([("logits".to_string(), tensor)]);
    candle_core::safetensors::save(&tensors, &args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote logits [{}, {vocab}] to {}",
        args.tokens.len(),
        args.out.display()
    );
    Ok(())
}

/// One logits row per input position, computed in the mode the flags ask
/// for: one forward, chunks of N, or a prefill followed by single steps.
fn logits_rows<M: Model>(model: &M, args: &LogitsArgs) -> anyhow::Result<Vec<Vec<f32>>> {
    let tokens = &args.tokens;
    if tokens.is_empty() {
        anyhow::bail!("--tokens is empty");
    }
    let pieces: Vec<&[u32]> = match (args.chunk, args.prefill, args.steps) {
        (Some(0), ..) => anyhow::bail!("--chunk must be at least 1"),
        (Some(n), ..) => tokens.chunks(n).collect(),
        (None, Some(p), Some(k)) => {
            if p == 0 || p + k != tokens.len() {
                anyhow::bail!(
                    "--prefill {p} --steps {k} must cover the {} tokens exactly, with P >= 1",
                    tokens.len()
                );
            }
            let (head, tail) = tokens.split_at(p);
            std::iter::once(head).chain(tail.chunks(1)).collect()
        }
        _ => vec![tokens.as_slice()],
    };
    let mut state = model.new_state();
    let mut rows = Vec::with_capacity(tokens.len());
    for piece in pieces {
        let out = model.forward(piece, &mut state, LogitsRows::All)?;
        rows.extend((0..out.rows).map(|r| out.row(r).to_vec()));
    }
    Ok(rows)
}

fn sample(args: SampleArgs) -> anyhow::Result<()> {
    let law: Law = args
        .law
        .parse()
        .map_err(|_| anyhow::anyhow!("--law must be `nucleus` or `ds4`, not `{}`", args.law))?;
    let input: Box<dyn BufRead> = if args.cases.as_os_str() == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(&args.cases)
            .with_context(|| format!("opening {}", args.cases.display()))?;
        Box::new(BufReader::new(file))
    };
    let stdout = std::io::stdout().lock();
    ds4_sampling::replay::replay_cases(law, input, stdout)
        .with_context(|| format!("replaying {}", args.cases.display()))?;
    Ok(())
}
