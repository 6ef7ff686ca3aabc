//! One module per command group.

use std::io::Write;

pub mod audit;
pub mod client;
pub mod eval;
pub mod job;
pub mod ledger;
pub mod privacy;
pub mod schema;
pub mod token;
pub mod validate;

/// Exit status when the privacy ledger refuses a job (its budget would be exceeded).
pub const EXIT_BUDGET_REFUSED: u8 = 3;
/// Exit status when an audit's ε lower bound exceeds the claimed ε.
pub const EXIT_AUDIT_FAILED: u8 = 4;

/// Prints the command's result: one JSON object on the last line of stdout.
pub fn print_json(value: &serde_json::Value) {
    // A reader that has gone (the program that started this one ended) is no reason to
    // fail, nor, for `note`, to stop a job mid-way.
    let _ = writeln!(std::io::stdout(), "{value}");
}

/// Writes a line to stderr, as `eprintln!` does, but never fails (see `print_json`).
pub fn note(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Resolves on SIGTERM (how Kubernetes stops a pod) or Ctrl-C.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
