//! Synthetic output: Parquet parts under an object-store prefix, then `_manifest.json`
//! written last with create-if-absent. Readers must treat a prefix without a manifest as
//! incomplete; a failed job never writes one.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, Utc};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::accounting::accountant::Accountant;
use crate::accounting::mechanism::Mechanism;
use crate::spec::{ColumnKind, ColumnSpec, JobSpec, ParentSpec};
use crate::storage::StoreLocation;

/// A synthetic value of one column.
#[derive(Clone, Debug, PartialEq)]
pub enum SyntheticValue {
    Missing,
    Category(String),
    Integer(i64),
    Real(f64),
    /// Seconds since the Unix epoch.
    Datetime(i64),
}

impl SyntheticValue {
    /// A numeric column's value: integers rounded, datetimes floored to the second.
    pub fn numeric(kind: ColumnKind, v: f64) -> Self {
        match kind {
            ColumnKind::Integer => SyntheticValue::Integer(v.round() as i64),
            ColumnKind::Datetime => SyntheticValue::Datetime(v.floor() as i64),
            _ => SyntheticValue::Real(v),
        }
    }
}

/// Synthetic rows grouped by the synthetic unit they belong to: one row each for a
/// generator of rows, a whole history each for a generator of histories.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SyntheticUnits {
    /// `rows[i][d]` is row i's value of domain column d.
    pub rows: Vec<Vec<SyntheticValue>>,
    /// Unit u's rows are `rows[ends[u - 1]..ends[u]]` (from 0 for the first).
    pub ends: Vec<usize>,
}

impl SyntheticUnits {
    /// Each row its own unit.
    pub fn one_row_each(rows: Vec<Vec<SyntheticValue>>) -> Self {
        Self { ends: (1..=rows.len()).collect(), rows }
    }

    /// Adds a unit with these rows.
    pub fn push(&mut self, rows: impl IntoIterator<Item = Vec<SyntheticValue>>) {
        self.rows.extend(rows);
        self.ends.push(self.rows.len());
    }

    pub fn units(&self) -> usize {
        self.ends.len()
    }
}

pub const MANIFEST: &str = "_manifest.json";
pub const MANIFEST_FORMAT: &str = "rhosynth.manifest.v1";
/// A database's manifest: its tables each list their parts, and the top-level `parts` is
/// empty, so a reader of one table's manifests must not take it for an empty table.
pub const DATABASE_MANIFEST_FORMAT: &str = "rhosynth.database-manifest.v1";
/// The same format as written before the project was renamed: read, never written.
pub const LEGACY_MANIFEST_FORMAT: &str = "dpsynth.manifest.v1";

/// The marker a job holds on its output prefix from before its admission until its
/// manifest is written (or its failure): one job writes one prefix.
pub const CLAIM: &str = "_claim.json";

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("output {url} already holds a complete dataset ({MANIFEST} exists); choose another output")]
    AlreadyComplete { url: String },
    #[error(
        "output {url} is being written by job {job_id} ({CLAIM} exists); choose another output, or remove {CLAIM} \
         once that job has ended"
    )]
    Claimed { url: String, job_id: String },
    #[error("output {url} cannot be written: {message}")]
    Unwritable { url: String, message: String },
    #[error("writing output {url}: {message}")]
    Write { url: String, message: String },
}

impl OutputError {
    /// The cause is the store's state (a manifest, a claim, a refused write of the claim),
    /// never the data: a submitter may be told it.
    pub fn is_public(&self) -> bool {
        !matches!(self, OutputError::Write { .. })
    }
}

