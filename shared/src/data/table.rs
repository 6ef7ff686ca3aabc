//! Tables read whole, in the job's schema: the rows the evaluation, the audit and a
//! generator's reference set read (never the partitioned private input of a job's rounds),
//! and a table read back from a rhosynth release, its parts checked against the manifest.

use std::borrow::Cow;

use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};

use super::DataError;
use super::domain::Domain;
use super::input::InputReader;
use crate::output::{DATABASE_MANIFEST_FORMAT, LEGACY_MANIFEST_FORMAT, MANIFEST, MANIFEST_FORMAT, Manifest, PartInfo};
use crate::spec::JobSpec;
use crate::storage;

/// A table read whole: per row its unit and its encoded values (the evaluation's, the
/// audit's and a reference set's).
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub units: Vec<String>,
    /// `columns[d][row]`: category code or clamped number; `None` = missing.
    pub columns: Vec<Vec<Option<f64>>>,
}

impl Table {
    pub fn rows(&self) -> usize {
        self.units.len()
    }

    /// The rows at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Table {
        Table {
            units: indices.iter().map(|&r| self.units[r].clone()).collect(),
            columns: self.columns.iter().map(|c| indices.iter().map(|&r| c[r]).collect()).collect(),
        }
    }

    /// The rows at `indices` (increasing), borrowing the whole table when they are all of it.
    pub fn subset(&self, indices: &[usize]) -> Cow<'_, Table> {
        if indices.len() == self.rows() { Cow::Borrowed(self) } else { Cow::Owned(self.select(indices)) }
    }
}

/// Reads `urls` with the spec's schema (CSV dialect for CSV files).
pub async fn load(spec: &JobSpec, domain: &Domain, urls: &[String]) -> Result<Table, DataError> {
    load_first(spec, domain, urls, usize::MAX).await
}

/// The first `rows` rows (or a few more: whole batches) of the files at `urls`.
pub async fn load_first(spec: &JobSpec, domain: &Domain, urls: &[String], rows: usize) -> Result<Table, DataError> {
    let input = spec.input.of_files(urls);
    let mut table = Table { units: Vec::new(), columns: vec![Vec::new(); domain.columns.len()] };
    let mut reader = InputReader::new(&input, &spec.schema, domain);
    while table.rows() < rows
        && let Some(batch) = reader.next_batch().await?
    {
        table.units.extend(batch.units);
        for (column, values) in table.columns.iter_mut().zip(batch.values) {
            column.extend(values);
        }
    }
    Ok(table)
}

/// The files of the table at `url`: a rhosynth release (its manifest lists the parts and
/// states the guarantee) or a single file.
pub async fn release_parts(url: &str) -> Result<(Vec<String>, Option<Manifest>), DataError> {
    let release = read_release(url, None, None).await?;
    Ok((release.parts, release.manifest.map(|(manifest, _)| manifest)))
}

/// A table read back: its files, and for a rhosynth release its manifest with the
/// SHA-256 of the manifest's bytes (what the ledger records when it is released).
pub struct ReadRelease {
    pub parts: Vec<String>,
    pub manifest: Option<(Manifest, String)>,
}

/// Reads the table at `url` as [`release_parts`] does. With `copy_to`, a release's parts
/// are copied there as they are hashed and named by their copies, so what is read later is
/// what was checked (a part changed between the check and the read is never read). With
/// `rows`, only the first parts that hold that many rows (by the manifest) are read.
pub async fn read_release(
    url: &str,
    copy_to: Option<&std::path::Path>,
    rows: Option<u64>,
) -> Result<ReadRelease, DataError> {
    let read = |message: String| DataError::Read { file: url.to_string(), message };
    let Some((location, manifest, manifest_sha256)) = read_manifest(url).await? else {
        return Ok(ReadRelease { parts: vec![url.to_string()], manifest: None });
    };
    if !manifest.tables.is_empty() || manifest.format == DATABASE_MANIFEST_FORMAT {
        let names: Vec<&str> = manifest.tables.iter().map(|t| t.name.as_str()).collect();
        return Err(read(format!("a database's release, not one table (its tables: {})", names.join(", "))));
    }
    if ![MANIFEST_FORMAT, LEGACY_MANIFEST_FORMAT].contains(&manifest.format.as_str()) {
        return Err(read(format!("{MANIFEST} has format {:?}, not {MANIFEST_FORMAT}", manifest.format)));
    }
    let parts = checked_parts(url, &location, &manifest.parts, copy_to, rows).await?;
    Ok(ReadRelease { parts, manifest: Some((manifest, manifest_sha256)) })
}

