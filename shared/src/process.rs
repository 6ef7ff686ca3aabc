//! What every rhosynth process checks before it reads its arguments.

/// The prefix of the environment variables the project read before it was renamed.
const LEGACY_PREFIX: &str = "DPSYNTH_";

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(
        "{variables} set: rhosynth reads RHOSYNTH_* since the project was renamed, and would ignore {them}. \
         Rename {them} (e.g. {example} → RHOSYNTH_{rest})."
    )]
    LegacyEnvironment { variables: String, them: &'static str, example: String, rest: String },
}

/// Refuses to start while an environment variable of the former name is set: ignoring
/// `DPSYNTH_LEDGER`, say, would run against another ledger than the operator meant.
pub fn refuse_legacy_environment() -> Result<(), ProcessError> {
    let mut legacy: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with(LEGACY_PREFIX))
        .collect();
    legacy.sort();
    let Some(example) = legacy.first().cloned() else { return Ok(()) };
    Err(ProcessError::LegacyEnvironment {
        them: if legacy.len() == 1 { "it" } else { "them" },
        rest: example[LEGACY_PREFIX.len()..].to_string(),
        variables: legacy.join(", "),
        example,
    })
}
