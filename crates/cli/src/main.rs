//! The `ds4server` binary.

mod args;
mod commands;
mod model_source;
mod prompt;
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
    if let Command::Bench(args) = &cli.command
        && let Some(threads) = args.threads
    {
        // candle sizes its thread pool from RAYON_NUM_THREADS on first use.
        // SAFETY: no other thread exists yet (the pool starts lazily later).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string()) };
    }
    if let Command::Imatrix(args) = &cli.command
        && let Some(threads) = args.threads
    {
        // As for bench: before the pool starts.
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.max(1).to_string()) };
    }
    let outcome = match cli.command {
        Command::Serve(args) => commands::serve::serve(args),
        Command::Run(args) => commands::run::run(args),
        Command::Chat(args) => commands::chat::chat(args),
        Command::Inspect(args) => commands::inspect::inspect(args),
        Command::Pull => commands::pull::pull(),
        Command::Quantize(args) => commands::quantize::quantize(args),
        Command::QuantizeReport(args) => commands::quantize_report::quantize_report(args),
        Command::Imatrix(args) => commands::imatrix_run::imatrix(args),
        Command::Bench(args) => commands::bench::bench(args),
        Command::Debug(command) => commands::debug::debug(command),
        Command::Sessions(command) => commands::sessions::sessions(command),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