/// A database's release read back: its manifest, and each table's files (checked as
/// [`read_release`] checks a table's), in the manifest's order.
pub async fn read_database_release(url: &str) -> Result<(Manifest, Vec<(String, Vec<String>)>), DataError> {
    let read = |message: String| DataError::Read { file: url.to_string(), message };
    let Some((location, manifest, _)) = read_manifest(url).await? else {
        return Err(read(format!("no {MANIFEST}: not a rhosynth release")));
    };
    if manifest.format != DATABASE_MANIFEST_FORMAT {
        return Err(read(format!("{MANIFEST} has format {:?}, not {DATABASE_MANIFEST_FORMAT}", manifest.format)));
    }
    let mut tables = Vec::with_capacity(manifest.tables.len());
    for table in &manifest.tables {
        tables.push((table.name.clone(), checked_parts(url, &location, &table.parts, None, None).await?));
    }
    Ok((manifest, tables))
}

/// The manifest of the release at `url` (with the SHA-256 of its bytes), or `None` for a
/// single file or a prefix without one.
async fn read_manifest(url: &str) -> Result<Option<(storage::StoreLocation, Manifest, String)>, DataError> {
    if std::path::Path::new(url.trim_start_matches("file://")).is_file() {
        return Ok(None);
    }
    let read = |message: String| DataError::Read { file: url.to_string(), message };
    let location = storage::open_existing_prefix(url).map_err(|e| read(e.to_string()))?;
    let bytes = match location.store.get(&location.child(MANIFEST)).await {
        Ok(got) => got.bytes().await.map_err(|e| read(e.to_string()))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(read(e.to_string())),
    };
    let manifest_sha256 = format!("{:x}", Sha256::digest(&bytes));
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| read(format!("{MANIFEST}: {e}")))?;
    Ok(Some((location, manifest, manifest_sha256)))
}

