//! A public reference set: a public table or a rhosynth release in the job's schema,
//! never the job's input, read by the coordinator when it plans. HARMONIC prompts with
//! its rows; DP-2Stage and the sequence model train on it before DP-SGD (stage 1,
//! post-processing of what its own charge paid for).

use sha2::{Digest, Sha256};

use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::table::{Table, load_first, read_release};
use crate::output::Manifest;
use crate::spec::JobSpec;
use crate::storage;

#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    #[error("reference {url}: {source}")]
    Read { url: String, source: DataError },
    #[error("reference {url}: {message}")]
    Invalid { url: String, message: String },
}

/// A reference set as read: its rows, what was read (the URL, the row count and the
/// SHA-256 of the rows as encoded, for the manifest) and, for a rhosynth release, its
/// manifest with the SHA-256 of the manifest's bytes. Whoever plans the job states the
/// guarantee they carry.
pub struct ReferenceTable {
    pub table: Table,
    pub read: String,
    pub manifest: Option<(Manifest, String)>,
}

impl ReferenceTable {
    /// Reads the first `rows` rows of the reference set at `url` (a rhosynth release,
    /// whose manifest lists its parts, or files in the job's input format) in the job's
    /// schema. A release's parts are read from private copies made as they were checked
    /// against the manifest.
    pub async fn load(spec: &JobSpec, domain: &Domain, url: &str, rows: usize) -> Result<Self, ReferenceError> {
        let read = |source: DataError| ReferenceError::Read { url: url.to_string(), source };
        let copies = private_dir().map_err(|e| read(DataError::Read { file: url.into(), message: e.to_string() }))?;
        let release = read_release(url, Some(copies.path()), Some(rows as u64)).await.map_err(read)?;
        let mut table = load_first(spec, domain, &release.parts, rows).await.map_err(read)?;
        drop(copies);
        table.units.truncate(rows);
        table.columns.iter_mut().for_each(|c| c.truncate(rows));
        let mut hash = Sha256::new();
        for r in 0..table.rows() {
            hash.update(table.units[r].as_bytes());
            hash.update([0]);
            table.columns.iter().for_each(|c| hash.update(c[r].map_or(u64::MAX, f64::to_bits).to_le_bytes()));
        }
        let read = format!("{url}, {} rows (SHA-256 of the rows read {:x})", table.rows(), hash.finalize());
        Ok(Self { table, read, manifest: release.manifest })
    }
}

/// Refuses a reference set named through `..` (after a symbolic link it leads elsewhere
/// than it reads) or at, in or around the job's input, held-out files or ledger: it is
/// read as public. Checked on the URLs alone, when the spec is checked, before anything is
/// read (the coordinator's own stores are checked when the job starts).
pub fn check_location(spec: &JobSpec, reference: &str) -> Result<(), String> {
    if reference.split('/').any(|segment| segment == "..") {
        return Err("reference: a location with `..` is refused; name it plainly".into());
    }
    let evaluation = spec.evaluation.iter().flat_map(|e| &e.test_urls);
    let private = spec.input.urls.iter().chain(evaluation).chain(&spec.privacy.ledger);
    match private.into_iter().find(|url| !url.is_empty() && storage::nested(reference, url)) {
        Some(url) => Err(format!("reference overlaps the job's private data or ledger ({url})")),
        None => Ok(()),
    }
}

/// A temporary directory only its owner may enter, whatever the umask.
fn private_dir() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new().prefix("rhosynth-reference-").permissions(std::fs::Permissions::from_mode(0o700)).tempdir()
}