/// What a claim records.
#[derive(Serialize, Deserialize)]
struct Claim {
    job_id: String,
    claimed_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartInfo {
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestColumn {
    pub name: String,
    pub data_type: String,
}

/// The formal guarantee of the data, for auditors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestPrivacy {
    pub epsilon: f64,
    pub delta: f64,
    pub accountant: Accountant,
    pub mechanisms: Vec<Mechanism>,
    pub dataset_id: String,
    pub ledger_url: String,
    /// Sequence number of this job's charge in the ledger.
    pub ledger_entry: u64,
    /// Inputs the job declared public (bounds, categories, bins, sizes).
    pub public_inputs: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    /// `dpsynth_version` in manifests written before the rename (read, never written).
    #[serde(alias = "dpsynth_version")]
    pub rhosynth_version: String,
    pub job_id: String,
    pub generator: String,
    pub created_at: DateTime<Utc>,
    /// Where the release was written (its prefix, placeholders filled): set when sealed.
    /// Absent from manifests written before 2026-11-29.
    #[serde(default)]
    pub output_url: String,
    /// Rows of the release: of its one table, or of all a database's tables.
    pub rows: u64,
    /// The one table's columns and parts; empty in a database's release, whose `tables`
    /// list their own.
    pub columns: Vec<ManifestColumn>,
    pub parts: Vec<PartInfo>,
    /// A database's tables, the root first: each its own Parquet dataset under the
    /// prefix (`<name>/part-*.parquet`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<ManifestTable>,
    pub privacy: ManifestPrivacy,
}

/// One table of a database's release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestTable {
    pub name: String,
    /// The column holding its rows' own keys (fresh synthetic ids), if any; the root's is
    /// the unit's key.
    pub key: Option<String>,
    /// Its parent table and the column holding the parent row's key (`None`: the root).
    pub parent: Option<ParentSpec>,
    pub rows: u64,
    pub columns: Vec<ManifestColumn>,
    pub parts: Vec<PartInfo>,
}