/// The files of a release's `listed` parts, each checked to be the part released. With
/// `copy_to`, copied there as they are hashed and named by their copies; with `rows`, only
/// the first parts that hold that many rows.
async fn checked_parts(
    url: &str,
    location: &storage::StoreLocation,
    listed: &[PartInfo],
    copy_to: Option<&std::path::Path>,
    rows: Option<u64>,
) -> Result<Vec<String>, DataError> {
    let read = |message: String| DataError::Read { file: url.to_string(), message };
    let base = url.trim_end_matches('/');
    // A manifest names files inside its own prefix by plain relative paths, never
    // elsewhere (`..`, a root, a scheme).
    let plain = |path: &str| path.split('/').all(|s| !matches!(s, "" | "." | "..") && !s.contains(':'));
    if let Some(outside) = listed.iter().find(|p| !plain(&p.path)) {
        return Err(read(format!("{MANIFEST} names a part outside the release: {}", outside.path)));
    }
    // Each part is the one released: its bytes hash to the manifest's SHA-256, so a part
    // changed after the release (say, to rows of a private input) is refused. Streamed;
    // the message names the part only (its bytes may not be public).
    let mut parts = Vec::with_capacity(listed.len());
    let mut held = 0;
    for part in listed {
        if rows.is_some_and(|rows| held >= rows) {
            break;
        }
        held += part.rows;
        let got = location.store.get(&location.child(&part.path)).await.map_err(|e| read(e.to_string()))?;
        let mut copy = match copy_to {
            Some(dir) => {
                let path = dir.join(&part.path);
                let create = async {
                    tokio::fs::create_dir_all(path.parent().unwrap_or(dir)).await?;
                    tokio::fs::File::create(&path).await
                };
                let file = create.await.map_err(|e| read(format!("copying part {}: {e}", part.path)))?;
                Some((path, file))
            }
            None => None,
        };
        let mut stream = got.into_stream();
        let mut hash = Sha256::new();
        while let Some(chunk) = stream.try_next().await.map_err(|e| read(e.to_string()))? {
            hash.update(&chunk);
            if let Some((_, file)) = &mut copy {
                use tokio::io::AsyncWriteExt;
                file.write_all(&chunk).await.map_err(|e| read(format!("copying part {}: {e}", part.path)))?;
            }
        }
        if format!("{:x}", hash.finalize()) != part.sha256 {
            return Err(read(format!("part {} is not the part released (its SHA-256 differs)", part.path)));
        }
        parts.push(match copy {
            Some((path, mut file)) => {
                use tokio::io::AsyncWriteExt;
                file.flush().await.map_err(|e| read(format!("copying part {}: {e}", part.path)))?;
                path.display().to_string()
            }
            None => format!("{base}/{}", part.path),
        });
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release's manifest names files inside its prefix only: a part path that climbs
    /// out of it (toward, say, a private input) is refused, and one inside is read.
    #[tokio::test]
    async fn a_manifest_part_outside_its_release_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let release = dir.path().join("release");
        std::fs::create_dir_all(&release).unwrap();
        let manifest = |part: &str| {
            serde_json::json!({
                "format": MANIFEST_FORMAT, "rhosynth_version": "0", "job_id": "j", "generator": "marginals",
                "created_at": "2026-11-24T00:00:00Z", "rows": 1, "columns": [],
                "parts": [{"path": part, "rows": 1, "bytes": 0, "sha256": format!("{:x}", Sha256::digest(b""))}],
                "privacy": {"epsilon": 1.0, "delta": 0.0, "accountant": "rdp", "mechanisms": [], "dataset_id": "d",
                            "ledger_url": "l", "ledger_entry": 0, "public_inputs": []}
            })
            .to_string()
        };
        let url = release.to_str().unwrap();
        for part in ["../input.csv", "sub/../../input.csv", "/srv/input.csv", "s3://private/input.csv"] {
            std::fs::write(release.join(MANIFEST), manifest(part)).unwrap();
            let err = release_parts(url).await.unwrap_err().to_string();
            assert!(err.contains("outside the release"), "{part}: {err}");
        }
        std::fs::write(release.join(MANIFEST), manifest("part-00000.parquet")).unwrap();
        std::fs::write(release.join("part-00000.parquet"), "").unwrap();
        let (parts, read) = release_parts(url).await.unwrap();
        assert_eq!(parts, [format!("{url}/part-00000.parquet")]);
        assert_eq!(read.unwrap().job_id, "j");
    }

    /// A part whose bytes are not the ones released (changed, or swapped for another file)
    /// is refused, naming the part; the part as released is read, from the copy checked
    /// when copies are asked for.
    #[tokio::test]
    async fn a_part_changed_after_its_release_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let release = dir.path().join("release");
        std::fs::create_dir_all(&release).unwrap();
        let released = b"a,b\n1,2\n";
        let manifest = serde_json::json!({
            "format": MANIFEST_FORMAT, "rhosynth_version": "0", "job_id": "j", "generator": "marginals",
            "created_at": "2026-11-24T00:00:00Z", "rows": 1, "columns": [],
            "parts": [{"path": "part-00000.csv", "rows": 1, "bytes": released.len(),
                       "sha256": format!("{:x}", Sha256::digest(released))}],
            "privacy": {"epsilon": 1.0, "delta": 0.0, "accountant": "rdp", "mechanisms": [], "dataset_id": "d",
                        "ledger_url": "l", "ledger_entry": 0, "public_inputs": []}
        });
        std::fs::write(release.join(MANIFEST), manifest.to_string()).unwrap();
        let url = release.to_str().unwrap();
        std::fs::write(release.join("part-00000.csv"), released).unwrap();
        release_parts(url).await.unwrap();
        // Read with copies: what is read later is the copy checked, whatever happens to the
        // release after the check; the manifest's own SHA-256 comes with it.
        let copies = tempfile::tempdir().unwrap();
        let read = read_release(url, Some(copies.path()), None).await.unwrap();
        let (_, manifest_sha256) = read.manifest.unwrap();
        let manifest_bytes = std::fs::read(release.join(MANIFEST)).unwrap();
        assert_eq!(manifest_sha256, format!("{:x}", Sha256::digest(&manifest_bytes)));
        std::fs::write(release.join("part-00000.csv"), b"a,b\n1,3\n").unwrap();
        assert_eq!(read.parts, [copies.path().join("part-00000.csv").display().to_string()]);
        assert_eq!(std::fs::read(&read.parts[0]).unwrap(), released);
        let err = release_parts(url).await.unwrap_err().to_string();
        assert!(err.contains("part-00000.csv is not the part released"), "{err}");
    }
}
