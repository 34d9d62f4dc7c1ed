//! `ds4server sessions list|clear`, and the session cache settings `run`,
//! `chat` and `serve` share (`--bank-budget-mib`, `--checkpoint-dir`, ...).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context;
use ds4_engine::Model;
use ds4_engine::state::checkpoint;
use ds4_engine::state::warm::{CheckpointConfig, SessionCache};

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

/// The session cache settings of `run`, `chat` and `serve`: the bank's
/// memory budget and, with `--checkpoint-dir`, the store.
pub struct CacheSettings {
    pub bank_budget: usize,
    pub boundary_every: usize,
    pub checkpoints: Option<CheckpointConfig>,
}

impl CacheSettings {
    pub fn from_args(args: &CheckpointArgs, model_path: &Path) -> anyhow::Result<Self> {
        let checkpoints = match &args.checkpoint_dir {
            None => None,
            Some(dir) => Some(CheckpointConfig {
                dir: match dir {
                    Some(d) => d.clone(),
                    None => default_dir()?,
                },
                model_path: model_path.to_path_buf(),
                budget: args.checkpoint_budget_mib.saturating_mul(1 << 20),
                min_tokens: args.checkpoint_min_tokens,
            }),
        };
        Ok(Self {
            bank_budget: args.bank_budget_mib.saturating_mul(1 << 20),
            boundary_every: args.boundary_every,
            checkpoints,
        })
    }

    /// Open the cache for `model` (the store's index is rebuilt from its
    /// files).
    pub fn open<M: Model>(&self, model: &M) -> anyhow::Result<SessionCache<M>> {
        Ok(
            SessionCache::open(model, self.bank_budget, self.checkpoints.as_ref())?
                .with_boundary_every(self.boundary_every),
        )
    }
}