/// Arrow schema of synthetic rows of `columns`, names unchanged.
pub fn schema_of(columns: &[ColumnSpec]) -> SchemaRef {
    let fields: Vec<Field> = columns
        .iter()
        .map(|c| {
            let data_type = match c.kind {
                ColumnKind::Categorical | ColumnKind::Identifier => DataType::Utf8,
                ColumnKind::Integer => DataType::Int64,
                ColumnKind::Continuous => DataType::Float64,
                // Parquet has no seconds unit (arrow would store bare integers): the values
                // are whole seconds, written as milliseconds.
                ColumnKind::Datetime => DataType::Timestamp(TimeUnit::Millisecond, None),
            };
            Field::new(&c.name, data_type, true)
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// The columns' descriptions in a manifest.
pub fn manifest_columns(columns: &[ColumnSpec]) -> Vec<ManifestColumn> {
    let schema = schema_of(columns);
    schema
        .fields()
        .iter()
        .map(|f| ManifestColumn { name: f.name().clone(), data_type: f.data_type().to_string() })
        .collect()
}

/// Builds a batch of synthetic rows. Identifier columns get fresh synthetic ids
/// `syn-<n>`, one per synthetic unit, numbered from `first_id`.
pub fn rows_to_batch(spec: &JobSpec, units: &SyntheticUnits, first_id: u64) -> RecordBatch {
    let mut unit_of_row = Vec::with_capacity(units.rows.len());
    for (u, end) in units.ends.iter().enumerate() {
        unit_of_row.resize(*end, first_id + u as u64);
    }
    let ids = |_: &str, row: usize| Some(format!("syn-{}", unit_of_row[row]));
    columns_to_batch(&spec.schema.columns, &units.rows, ids)
}

/// Builds a batch of synthetic rows of `columns`: `rows[i]` holds row i's values of the
/// columns that are not identifiers, in order; an identifier column's value in row i is
/// `ids(column, i)`.
pub fn columns_to_batch(
    columns: &[ColumnSpec],
    rows: &[Vec<SyntheticValue>],
    ids: impl Fn(&str, usize) -> Option<String>,
) -> RecordBatch {
    let mut domain_index = 0;
    let arrays: Vec<ArrayRef> = columns
        .iter()
        .map(|c| -> ArrayRef {
            if c.kind == ColumnKind::Identifier {
                return Arc::new(StringArray::from_iter((0..rows.len()).map(|i| ids(&c.name, i))));
            }
            let d = domain_index;
            domain_index += 1;
            let values = rows.iter().map(|r| &r[d]);
            match c.kind {
                ColumnKind::Categorical => Arc::new(StringArray::from_iter(values.map(|v| match v {
                    SyntheticValue::Category(s) => Some(s.as_str()),
                    _ => None,
                }))),
                ColumnKind::Integer => Arc::new(Int64Array::from_iter(values.map(|v| match v {
                    SyntheticValue::Integer(x) => Some(*x),
                    _ => None,
                }))),
                ColumnKind::Continuous => Arc::new(Float64Array::from_iter(values.map(|v| match v {
                    SyntheticValue::Real(x) => Some(*x),
                    _ => None,
                }))),
                ColumnKind::Datetime => Arc::new(TimestampMillisecondArray::from_iter(values.map(|v| match v {
                    SyntheticValue::Datetime(x) => Some(x.saturating_mul(1000)),
                    _ => None,
                }))),
                ColumnKind::Identifier => unreachable!(),
            }
        })
        .collect();
    RecordBatch::try_new(schema_of(columns), arrays).expect("columns match the output schema")
}

/// Writes parts, then the manifest.
pub struct OutputWriter {
    location: StoreLocation,
    parts: Vec<PartInfo>,
    /// A database's parts, by table in the order first written.
    tables: Vec<(String, Vec<PartInfo>)>,
    claim: OutputClaim,
}

/// A job's claim on its output prefix, as written, and the parts written under it.
#[derive(Clone)]
pub struct OutputClaim {
    location: StoreLocation,
    bytes: Vec<u8>,
    written: Arc<std::sync::Mutex<Vec<String>>>,
}

impl OutputClaim {
    /// Whether the prefix's claim is still this one (an operator may have removed a stale
    /// claim, and another job taken the prefix since).
    async fn held(&self) -> bool {
        let held = async { self.location.store.get(&self.location.child(CLAIM)).await?.bytes().await }.await;
        held.is_ok_and(|held| held == self.bytes)
    }

    /// Deletes the claim if it is still this one.
    async fn release(&self) {
        if self.held().await
            && let Err(e) = self.location.store.delete(&self.location.child(CLAIM)).await
        {
            tracing::warn!(url = self.location.url, error = %e, "an output claim could not be deleted");
        }
    }

    /// For a failed job: deletes the parts it wrote, then its claim if the claim is still
    /// its own, so no partial output stays and the prefix is free again. A part that cannot
    /// be deleted keeps the claim.
    pub async fn abandon(&self) {
        let written = self.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for part in written {
            if let Err(e) = self.location.store.delete(&self.location.child(&part)).await {
                return tracing::warn!(part, error = %e, "a failed job's part stays, and its claim");
            }
        }
        self.release().await;
    }
}

impl OutputWriter {
    /// Claims the output prefix for `job_id` (create-if-absent), refusing one that holds a
    /// complete dataset or another job's claim; a claim of the same job id (a run resumed
    /// after its coordinator died) is taken over. The caller
    /// [`abandon`](OutputClaim::abandon)s the claim if the job fails.
    pub async fn create(location: StoreLocation, job_id: &str) -> Result<Self, OutputError> {
        let url = location.url.clone();
        let unwritable = |e: object_store::Error| OutputError::Unwritable { url: url.clone(), message: e.to_string() };
        let complete = async || match location.store.head(&location.child(MANIFEST)).await {
            Ok(_) => Err(OutputError::AlreadyComplete { url: url.clone() }),
            Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(unwritable(e)),
        };
        complete().await?;
        let claim = serde_json::to_vec(&Claim { job_id: job_id.to_string(), claimed_at: Utc::now() })
            .expect("a claim serialises");
        let path = location.child(CLAIM);
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match location.store.put_opts(&path, PutPayload::from(claim.clone()), options).await {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                let held = location.store.get(&path).await.map_err(unwritable)?.bytes().await.map_err(unwritable)?;
                match serde_json::from_slice::<Claim>(&held) {
                    // The same job, resumed after its coordinator died: only one copy can
                    // claim the release in the ledger, and parts follow that claim.
                    Ok(held) if held.job_id == job_id => {
                        location.store.put(&path, PutPayload::from(claim.clone())).await.map_err(unwritable)?;
                    }
                    held => {
                        let job_id = held.map_or_else(|_| "unknown (an unreadable claim)".into(), |c| c.job_id);
                        return Err(OutputError::Claimed { url, job_id });
                    }
                }
            }
            Err(e) => return Err(unwritable(e)),
        }
        let claim = OutputClaim { location: location.clone(), bytes: claim, written: Arc::default() };
        // A job that finished between the first look and the claim.
        if let Err(e) = complete().await {
            claim.release().await;
            return Err(e);
        }
        Ok(Self { location, parts: Vec::new(), tables: Vec::new(), claim })
    }

    /// The claim this writer holds, for its job to [`abandon`](OutputClaim::abandon) if
    /// the job fails after the writer has moved on.
    pub fn claim(&self) -> OutputClaim {
        self.claim.clone()
    }

    /// The output prefix, as given.
    pub fn url(&self) -> &str {
        &self.location.url
    }

    fn err(&self, e: impl std::fmt::Display) -> OutputError {
        OutputError::Write { url: self.location.url.clone(), message: e.to_string() }
    }

    /// Writes one part of the release's one table (encoded in memory: a part is bounded
    /// by `rows_per_part`).
    pub async fn write_part(&mut self, batch: &RecordBatch) -> Result<(), OutputError> {
        let name = format!("part-{:05}.parquet", self.parts.len());
        let info = self.put(name, batch).await?;
        self.parts.push(info);
        Ok(())
    }

    /// Writes one part of a database's table `table`, under `<table>/`.
    pub async fn write_table_part(&mut self, table: &str, batch: &RecordBatch) -> Result<(), OutputError> {
        let at = match self.tables.iter().position(|(name, _)| name == table) {
            Some(at) => at,
            None => {
                self.tables.push((table.to_string(), Vec::new()));
                self.tables.len() - 1
            }
        };
        let name = format!("{table}/part-{:05}.parquet", self.tables[at].1.len());
        let info = self.put(name, batch).await?;
        self.tables[at].1.push(info);
        Ok(())
    }

    /// Encodes `batch` as Parquet and stores it at `name` under the prefix.
    async fn put(&mut self, name: String, batch: &RecordBatch) -> Result<PartInfo, OutputError> {
        let mut bytes = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), None).map_err(|e| self.err(e))?;
        writer.write(batch).map_err(|e| self.err(e))?;
        writer.close().map_err(|e| self.err(e))?;
        let info = PartInfo {
            path: name.clone(),
            rows: batch.num_rows() as u64,
            bytes: bytes.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&bytes)),
        };
        self.claim.written.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(name.clone());
        self.location.store.put(&self.location.child(&name), PutPayload::from(bytes)).await.map_err(|e| self.err(e))?;
        Ok(info)
    }

    /// The URLs of the parts written so far.
    pub fn part_urls(&self) -> Vec<String> {
        let base = self.location.url.trim_end_matches('/');
        self.parts.iter().map(|p| format!("{base}/{}", p.path)).collect()
    }

    /// The manifest of the parts written, as it will be stored: its SHA-256 is recorded in
    /// the ledger before it is written, so the release read back is known to be this one.
    /// A database's manifest names its tables (`manifest.tables`); each gets the parts
    /// written under its name, and every part written must belong to one of them.
    pub fn seal(&self, mut manifest: Manifest) -> Result<Sealed, OutputError> {
        manifest.output_url = self.location.url.clone();
        manifest.parts = self.parts.clone();
        if !manifest.tables.is_empty() {
            manifest.format = DATABASE_MANIFEST_FORMAT.to_string();
        }
        for table in &mut manifest.tables {
            table.parts =
                self.tables.iter().find(|(name, _)| *name == table.name).map(|(_, p)| p.clone()).unwrap_or_default();
            table.rows = table.parts.iter().map(|p| p.rows).sum();
        }
        if let Some((name, _)) = self.tables.iter().find(|(name, _)| !manifest.tables.iter().any(|t| t.name == *name)) {
            return Err(self.err(format!("parts of table {name}, which the manifest does not name")));
        }
        manifest.rows =
            self.parts.iter().map(|p| p.rows).sum::<u64>() + manifest.tables.iter().map(|t| t.rows).sum::<u64>();
        let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| self.err(e))?;
        let sha256 = format!("{:x}", Sha256::digest(&bytes));
        Ok(Sealed { manifest, bytes, sha256 })
    }

    /// Writes the sealed manifest (create-if-absent), then drops the claim: from here on the
    /// output is complete.
    pub async fn finish(self, sealed: Sealed) -> Result<Manifest, OutputError> {
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        let path: Path = self.location.child(MANIFEST);
        match self.location.store.put_opts(&path, PutPayload::from(sealed.bytes), options).await {
            Ok(_) => {
                // The manifest replaces the claim: the prefix is complete.
                self.claim.release().await;
                Ok(sealed.manifest)
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                Err(OutputError::AlreadyComplete { url: self.location.url.clone() })
            }
            Err(e) => Err(self.err(e)),
        }
    }
}

