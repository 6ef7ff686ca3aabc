//! Partitioning by the workers: a shuffle through the scratch store, as MapReduce's. The
//! coordinator plans *shards* of the input from public metadata only (its files' sizes and
//! first bytes, each Parquet file's row groups from its footer): byte ranges of a CSV file
//! (`csv_split`), runs of a Parquet file's row groups, or whole files. Each shard's reader
//! encodes its rows against the schema and writes them into one bucket per partition, by
//! the job's keyed unit hash, beside the partition files ([`read_shard`]). Each partition's
//! owner then merges its buckets from the shards, in the input's order, into the partition
//! file, and counts its units ([`merge_partition`]). The readers' counts (rows per bucket) and the owners' (rows per
//! shard) must agree, and each owner's count of its units must be what the readers'
//! sketches of them estimate (`sketch`), so a reader or an owner whose count is false fails
//! the job before anything is released. The coordinator holds no row and no unit.
//!
//! The partitions are those the coordinator's own reading writes
//! (`partition::PartitionWriter::new`): the same units in the same partitions for a key,
//! their rows in the input's order. One exception: without a unit column, a row of a CSV
//! byte range is named by the range and its row in it (its row in the file is not known to
//! its reader), so such rows, each still its own unit, fall in other partitions.

use std::collections::BTreeMap;

use futures::StreamExt;
use object_store::ObjectStoreExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::domain::Domain;
use super::input::{BAD_VALUE_REASONS, BATCH_ROWS, InputReader, SkippedRows, is_compressed};
use super::partition::{PartitionKey, PartitionWriter, UnitRows, bucket_file, partition_schema};
use super::sketch::{REGISTERS, UnitSketch};
use super::source::{Format, Source};
use super::{DataError, parquet_io};
use crate::spec::SchemaSpec;
use crate::storage;

/// How large a shard may be: a run of a Parquet file's row groups holds at most `rows`
/// rows (a larger row group alone), and a CSV file is cut into ranges of `bytes` bytes (a
/// compressed one is read whole: a stream cannot be entered in its middle).
#[derive(Clone, Copy, Debug)]
pub struct ShardSize {
    pub rows: u64,
    pub bytes: u64,
}

impl Default for ShardSize {
    fn default() -> Self {
        Self { rows: 1 << 20, bytes: 64 << 20 }
    }
}

/// One shard of the input: part of one file.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    pub url: String,
    pub part: ShardPart,
}

/// Which part of its file a shard reads.
#[derive(Clone, Debug, PartialEq)]
pub enum ShardPart {
    /// The whole file.
    Whole,
    /// Consecutive row groups of a Parquet file, and the file's row number of the first
    /// one's first row: rows are numbered in the file, as the coordinator's reading numbers
    /// them (a row-level unit is named by its row).
    RowGroups { groups: Vec<usize>, first_row: u64 },
    /// The records of a CSV file that start in the bytes `[start, end)` (`csv_split`).
    Bytes { start: u64, end: u64 },
}

impl Shard {
    pub fn whole(url: &str) -> Self {
        Self { url: url.to_string(), part: ShardPart::Whole }
    }
}

