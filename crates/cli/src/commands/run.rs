//! `ds4server run`: one turn, streamed to stdout or reported as JSON.

use std::io::Write;

use anyhow::Context;
use ds4_engine::Model;
use ds4_text::Tokenizer;
use serde_json::json;

use crate::args::RunArgs;
use crate::commands::sessions::CacheSettings;
use crate::prompt;
use crate::turn_runner::{TurnOptions, sampler_for, stream_turn};

pub fn run(mut args: RunArgs) -> anyhow::Result<()> {
    let loaded = crate::model_source::load(args.model.model.as_deref(), &args.model)?;
    args.generation
        .resolve_mtp_depth(&loaded.model, &args.sampling);
    ds4_engine::with_model!(&loaded.model, model => run_with(model, &loaded.tokenizer, &args))
}

fn prompt_tokens(tokenizer: &Tokenizer, family: &str, args: &RunArgs) -> anyhow::Result<Vec<u32>> {
    if let Some(ids) = &args.prompt.prompt_tokens {
        return Ok(ids.clone());
    }
    let text = match (&args.prompt.text, &args.prompt.prompt_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => std::fs::read_to_string(file)
            .with_context(|| format!("reading the prompt file {}", file.display()))?,
        (None, None) => anyhow::bail!("give a prompt with -p, --prompt-file or --prompt-tokens"),
    };
    if args.raw {
        return prompt::raw_prompt(tokenizer, &text);
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(prompt::message("system", system));
    }
    messages.push(prompt::message("user", &text));
    prompt::chat_prompt(tokenizer, family, &messages)
}

fn run_with<M: Model>(model: &M, tokenizer: &Tokenizer, args: &RunArgs) -> anyhow::Result<()> {
    let prompt = prompt_tokens(tokenizer, model.descriptor().name, args)?;
    if prompt.is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    let mut setup = sampler_for(model, &args.sampling)?;
    for warning in &setup.warnings {
        eprintln!("warning: {warning}");
    }
    let model_path = crate::model_source::resolve(args.model.model.as_deref())?;
    let mut cache = CacheSettings::from_args(&args.checkpoints, &model_path)?.open(model)?;
    let prepared = cache.prepare(model, &prompt, args.generation.mtp_depth);
    let mut stdout = std::io::stdout().lock();
    let turn = stream_turn(
        model,
        &mut cache,
        tokenizer,
        &prompt,
        &mut setup.sampler,
        &TurnOptions {
            generation: &args.generation,
            cancel: None,
        },
        &mut |piece| {
            if !args.json && !piece.is_empty() {
                // A closed stdout (e.g. `| head`) must not abort generation
                // with a panic; the turn simply finishes.
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
        },
    );
    cache.finish(turn.as_ref().ok().map(|t| &t.result));
    let turn = turn?;
    // Clean exit: a turn that did not complete is still saved if long enough.
    cache.shutdown();
    let timings = turn.result.timings;
    if args.json {
        let report = json!({
            "prompt_tokens": prompt.len(),
            "tokens": turn.result.tokens,
            "text": turn.text,
            "finish_reason": turn.result.finish_reason.as_str(),
            "seed": setup.seed,
            "warnings": setup.warnings,
            "reused_tokens": turn.result.reused_tokens,
            "cache_source": prepared.source.as_str(),
            "prefill_tokens": timings.prefill_tokens,
            "prefill_tps": timings.prefill_tps(),
            "decode_tokens": timings.decode_tokens,
            "decode_tps": timings.decode_tps(),
            "argmax_fallbacks": turn.result.argmax_fallbacks,
            "final_state": format!("{:?}", turn.result.final_state).to_lowercase(),
            "mtp": turn.result.mtp.as_ref().map(|m| json!({
                "depth": m.depth,
                "cycles": m.cycles,
                "drafted": m.drafted,
                "accepted": m.accepted,
                "bonus": m.bonus,
                "verify_rows": m.verify_rows,
                "acceptance_rate": m.acceptance_rate(),
                "mean_accepted_len": m.mean_accepted_len(),
            })),
        });
        writeln!(stdout, "{report}")?;
    } else {
        writeln!(stdout)?;
        eprintln!(
            "[{} tokens, finish: {}, seed {}, prefill {:.1} tok/s, decode {:.1} tok/s]",
            turn.result.tokens.len(),
            turn.result.finish_reason.as_str(),
            setup.seed,
            timings.prefill_tps(),
            timings.decode_tps()
        );
        if let Some(m) = &turn.result.mtp {
            eprintln!(
                "[MTP depth {}: {} cycles, accepted {}/{} drafts ({:.1}%), mean accepted length {:.2}, bonus {}]",
                m.depth,
                m.cycles,
                m.accepted_total(),
                m.drafted_total(),
                100.0 * m.acceptance_rate(),
                m.mean_accepted_len(),
                m.bonus
            );
        }
    }
    Ok(())
}
