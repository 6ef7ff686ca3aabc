//! Partitioning by the workers: a shuffle through the scratch store, as MapReduce's. The
//! coordinator plans *shards* of the input from public metadata only (its files, and each
//! Parquet file's row groups from its footer). Each shard's reader encodes its rows against
//! the schema and writes them into one bucket per partition, by the job's keyed unit hash,
//! beside the partition files ([`read_shard`]). Each partition's owner then merges its
//! buckets from every shard, in shard order, into the partition file, and counts its units
//! ([`merge_partition`]). The readers' counts (rows per bucket) and the owners' (rows per
//! shard) must agree, and each owner's count of its units must be what the readers'
//! sketches of them estimate (`sketch`), so a reader or an owner whose count is false fails
//! the job before anything is released. The coordinator holds no row and no unit.
//!
//! The partitions are those the coordinator's own reading writes
//! (`partition::PartitionWriter::new`): the same units in the same partitions for a key,
//! their rows in the input's order.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::domain::Domain;
use super::input::{BAD_VALUE_REASONS, BATCH_ROWS, InputReader, SkippedRows};
use super::partition::{PartitionKey, PartitionWriter, UnitRows, bucket_file, partition_schema};
use super::sketch::{REGISTERS, UnitSketch};
use super::source::{Format, Source};
use super::{DataError, parquet_io};
use crate::spec::SchemaSpec;
use crate::storage;

/// Rows a Parquet shard holds at most, in whole row groups (a CSV file is one shard).
pub const SHARD_ROWS: u64 = 1 << 20;

/// One shard of the input: a CSV file, or consecutive row groups of a Parquet file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shard {
    pub url: String,
    /// A Parquet file's row groups; empty for a CSV file (read whole).
    pub row_groups: Vec<usize>,
    /// The file's row number of the shard's first row: rows are numbered in the file, as
    /// the coordinator's reading numbers them (a row-level unit is named by its row).
    pub first_row: u64,
}

/// The shards of `input`, from public metadata only: one per CSV file, and for a Parquet
/// file runs of row groups of at most `shard_rows` rows (a larger row group alone).
pub async fn plan_shards(input: &Source, shard_rows: u64) -> Result<Vec<Shard>, DataError> {
    let mut shards = Vec::new();
    for url in &input.urls {
        if input.format.unwrap_or_else(|| Format::detect(url)) == Format::Csv {
            shards.push(Shard { url: url.clone(), row_groups: Vec::new(), first_row: 0 });
            continue;
        }
        let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.clone(), message: e.to_string() };
        let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
        let groups = parquet_io::row_group_rows(location.store, path)
            .await
            .map_err(|e| read_err(&format!("not a readable Parquet file: {e}")))?;
        let mut first_row = 0;
        let mut current = Shard { url: url.clone(), row_groups: Vec::new(), first_row };
        let mut held = 0;
        for (g, rows) in groups.into_iter().enumerate() {
            if !current.row_groups.is_empty() && held + rows > shard_rows {
                let next = Shard { url: url.clone(), row_groups: Vec::new(), first_row };
                shards.push(std::mem::replace(&mut current, next));
                held = 0;
            }
            current.row_groups.push(g);
            held += rows;
            first_row += rows;
        }
        if !current.row_groups.is_empty() {
            shards.push(current);
        }
    }
    Ok(shards)
}

/// What every shard and merge task of a job reads the same way (JSON in the tasks).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardJob {
    /// The job's input: its dialect, and what reading does with a bad row.
    pub input: Source,
    pub schema: SchemaSpec,
    pub domain: Domain,
    /// The job's partition prefix in the scratch store, and its partitions.
    pub partitions_url: String,
    pub partitions: u32,
}

impl ShardJob {
    /// Whether each row is its own unit (no unit column): then a partition's units are its
    /// rows, and no sketch is needed to check its owner's count.
    pub fn row_level(&self) -> bool {
        self.schema.unit_column.is_none()
    }

    /// Sketches per partition a shard's reader reports: one, unless the job is row-level.
    fn sketches(&self) -> usize {
        usize::from(!self.row_level())
    }
}

/// Why a shard could not be read into its buckets.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The input broke the job's schema, or could not be read: what the coordinator's own
    /// reading would have failed on.
    #[error("{0}")]
    Input(DataError),
    /// Writing the buckets to the scratch store failed.
    #[error("writing the shard's buckets: {0}")]
    Scratch(DataError),
}

