//! `ds4server chat`: an interactive multi-turn REPL. The live session is
//! kept between turns, so each turn only prefills what changed since the
//! last one (the new user message and the template around it).

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ds4_engine::Model;
use ds4_engine::decode::LiveSession;
use ds4_text::Tokenizer;
use rustyline::error::ReadlineError;
use serde_json::Value;

use crate::args::ChatArgs;
use crate::prompt;
use crate::turn_runner::{TurnOptions, sampler_for, stream_turn};

const HELP: &str = "\
Type a message and press Enter.
  /reset   forget the conversation (and the cached state)
  /help    this text
  /exit    quit (or Ctrl+D)
Ctrl+C during a reply stops it; the partial reply stays in the conversation.";

pub fn chat(args: ChatArgs) -> anyhow::Result<()> {
    let loaded = crate::model_source::load(args.model.model.as_deref())?;
    ds4_engine::with_model!(&loaded.model, model => chat_with(model, &loaded.tokenizer, &args))
}

fn chat_with<M: Model>(model: &M, tokenizer: &Tokenizer, args: &ChatArgs) -> anyhow::Result<()> {
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))?;
    }
    let mut setup = sampler_for(model, &args.sampling)?;
    for warning in &setup.warnings {
        eprintln!("warning: {warning}");
    }
    eprintln!("seed {} — /help for commands", setup.seed);

    let mut editor = rustyline::DefaultEditor::new()?;
    let mut session = LiveSession::new(model);
    let mut checkpoints = crate::commands::sessions::Checkpoints::open(
        &args.checkpoints,
        args.model.model.as_deref(),
        model,
    )?;
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
                session.reset(model);
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
        let prompt_ids = match prompt::chat_prompt(tokenizer, &messages) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
                continue;
            }
        };
        interrupted.store(false, Ordering::Relaxed);
        // A fresh conversation may continue one saved by an earlier run.
        if let (true, Some(c)) = (session.tokens().is_empty(), checkpoints.as_mut()) {
            session = c.session_for(model, &prompt_ids);
        }
        let mut stdout = std::io::stdout().lock();
        let turn = stream_turn(
            model,
            &mut session,
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
                if let Some(c) = checkpoints.as_mut() {
                    c.after_turn(&session, turn.result.final_state);
                }
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
            }
        }
    }
    // Clean shutdown: keep whatever consistent state the conversation holds.
    if let Some(c) = checkpoints.as_mut() {
        c.on_exit(&session);
    }
    Ok(())
}

fn initial_messages(args: &ChatArgs) -> Vec<Value> {
    args.system
        .iter()
        .map(|s| prompt::message("system", s))
        .collect()
}