/// The shards of `input`, from public metadata only: each file's size and first bytes (is
/// it compressed), and each Parquet file's row groups from its footer.
pub async fn plan_shards(input: &Source, size: ShardSize) -> Result<Vec<Shard>, DataError> {
    let mut shards = Vec::new();
    for url in &input.urls {
        let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.clone(), message: e.to_string() };
        let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
        if input.format.unwrap_or_else(|| Format::detect(url)) == Format::Csv {
            let bytes = location.store.head(&path).await.map_err(|e| read_err(&e))?.size;
            if bytes <= size.bytes
                || is_compressed(&location.store.get_range(&path, 0..4).await.map_err(|e| read_err(&e))?)
            {
                shards.push(Shard::whole(url));
                continue;
            }
            let starts = (0..bytes).step_by(size.bytes as usize);
            shards.extend(starts.map(|start| Shard {
                url: url.clone(),
                part: ShardPart::Bytes { start, end: (start + size.bytes).min(bytes) },
            }));
            continue;
        }
        let groups = parquet_io::row_group_rows(location.store, path)
            .await
            .map_err(|e| read_err(&format!("not a readable Parquet file: {e}")))?;
        let (mut first_row, mut held) = (0, 0);
        let mut current = Vec::new();
        for (g, rows) in groups.into_iter().enumerate() {
            if !current.is_empty() && held + rows > size.rows {
                let groups = std::mem::take(&mut current);
                shards.push(Shard { url: url.clone(), part: ShardPart::RowGroups { groups, first_row } });
                first_row += held;
                held = 0;
            }
            current.push(g);
            held += rows;
        }
        if !current.is_empty() {
            shards.push(Shard { url: url.clone(), part: ShardPart::RowGroups { groups: current, first_row } });
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
    /// A database table's key columns, read beside the schema's values: its parent's key,
    /// then its own if declared. Each row then carries its own key's and its parent key's
    /// hashes under the job's row keys (`PartitionKey::row_keys`), the last two columns of
    /// `domain` (`data::database::partition`). Empty for any other input.
    #[serde(default)]
    pub keys: Vec<String>,
}

impl ShardJob {
    /// The columns read from the input: `domain`'s, less a database table's key hashes.
    pub fn input_domain(&self) -> Domain {
        let mut domain = self.domain.clone();
        if !self.keys.is_empty() {
            domain.columns.truncate(domain.columns.len().saturating_sub(2));
        }
        domain
    }

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

/// Where a byte-range shard's records lay in its file (`csv_split`): what the coordinator
/// joins a file's ranges by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSpan {
    /// Not a byte range: a whole file, or row groups.
    Unsplit,
    /// The file offsets of its first record and of the end of its last.
    Bytes { first: u64, end: u64 },
    /// Its records did not read: from where its reader guessed the first one starts
    /// (inside a quoted field that spans lines), past what its reader reads, or at all (a
    /// malformed line, a store error). Nothing of it is kept: the file is read whole.
    Lost,
}

impl RecordSpan {
    fn to_values(self) -> [f64; 3] {
        match self {
            RecordSpan::Unsplit => [0.0; 3],
            RecordSpan::Bytes { first, end } => [1.0, first as f64, end as f64],
            RecordSpan::Lost => [2.0, 0.0, 0.0],
        }
    }

    fn from_counts(counts: &[u64]) -> Result<Self, String> {
        match *counts {
            [0, 0, 0] => Ok(RecordSpan::Unsplit),
            [1, first, end] if first <= end => Ok(RecordSpan::Bytes { first, end }),
            [2, 0, 0] => Ok(RecordSpan::Lost),
            _ => Err("a shard's span that is not one".into()),
        }
    }
}

/// What a shard's reader counted: rows written to each partition's bucket, a sketch of
/// each bucket's units (none when every row is its own unit), the values that broke the
/// schema (when the job skips bad rows or reads them as missing), and where a byte-range
/// shard's records lay.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardCounts {
    pub rows: Vec<u64>,
    pub sketches: Vec<UnitSketch>,
    pub skipped: SkippedRows,
    pub span: RecordSpan,
}

/// Values of a [`RecordSpan`] in a shard's tensor.
const SPAN_VALUES: usize = 3;

impl ShardCounts {
    /// A byte-range shard that lost its records: no row, nothing skipped.
    fn lost(job: &ShardJob) -> Self {
        let partitions = job.partitions as usize;
        Self {
            rows: vec![0; partitions],
            sketches: vec![UnitSketch::default(); job.sketches() * partitions],
            skipped: SkippedRows::default(),
            span: RecordSpan::Lost,
        }
    }

    /// Values in [`Self::to_tensor`]'s form.
    pub fn tensor_len(job: &ShardJob) -> usize {
        let partitions = job.partitions as usize;
        partitions
            + 1
            + job.schema.columns.len() * BAD_VALUE_REASONS.len()
            + SPAN_VALUES
            + job.sketches() * partitions * REGISTERS
    }

    /// Rows per partition, then rows left out, then values that broke the schema per
    /// schema column and reason ([`BAD_VALUE_REASONS`]), then the span, then each
    /// partition's sketch.
    pub fn to_tensor(&self, job: &ShardJob) -> Vec<f64> {
        let mut values: Vec<f64> = self.rows.iter().map(|&r| r as f64).collect();
        values.push(self.skipped.rows as f64);
        for column in &job.schema.columns {
            for reason in BAD_VALUE_REASONS {
                let n = self.skipped.by_column.get(&(column.name.clone(), reason)).copied().unwrap_or(0);
                values.push(n as f64);
            }
        }
        values.extend(self.span.to_values());
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
        let span = RecordSpan::from_counts(&counts[sketched - SPAN_VALUES..])?;
        let mut skipped = SkippedRows { rows: counts[partitions], by_column: BTreeMap::new() };
        let per_column = counts[partitions + 1..sketched - SPAN_VALUES].chunks(BAD_VALUE_REASONS.len());
        for (column, reasons) in job.schema.columns.iter().zip(per_column) {
            for (reason, &n) in BAD_VALUE_REASONS.iter().zip(reasons) {
                if n > 0 {
                    skipped.by_column.insert((column.name.clone(), reason), n);
                }
            }
        }
        let sketches = values[sketched..].chunks(REGISTERS).map(UnitSketch::from_values).collect::<Result<_, _>>()?;
        Ok(Self { rows: counts[..partitions].to_vec(), sketches, skipped, span })
    }
}

