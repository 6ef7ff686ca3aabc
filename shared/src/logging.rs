//! Logging for the binaries: `tracing` to stderr, level from `RUST_LOG` (default info),
//! colours only on a terminal.

use std::io::IsTerminal;

pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // By default a failed write is reported with `eprintln!`, which panics, on a
        // closed stderr (the program reading it ended), whichever task was logging: a job
        // would lose its workers mid-way, and never end.
        .log_internal_errors(false)
        .init();
}
