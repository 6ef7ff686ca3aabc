//! `rhosynth token`: a new submitter bearer token from the OS CSPRNG.

use std::process::ExitCode;

use rhosynth_coordinator::auth::token_sha256;

use super::print_json;

/// Prints a fresh token (for the submitter, once) and its SHA-256 (for `submitters.toml`).
pub fn run() -> anyhow::Result<ExitCode> {
    let bytes: [u8; 32] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    say!("give the token to the submitter; put only token_sha256 in the coordinator's submitters file");
    print_json(&serde_json::json!({ "token": token, "token_sha256": token_sha256(&token) }));
    Ok(ExitCode::SUCCESS)
}
