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

/// Prints the command's result: one JSON object on the last line of stdout. A reader that
/// has gone (a closed pipe) is no reason to fail; any other error is, as with `println!`.
pub fn print_json(value: &serde_json::Value) {
    if let Err(e) = writeln!(std::io::stdout(), "{value}")
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        panic!("writing the command's answer to stdout: {e}");
    }
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
