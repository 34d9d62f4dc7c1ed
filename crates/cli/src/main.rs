//! The `ds4server` binary.

mod args;
mod commands;
mod model_source;
mod prompt;
mod text_output;
mod turn_runner;

use clap::Parser;

use args::{Cli, Command};

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DS4SERVER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::chat(args),
        Command::Inspect(args) => commands::inspect::inspect(args),
        Command::Pull => commands::pull::pull(),
        Command::Debug(command) => commands::debug::debug(command),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
