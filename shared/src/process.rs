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

/// Makes every file and directory this process creates private to its user (0600 / 0700),
/// whatever umask it inherited: scratch partitions, checkpoints, ledgers, diagnostics and
/// kept models hold private rows or their accounting (releases too: share one by copying).
pub fn private_files() {
    // SAFETY: umask only sets this process's file-creation mask; it cannot fail.
    unsafe { libc::umask(0o077) };
}

/// Warns loudly when the local store at `url` (the `what` store) already exists with
/// group or other access: files written before, or by another tool, may be readable by
/// other users of the machine. Object stores are the bucket policy's to protect.
pub fn warn_if_shared(what: &str, url: &str) {
    use std::os::unix::fs::PermissionsExt;
    let (scheme, path) = crate::storage::canonical_url(url);
    let Ok(meta) = std::fs::metadata(&path) else { return };
    let mode = meta.permissions().mode() & 0o777;
    if scheme == "file" && mode & 0o077 != 0 {
        tracing::warn!(
            store = what,
            path,
            mode = format!("{mode:o}"),
            "the {what} store is readable by other users of this machine: `chmod -R go-rwx {path}`"
        );
    }
}