/// What a shard's reader counted: rows written to each partition's bucket, a sketch of
/// each bucket's units (none when every row is its own unit), and the values that broke
/// the schema (when the job skips bad rows or reads them as missing).
#[derive(Clone, Debug, PartialEq)]
pub struct ShardCounts {
    pub rows: Vec<u64>,
    pub sketches: Vec<UnitSketch>,
    pub skipped: SkippedRows,
}

impl ShardCounts {
    /// Values in [`Self::to_tensor`]'s form.
    pub fn tensor_len(job: &ShardJob) -> usize {
        let partitions = job.partitions as usize;
        partitions + 1 + job.schema.columns.len() * BAD_VALUE_REASONS.len() + job.sketches() * partitions * REGISTERS
    }

    /// Rows per partition, then rows left out, then values that broke the schema per
    /// schema column and reason ([`BAD_VALUE_REASONS`]), then each partition's sketch.
    pub fn to_tensor(&self, job: &ShardJob) -> Vec<f64> {
        let mut values: Vec<f64> = self.rows.iter().map(|&r| r as f64).collect();
        values.push(self.skipped.rows as f64);
        for column in &job.schema.columns {
            for reason in BAD_VALUE_REASONS {
                let n = self.skipped.by_column.get(&(column.name.clone(), reason)).copied().unwrap_or(0);
                values.push(n as f64);
            }
        }
        self.sketches.iter().for_each(|sketch| values.extend(sketch.values()));
        values
    }

    /// A reader's tensor read back; refused unless every value is a count or a register.
    pub fn from_tensor(job: &ShardJob, values: &[f64]) -> Result<Self, String> {
        if values.len() != Self::tensor_len(job) {
            return Err(format!("a shard's counts of {} values, not {}", values.len(), Self::tensor_len(job)));
        }
        let partitions = job.partitions as usize;
        let sketched = values.len() - job.sketches() * partitions * REGISTERS;
        let counts = counts(&values[..sketched])?;
        let mut skipped = SkippedRows { rows: counts[partitions], by_column: BTreeMap::new() };
        let per_column = counts[partitions + 1..].chunks(BAD_VALUE_REASONS.len());
        for (column, reasons) in job.schema.columns.iter().zip(per_column) {
            for (reason, &n) in BAD_VALUE_REASONS.iter().zip(reasons) {
                if n > 0 {
                    skipped.by_column.insert((column.name.clone(), reason), n);
                }
            }
        }
        let sketches = values[sketched..].chunks(REGISTERS).map(UnitSketch::from_values).collect::<Result<_, _>>()?;
        Ok(Self { rows: counts[..partitions].to_vec(), sketches, skipped })
    }
}

/// Reads `shard` (the `index`-th of the job's) and writes its rows into one bucket per
/// partition beside the partition files, by `key`. Deterministic: a shard read again (its
/// first reader lost) writes the same buckets, in place of any it left.
pub async fn read_shard(
    job: &ShardJob,
    shard: &Shard,
    index: u32,
    key: PartitionKey,
) -> Result<ShardCounts, ShardError> {
    let scratch =
        storage::open(&job.partitions_url).map_err(|e| ShardError::Scratch(DataError::Internal(e.to_string())))?;
    let mut buckets = PartitionWriter::buckets(&scratch, &job.domain, (job.partitions, key), index, !job.row_level())
        .map_err(ShardError::Scratch)?;
    let input = job.input.of_shard(&shard.url);
    let mut reader = InputReader::new(&input, &job.schema, &job.domain);
    if input.format.unwrap_or_else(|| Format::detect(&shard.url)) == Format::Parquet {
        reader = reader.with_part(shard.row_groups.clone(), shard.first_row);
    }
    while let Some(batch) = reader.next_batch().await.map_err(ShardError::Input)? {
        buckets.write(batch).await.map_err(ShardError::Scratch)?;
    }
    let skipped = reader.skipped().cloned().unwrap_or_default();
    let (rows, sketches) = buckets.finish_buckets().await.map_err(ShardError::Scratch)?;
    Ok(ShardCounts { rows, sketches, skipped })
}

/// What a partition's owner counted while merging its buckets: the rows it read from each
/// shard's, its units, and its units by their number of rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Census {
    pub rows_per_shard: Vec<u64>,
    pub units: u64,
    pub rows_per_unit: BTreeMap<u32, u64>,
}

impl Census {
    /// Rows per shard, then the units, then (rows, units) pairs of the units by rows.
    pub fn to_tensor(&self) -> Vec<f64> {
        let mut values: Vec<f64> = self.rows_per_shard.iter().map(|&r| r as f64).collect();
        values.push(self.units as f64);
        for (&rows, &units) in &self.rows_per_unit {
            values.extend([f64::from(rows), units as f64]);
        }
        values
    }