/// A manifest serialised as it will be written, with the SHA-256 of those bytes.
pub struct Sealed {
    manifest: Manifest,
    bytes: Vec<u8>,
    pub sha256: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage;

    fn manifest() -> Manifest {
        let privacy = ManifestPrivacy {
            epsilon: 1.0,
            delta: 0.0,
            accountant: Accountant::Rdp,
            mechanisms: Vec::new(),
            dataset_id: "d".into(),
            ledger_url: "l".into(),
            ledger_entry: 1,
            public_inputs: Vec::new(),
        };
        Manifest {
            format: MANIFEST_FORMAT.into(),
            rhosynth_version: "test".into(),
            job_id: "a".into(),
            generator: "marginals".into(),
            created_at: Utc::now(),
            output_url: String::new(),
            rows: 0,
            columns: Vec::new(),
            parts: Vec::new(),
            tables: Vec::new(),
            privacy,
        }
    }

    /// A datetime column is a Parquet timestamp that other readers (pandas, DuckDB, Spark)
    /// read as a timestamp, at the instant the values name, with missing values missing.
    #[tokio::test]
    async fn datetimes_are_written_as_parquet_timestamps() {
        use parquet::basic::{LogicalType, TimeUnit as ParquetUnit};
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let column: ColumnSpec = toml::from_str("name = \"t\"\nkind = \"datetime\"").unwrap();
        let instant = 1_700_000_123;
        let rows = vec![vec![SyntheticValue::Datetime(instant)], vec![SyntheticValue::Missing]];
        let batch = columns_to_batch(&[column], &rows, |_, _| None);
        let dir = tempfile::tempdir().unwrap();
        let mut writer = OutputWriter::create(storage::open(dir.path().to_str().unwrap()).unwrap(), "a").await.unwrap();
        writer.write_part(&batch).await.unwrap();
        let file = std::fs::File::open(dir.path().join("part-00000.parquet")).unwrap();
        let reader = SerializedFileReader::new(file).unwrap();
        let parquet_column = reader.metadata().file_metadata().schema_descr().column(0);
        assert_eq!(parquet_column.logical_type_ref(), Some(&LogicalType::timestamp(false, ParquetUnit::MILLIS)));
        let read = parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(
            std::fs::File::open(dir.path().join("part-00000.parquet")).unwrap(),
            8,
        )
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
        let times = read.column(0).as_any().downcast_ref::<TimestampMillisecondArray>().unwrap();
        assert_eq!(times.iter().collect::<Vec<_>>(), [Some(instant * 1000), None]);
    }

