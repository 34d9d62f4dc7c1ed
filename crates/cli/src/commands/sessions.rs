//! `ds4server sessions list|clear`, and the checkpoint store `run` and
//! `chat` open with `--checkpoint-dir`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context;
use ds4_engine::Model;
use ds4_engine::decode::{FinalState, LiveSession};
use ds4_engine::state::checkpoint::{
    self, CheckpointStore, Identity, STATE_FORMAT_VERSION, fingerprint_path, fnv_hex,
};

use crate::args::{CheckpointArgs, CheckpointDirArg, SessionsCommand};

/// The user cache's checkpoint directory.
pub fn default_dir() -> anyhow::Result<PathBuf> {
    Ok(ds4_models::cache_dir()?.join("checkpoints"))
}

fn dir_of(arg: &CheckpointDirArg) -> anyhow::Result<PathBuf> {
    match &arg.checkpoint_dir {
        Some(d) => Ok(d.clone()),
        None => default_dir(),
    }
}

pub fn sessions(command: SessionsCommand) -> anyhow::Result<()> {
    match command {
        SessionsCommand::List(arg) => {
            let dir = dir_of(&arg)?;
            let files = checkpoint::store::list(&dir)
                .with_context(|| format!("listing checkpoints in {}", dir.display()))?;
            println!("{}", dir.display());
            let mut total = 0;
            for f in &files {
                total += f.bytes;
                let age = f
                    .modified
                    .and_then(|m| SystemTime::now().duration_since(m).ok())
                    .map_or("?".to_string(), |d| format!("{}s", d.as_secs()));
                let name = f.path.file_name().unwrap_or_default().to_string_lossy();
                match &f.header {
                    Ok((id, tokens)) => println!(
                        "{name}  {:>10} bytes  {tokens:>7} tokens  {}  model {}  age {age}",
                        f.bytes, id.family, id.model
                    ),
                    Err(reason) => println!("{name}  {:>10} bytes  invalid: {reason}", f.bytes),
                }
            }
            println!("{} checkpoints, {total} bytes", files.len());
            Ok(())
        }
        SessionsCommand::Clear(arg) => {
            let dir = dir_of(&arg)?;
            let (n, bytes) = checkpoint::store::clear(&dir)
                .with_context(|| format!("clearing checkpoints in {}", dir.display()))?;
            println!("removed {n} files ({bytes} bytes) from {}", dir.display());
            Ok(())
        }
    }
}

/// What a checkpoint must match: the weights file(s), the tokenizer and chat
/// template (in the GGUF, or the directory's tokenizer files), the family
/// and the engine's state format.
pub fn identity(model_path: &Path, family: &str) -> anyhow::Result<Identity> {
    let model = fingerprint_path(model_path)
        .with_context(|| format!("fingerprinting {}", model_path.display()))?;
    let tokenizer = if model_path.is_dir() {
        let mut bytes = Vec::new();
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
        ] {
            if let Ok(b) = std::fs::read(model_path.join(name)) {
                bytes.extend_from_slice(name.as_bytes());
                bytes.extend_from_slice(&b);
            }
        }
        fnv_hex(&bytes)
    } else {
        // A GGUF carries its tokenizer and template: the file fingerprint
        // covers them.
        format!("gguf:{model}")
    };
    Ok(Identity {
        model,
        tokenizer,
        family: family.to_string(),
        state_version: STATE_FORMAT_VERSION,
    })
}

/// The store `run`/`chat` use, when `--checkpoint-dir` was given.
pub struct Checkpoints {
    store: CheckpointStore,
    min_tokens: usize,
}

impl Checkpoints {
    pub fn open<M: Model>(
        args: &CheckpointArgs,
        model_arg: Option<&Path>,
        model: &M,
    ) -> anyhow::Result<Option<Self>> {
        let Some(dir) = &args.checkpoint_dir else {
            return Ok(None);
        };
        let dir = match dir {
            Some(d) => d.clone(),
            None => default_dir()?,
        };
        let path = crate::model_source::resolve(model_arg)?;
        let id = identity(&path, model.descriptor().name)?;
        let budget = args.checkpoint_budget_mib.saturating_mul(1 << 20);
        let store = CheckpointStore::open(&dir, id, budget)
            .with_context(|| format!("opening the checkpoint store {}", dir.display()))?;
        Ok(Some(Self {
            store,
            min_tokens: args.checkpoint_min_tokens,
        }))
    }

    /// The longest saved session that `prompt` extends, or a fresh one.
    pub fn session_for<M: Model>(&mut self, model: &M, prompt: &[u32]) -> LiveSession<M> {
        self.store
            .lookup(model, prompt)
            .unwrap_or_else(|| LiveSession::new(model))
    }

    /// Save `session` after a turn that left it complete and long enough.
    /// A failed save costs only a later cold prefill: it is reported, not
    /// fatal.
    pub fn after_turn<M: Model>(&mut self, session: &LiveSession<M>, state: FinalState) {
        if state != FinalState::Complete || session.tokens().len() < self.min_tokens {
            return;
        }
        if let Err(e) = self.store.save(session) {
            eprintln!("warning: checkpoint not saved: {e}");
        }
    }

    /// Save whatever consistent state the session holds (clean shutdown).
    pub fn on_exit<M: Model>(&mut self, session: &LiveSession<M>) {
        if session.tokens().len() >= self.min_tokens
            && session.is_consistent()
            && let Err(e) = self.store.save(session)
        {
            eprintln!("warning: checkpoint not saved: {e}");
        }
    }
}