/// Reads `shard` (the `index`-th of the job's) and writes its rows into one bucket per
/// partition beside the partition files, by `key`. Deterministic: a shard read again (its
/// first reader lost) writes the same buckets, in place of any it left. A byte range whose
/// records do not read is [`RecordSpan::Lost`], not an error: its first record may not start
/// where its reader guessed, or its last may run past what it reads (the file is then read
/// whole, where a true error fails the job).
pub async fn read_shard(
    job: &ShardJob,
    shard: &Shard,
    index: u32,
    key: PartitionKey,
) -> Result<ShardCounts, ShardError> {
    let scratch =
        storage::open(&job.partitions_url).map_err(|e| ShardError::Scratch(DataError::Internal(e.to_string())))?;
    let row_keys = key.row_keys();
    let mut buckets = PartitionWriter::buckets(&scratch, &job.domain, (job.partitions, key), index, !job.row_level())
        .map_err(ShardError::Scratch)?;
    let input = job.input.of_shard(&shard.url);
    let read = job.input_domain();
    let mut reader = InputReader::new(&input, &job.schema, &read)
        .with_part(shard.part.clone())
        .with_keys(job.keys.iter().map(String::as_str).collect());
    let range = matches!(shard.part, ShardPart::Bytes { .. });
    loop {
        let batch = match job.keys.is_empty() {
            true => reader.next_batch().await,
            false => reader.next_keyed_batch().await.map(|keyed| keyed.map(|keyed| row_keys.hashed(keyed))),
        };
        match batch {
            Ok(Some(batch)) => buckets.write(batch).await.map_err(ShardError::Scratch)?,
            Ok(None) => break,
            Err(e) if range => {
                // Row-level: the worker's log, its operator's.
                tracing::info!(error = %e, "a CSV range's records did not read; its file is to be read whole");
                // Completed, not abandoned (an unfinished upload lingers on S3): the job's
                // cleanup deletes the buckets of every shard.
                if let Err(e) = buckets.finish_buckets().await {
                    tracing::warn!(error = %e, "a lost CSV range's buckets could not be completed");
                }
                return Ok(ShardCounts::lost(job));
            }
            Err(e) => return Err(ShardError::Input(e)),
        }
    }
    let skipped = reader.skipped().cloned().unwrap_or_default();
    let span = match reader.span() {
        Some((first, end)) => RecordSpan::Bytes { first, end },
        None => RecordSpan::Unsplit,
    };
    let (rows, sketches) = buckets.finish_buckets().await.map_err(ShardError::Scratch)?;
    Ok(ShardCounts { rows, sketches, skipped, span })
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

/// Merges the buckets of the partition at `partition_url` from each of `shards`, in that
/// order (the input's), into its file, counting its units. A row-level job's rows are each
/// a unit.
pub async fn merge_partition(job: &ShardJob, partition_url: &str, shards: &[u32]) -> Result<Census, DataError> {
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
    let mut rows_per_shard = Vec::with_capacity(shards.len());
    for &shard in shards {
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

/// A shard as its `ReadShard` task (`rhosynth.proto`) carries it.
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::{ByteRange, ReadShard};

    use super::{PartitionKey, Shard, ShardPart};
    use crate::wire::WireError;

    impl Shard {
        /// The task reading this shard, the `index`-th of the job's (`job_json`, a
        /// [`super::ShardJob`]), under the job's partition key.
        pub fn task(&self, job_json: String, index: u32, key: &PartitionKey) -> ReadShard {
            let (row_groups, first_row, bytes) = match &self.part {
                ShardPart::Whole => (Vec::new(), 0, None),
                ShardPart::RowGroups { groups, first_row } => {
                    (groups.iter().map(|&g| g as u32).collect(), *first_row, None)
                }
                &ShardPart::Bytes { start, end } => (Vec::new(), 0, Some(ByteRange { start, end })),
            };
            ReadShard {
                job_json,
                url: self.url.clone(),
                row_groups,
                first_row,
                bytes,
                shard: index,
                key: key.to_bytes(),
            }
        }
    }

    impl TryFrom<&ReadShard> for Shard {
        type Error = WireError;

        fn try_from(task: &ReadShard) -> Result<Self, WireError> {
            let part = match (&task.bytes, task.row_groups.as_slice()) {
                (Some(bytes), []) => ShardPart::Bytes { start: bytes.start, end: bytes.end },
                (None, []) => ShardPart::Whole,
                (None, groups) => ShardPart::RowGroups {
                    groups: groups.iter().map(|&g| g as usize).collect(),
                    first_row: task.first_row,
                },
                (Some(_), _) => return Err(WireError::new("a shard of both bytes and row groups")),
            };
            Ok(Shard { url: task.url.clone(), part })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Each part of a file travels to its reader and back as it was.
        #[test]
        fn a_shard_travels_as_it_is() {
            let key = PartitionKey::generate().unwrap();
            let parts = [
                ShardPart::Whole,
                ShardPart::RowGroups { groups: vec![2, 3], first_row: 120 },
                ShardPart::Bytes { start: 64 << 20, end: 128 << 20 },
            ];
            for part in parts {
                let shard = Shard { url: "/in/f".into(), part };
                let task = shard.task("{}".into(), 4, &key);
                assert_eq!((task.shard, task.key.as_slice()), (4, key.to_bytes().as_slice()));
                assert_eq!(Shard::try_from(&task).unwrap(), shard);
            }
        }
    }
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
