//! The `mmmq` binary: flags in, tracing on, then hand over to the command (`cmd`), which hands
//! over to the library.

mod cmd;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc rather than glibc's malloc: its per-thread free lists take no lock on the small,
/// short-lived buffers of a broker's requests (docs/benchmarks.md, "A cluster"). Built without
/// transparent huge pages: with them a burst of requests left ~30 MiB of 2 MiB pages resident
/// after it was freed, memory a broker that keeps its backlog on disk should give back.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

fn main() -> ExitCode {
    let cli = cmd::Cli::parse();
    init_tracing();
    match cmd::run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mmmq: {e:#}");
            ExitCode::FAILURE
        }
    }
}
