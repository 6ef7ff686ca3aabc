//! Synthetic output: Parquet parts under an object-store prefix, then `_manifest.json`
//! written last with create-if-absent. Readers must treat a prefix without a manifest as
//! incomplete; a failed job never writes one.

use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampSecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, Utc};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use parquet::arrow::ArrowWriter;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::accounting::accountant::Accountant;
use crate::accounting::mechanism::Mechanism;
use crate::spec::{ColumnKind, JobSpec};
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
/// The same format as written before the project was renamed: read, never written.
pub const LEGACY_MANIFEST_FORMAT: &str = "dpsynth.manifest.v1";

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("output {url} already holds a complete dataset ({MANIFEST} exists); choose another output")]
    AlreadyComplete { url: String },
    #[error("writing output {url}: {message}")]
    Write { url: String, message: String },
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
    pub rows: u64,
    pub columns: Vec<ManifestColumn>,
    pub parts: Vec<PartInfo>,
    pub privacy: ManifestPrivacy,
}

/// Arrow schema of the synthetic table: the spec's columns, names unchanged.
pub fn output_schema(spec: &JobSpec) -> SchemaRef {
    let fields: Vec<Field> = spec
        .schema
        .columns
        .iter()
        .map(|c| {
            let data_type = match c.kind {
                ColumnKind::Categorical | ColumnKind::Identifier => DataType::Utf8,
                ColumnKind::Integer => DataType::Int64,
                ColumnKind::Continuous => DataType::Float64,
                ColumnKind::Datetime => DataType::Timestamp(TimeUnit::Second, None),
            };
            Field::new(&c.name, data_type, true)
        })
        .collect();
    Arc::new(Schema::new(fields))
}

/// Builds a batch of synthetic rows. Identifier columns get fresh synthetic ids
/// `syn-<n>`, one per synthetic unit, numbered from `first_id`.
pub fn rows_to_batch(spec: &JobSpec, units: &SyntheticUnits, first_id: u64) -> RecordBatch {
    let schema = output_schema(spec);
    let rows = &units.rows;
    let mut unit_of_row = Vec::with_capacity(rows.len());
    for (u, end) in units.ends.iter().enumerate() {
        unit_of_row.resize(*end, first_id + u as u64);
    }
    let mut domain_index = 0;
    let columns: Vec<ArrayRef> = spec
        .schema
        .columns
        .iter()
        .map(|c| -> ArrayRef {
            if c.kind == ColumnKind::Identifier {
                let ids = unit_of_row.iter().map(|u| format!("syn-{u}"));
                return Arc::new(StringArray::from_iter_values(ids));
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
                ColumnKind::Datetime => Arc::new(TimestampSecondArray::from_iter(values.map(|v| match v {
                    SyntheticValue::Datetime(x) => Some(*x),
                    _ => None,
                }))),
                ColumnKind::Identifier => unreachable!(),
            }
        })
        .collect();
    RecordBatch::try_new(schema, columns).expect("columns match the output schema")
}

/// Writes parts, then the manifest.
pub struct OutputWriter {
    location: StoreLocation,
    parts: Vec<PartInfo>,
}

impl OutputWriter {
    /// Refuses an output that already holds a complete dataset.
    pub async fn create(location: StoreLocation) -> Result<Self, OutputError> {
        match location.store.head(&location.child(MANIFEST)).await {
            Ok(_) => Err(OutputError::AlreadyComplete { url: location.url.clone() }),
            Err(object_store::Error::NotFound { .. }) => Ok(Self { location, parts: Vec::new() }),
            Err(e) => Err(OutputError::Write { url: location.url.clone(), message: e.to_string() }),
        }
    }

    /// The output prefix, as given.
    pub fn url(&self) -> &str {
        &self.location.url
    }

    fn err(&self, e: impl std::fmt::Display) -> OutputError {
        OutputError::Write { url: self.location.url.clone(), message: e.to_string() }
    }

    /// Writes one part (encoded in memory: a part is bounded by `rows_per_part`).
    pub async fn write_part(&mut self, batch: &RecordBatch) -> Result<(), OutputError> {
        let mut bytes = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), None).map_err(|e| self.err(e))?;
        writer.write(batch).map_err(|e| self.err(e))?;
        writer.close().map_err(|e| self.err(e))?;
        let name = format!("part-{:05}.parquet", self.parts.len());
        let info = PartInfo {
            path: name.clone(),
            rows: batch.num_rows() as u64,
            bytes: bytes.len() as u64,
            sha256: format!("{:x}", Sha256::digest(&bytes)),
        };
        self.location.store.put(&self.location.child(&name), PutPayload::from(bytes)).await.map_err(|e| self.err(e))?;
        self.parts.push(info);
        Ok(())
    }

    /// The URLs of the parts written so far.
    pub fn part_urls(&self) -> Vec<String> {
        let base = self.location.url.trim_end_matches('/');
        self.parts.iter().map(|p| format!("{base}/{}", p.path)).collect()
    }

    /// Writes the manifest (create-if-absent): from here on the output is complete.
    pub async fn finish(self, mut manifest: Manifest) -> Result<Manifest, OutputError> {
        manifest.parts = self.parts.clone();
        manifest.rows = self.parts.iter().map(|p| p.rows).sum();
        let bytes = serde_json::to_vec_pretty(&manifest).map_err(|e| self.err(e))?;
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        let path: Path = self.location.child(MANIFEST);
        match self.location.store.put_opts(&path, PutPayload::from(bytes), options).await {
            Ok(_) => Ok(manifest),
            Err(object_store::Error::AlreadyExists { .. }) => {
                Err(OutputError::AlreadyComplete { url: self.location.url.clone() })
            }
            Err(e) => Err(self.err(e)),
        }
    }
}