    /// A prefix is claimed by one job at a time (a resumed run of the same job takes it
    /// over), freed when the job fails with only its own parts deleted, and refused once a
    /// manifest completes it.
    #[tokio::test]
    async fn one_job_claims_a_prefix_until_its_manifest_or_its_failure() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("out");
        let location = || storage::open(url.to_str().unwrap()).unwrap();
        let files = || {
            let mut names: Vec<String> = std::fs::read_dir(&url)
                .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
                .unwrap_or_default();
            names.sort();
            names
        };
        let mut first = OutputWriter::create(location(), "a").await.unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![1, 2]))],
        )
        .unwrap();
        first.write_part(&batch).await.unwrap();
        let taken = OutputWriter::create(location(), "b").await.map(drop).unwrap_err();
        assert!(matches!(&taken, OutputError::Claimed { job_id, .. } if job_id == "a"), "{taken}");
        assert!(taken.is_public());
        // Other files under the prefix are not the failed job's to delete.
        std::fs::create_dir_all(url.join("below")).unwrap();
        std::fs::write(url.join("below/part-00000.parquet"), b"another release").unwrap();
        std::fs::write(url.join("part-00001.parquet"), b"not written by this job").unwrap();
        first.claim().abandon().await;
        assert_eq!(files(), ["below", "part-00001.parquet"]);
        std::fs::remove_dir_all(url.join("below")).unwrap();
        std::fs::remove_file(url.join("part-00001.parquet")).unwrap();

        // The same job, resumed after its coordinator died, takes its claim over; the
        // copy it replaced no longer holds the prefix, so it frees nothing.
        let dead = OutputWriter::create(location(), "r").await.unwrap().claim();
        let resumed = OutputWriter::create(location(), "r").await.unwrap();
        dead.abandon().await;
        assert_eq!(files(), [CLAIM]);
        resumed.claim().abandon().await;
        assert_eq!(files(), Vec::<String>::new());

        // A claim an operator removed and another job took is not released by the first.
        let stale = OutputWriter::create(location(), "b").await.unwrap().claim();
        std::fs::remove_file(url.join(CLAIM)).unwrap();
        let mut second = OutputWriter::create(location(), "c").await.unwrap();
        stale.abandon().await;
        assert_eq!(files(), [CLAIM]);
        second.write_part(&batch).await.unwrap();
        let sealed = second.seal(manifest()).unwrap();
        let written = second.finish(sealed).await.unwrap();
        assert_eq!(written.rows, 2);
        assert_eq!(files(), [MANIFEST, "part-00000.parquet"], "the manifest replaced the claim");
        let complete = OutputWriter::create(location(), "d").await.map(drop).unwrap_err();
        assert!(matches!(complete, OutputError::AlreadyComplete { .. }), "{complete}");
        assert_eq!(files(), [MANIFEST, "part-00000.parquet"], "no claim left by the refusal");
    }

    /// A database's parts are written under their tables' folders and listed by table in
    /// the manifest; a part of a table the manifest does not name is refused (it would be
    /// published unlisted), and a database's release is not read as one table.
    #[tokio::test]
    async fn a_database_release_lists_each_tables_parts() {
        let dir = tempfile::tempdir().unwrap();
        let url = dir.path().join("out");
        let location = || storage::open(url.to_str().unwrap()).unwrap();
        let batch = |n: i64| {
            RecordBatch::try_new(
                Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)])),
                vec![Arc::new(Int64Array::from_iter_values(0..n))],
            )
            .unwrap()
        };
        let table = |name: &str| ManifestTable {
            name: name.into(),
            key: None,
            parent: None,
            rows: 0,
            columns: Vec::new(),
            parts: Vec::new(),
        };
        let mut writer = OutputWriter::create(location(), "db").await.unwrap();
        for (name, rows) in [("patients", 2), ("admissions", 3), ("patients", 1)] {
            writer.write_table_part(name, &batch(rows)).await.unwrap();
        }
        let unnamed = Manifest { tables: vec![table("patients")], ..manifest() };
        assert!(writer.seal(unnamed).map(drop).unwrap_err().to_string().contains("table admissions"));
        let sealed = writer.seal(Manifest { tables: vec![table("patients"), table("admissions")], ..manifest() });
        let written = writer.finish(sealed.unwrap()).await.unwrap();
        let parts = |t: &ManifestTable| t.parts.iter().map(|p| p.path.clone()).collect::<Vec<_>>();
        assert_eq!(parts(&written.tables[0]), ["patients/part-00000.parquet", "patients/part-00001.parquet"]);
        assert_eq!(parts(&written.tables[1]), ["admissions/part-00000.parquet"]);
        assert_eq!((written.tables[0].rows, written.tables[1].rows, written.rows), (3, 3, 6));
        assert!(written.parts.is_empty() && url.join("admissions/part-00000.parquet").is_file());
        assert_eq!(written.format, DATABASE_MANIFEST_FORMAT);
        // The manifest names where it was written.
        assert_eq!(written.output_url, url.to_str().unwrap());
        let read = crate::data::table::read_release(url.to_str().unwrap(), None, None).await.map(drop).unwrap_err();
        assert!(read.to_string().contains("a database's release, not one table (its tables: patients, admissions)"));
        // Read back as a database: each table's parts, checked against the manifest.
        let (_, tables) = crate::data::table::read_database_release(url.to_str().unwrap()).await.unwrap();
        let base = url.to_str().unwrap();
        assert_eq!(
            tables,
            [
                (
                    "patients".to_string(),
                    vec![format!("{base}/patients/part-00000.parquet"), format!("{base}/patients/part-00001.parquet")]
                ),
                ("admissions".to_string(), vec![format!("{base}/admissions/part-00000.parquet")]),
            ]
        );
        std::fs::write(url.join("admissions/part-00000.parquet"), b"other rows").unwrap();
        let changed = crate::data::table::read_database_release(base).await.map(drop).unwrap_err();
        assert!(changed.to_string().contains("part admissions/part-00000.parquet is not the part released"));
    }
}
