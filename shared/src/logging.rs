//! Logging for the binaries: `tracing` to stderr, level from `RUST_LOG` (default info),
//! colours only on a terminal.

use std::io::IsTerminal;

pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
