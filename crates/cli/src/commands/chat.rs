//! `ds4server chat`: an interactive multi-turn REPL. The live session is
//! kept between turns, so each turn only prefills what changed since the
//! last one (the new user message and the template around it).

use std::io::Write;

use ds4_engine::Model;
use ds4_engine::decode::CancelToken;
use ds4_text::Tokenizer;
use rustyline::error::ReadlineError;
use serde_json::Value;

use crate::args::ChatArgs;
use crate::commands::sessions::CacheSettings;
use crate::prompt;
use crate::turn_runner::{TurnOptions, sampler_for, stream_turn};

const HELP: &str = "\
Type a message and press Enter.
  /reset   forget the conversation (its state stays in the session cache)
  /help    this text
  /exit    quit (or Ctrl+D)
Ctrl+C during a reply stops it; the partial reply stays in the conversation.";

pub fn chat(mut args: ChatArgs) -> anyhow::Result<()> {
    let loaded = crate::model_source::load(args.model.model.as_deref(), &args.model)?;
    args.generation
        .resolve_mtp_depth(&loaded.model, &args.sampling);
    ds4_engine::with_model!(&loaded.model, model => chat_with(model, &loaded.tokenizer, &args))
}

fn chat_with<M: Model>(model: &M, tokenizer: &Tokenizer, args: &ChatArgs) -> anyhow::Result<()> {
    let interrupted = CancelToken::new();
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.cancel())?;
    }
    let mut setup = sampler_for(model, &args.sampling)?;
    for warning in &setup.warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!("seed {} — /help for commands", setup.seed);

    let mut editor = rustyline::DefaultEditor::new()?;
    let model_path = crate::model_source::resolve(args.model.model.as_deref())?;
    let mut cache = CacheSettings::from_args(&args.checkpoints, &model_path)?.open(model)?;
    let mut messages = initial_messages(args);
    loop {
        let line = match editor.readline(">>> ") {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                eprintln!("(Ctrl+D or /exit quits)");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(line);
        match line {
            "/exit" | "/quit" => break,
            "/help" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" => {
                messages = initial_messages(args);
                eprintln!("(conversation cleared)");
                continue;
            }
            _ if line.starts_with('/') => {
                eprintln!("unknown command {line}; /help lists them");
                continue;
            }
            _ => {}
        }
        messages.push(prompt::message("user", line));
        let prompt_ids = match prompt::chat_prompt(tokenizer, model.descriptor().name, &messages) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
                continue;
            }
        };
        interrupted.reset();
        // The live session, a banked one, or one saved by an earlier run.
        cache.prepare(model, &prompt_ids, args.generation.mtp_depth);
        let mut stdout = std::io::stdout().lock();
        let turn = stream_turn(
            model,
            &mut cache,
            tokenizer,
            &prompt_ids,
            &mut setup.sampler,
            &TurnOptions {
                generation: &args.generation,
                cancel: Some(&interrupted),
            },
            &mut |piece| {
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            },
        );
        let _ = writeln!(stdout);
        cache.finish(turn.as_ref().ok().map(|t| &t.result));
        match turn {
            Ok(turn) => {
                let t = turn.result.timings;
                eprintln!(
                    "[{} tokens, {}; reused {} prompt tokens, prefilled {} at {:.0} tok/s, decode {:.1} tok/s]",
                    turn.result.tokens.len(),
                    turn.result.finish_reason.as_str(),
                    turn.result.reused_tokens,
                    t.prefill_tokens,
                    t.prefill_tps(),
                    t.decode_tps()
                );
                messages.push(prompt::message("assistant", &turn.text));
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
            }
        }
    }
    // Clean shutdown: keep whatever consistent state the conversation holds.
    cache.shutdown();
    Ok(())
}

fn initial_messages(args: &ChatArgs) -> Vec<Value> {
    args.system
        .iter()
        .map(|s| prompt::message("system", s))
        .collect()
}