    /// An owner's tensor read back: refused unless it is counts that hold together (as many
    /// units as the histogram has, and as many rows as it read).
    pub fn from_tensor(values: &[f64], shards: usize) -> Result<Self, String> {
        if values.len() < shards + 1 || !(values.len() - shards - 1).is_multiple_of(2) {
            return Err(format!("a partition's census of {} values, for {shards} shards", values.len()));
        }
        let counts = counts(values)?;
        let mut rows_per_unit = BTreeMap::new();
        for pair in counts[shards + 1..].chunks(2) {
            let rows = u32::try_from(pair[0]).ok().filter(|&r| r > 0).ok_or("a unit count of rows out of range")?;
            if rows_per_unit.insert(rows, pair[1]).is_some() || pair[1] == 0 {
                return Err("a units-by-rows histogram that names a count twice, or none".into());
            }
        }
        let census = Self { rows_per_shard: counts[..shards].to_vec(), units: counts[shards], rows_per_unit };
        // In u128, which no sum of fewer than 2⁶⁴ counts below 2⁵³ each overflows.
        let units: u128 = census.rows_per_unit.values().map(|&u| u128::from(u)).sum();
        let rows: u128 = census.rows_per_unit.iter().map(|(&r, &u)| u128::from(r) * u128::from(u)).sum();
        let read: u128 = census.rows_per_shard.iter().map(|&r| u128::from(r)).sum();
        if units != u128::from(census.units) || rows != read || read >= 1 << 53 {
            return Err("a census whose units or rows do not add up".into());
        }
        Ok(census)
    }
}

/// Merges the buckets of the partition at `partition_url` from each of `shards` shards, in
/// shard order, into its file, counting its units. A row-level job's rows are each a unit.
pub async fn merge_partition(job: &ShardJob, partition_url: &str, shards: u32) -> Result<Census, DataError> {
    let schema = partition_schema(&job.domain);
    let write_err = |e: &dyn std::fmt::Display| DataError::Internal(format!("writing {partition_url}: {e}"));
    // Its folder opened as the scratch store's (created if need be: no shard may have
    // written a bucket into it).
    let (dir, name) = partition_url.rsplit_once('/').ok_or_else(|| write_err(&"no file name"))?;
    let location = storage::open(dir).map_err(|e| write_err(&e))?;
    let path = location.child(name);
    let mut writer = parquet_io::create_writer(location.store, path, schema.clone()).map_err(|e| write_err(&e))?;
    let row_level = job.row_level();
    // By the SHA-256 of its id (16 bytes whatever the id's length): the owner's memory
    // grows with its partition's units, never its rows.
    let mut units = UnitRows::default();
    let mut rows_per_shard = Vec::with_capacity(shards as usize);
    for shard in 0..shards {
        let url = bucket_file(partition_url, shard);
        let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.clone(), message: e.to_string() };
        let (location, path) = storage::open_file(&url).map_err(|e| read_err(&e))?;
        let (bucket_schema, mut stream) =
            parquet_io::open_stream(location.store, path, BATCH_ROWS).await.map_err(|e| read_err(&e))?;
        if bucket_schema.as_ref() != schema.as_ref() {
            return Err(read_err(&"a bucket that does not match the job's domain"));
        }
        let mut rows = 0;
        while let Some(batch) = stream.next().await {
            let batch = batch.map_err(|e| read_err(&e))?;
            rows += batch.num_rows() as u64;
            if !row_level {
                use arrow_array::cast::AsArray;
                for unit in batch.column(0).as_string::<i32>().iter() {
                    let digest = Sha256::digest(unit.unwrap_or_default().as_bytes());
                    units.add(digest[..16].try_into().expect("16 bytes"));
                }
            }
            writer.write(&batch).await.map_err(|e| write_err(&e))?;
        }
        rows_per_shard.push(rows);
    }
    writer.close().await.map_err(|e| write_err(&e))?;
    let rows: u64 = rows_per_shard.iter().sum();
    let (units, rows_per_unit) = if row_level {
        (rows, if rows > 0 { BTreeMap::from([(1, rows)]) } else { BTreeMap::new() })
    } else {
        (units.units(), units.by_rows())
    };
    Ok(Census { rows_per_shard, units, rows_per_unit })
}

/// Whole non-negative counts, or why not.
fn counts(values: &[f64]) -> Result<Vec<u64>, String> {
    values
        .iter()
        .map(|&v| {
            (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(53))
                .then_some(v as u64)
                .ok_or_else(|| "a count that is not a whole number".to_string())
        })
        .collect()
}
