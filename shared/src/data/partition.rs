//! Disjoint partitions by privacy unit. A keyed hash (HMAC-SHA256 under a per-job secret
//! key from the OS CSPRNG) of the unit id picks the partition, so every row of a unit
//! lands in the same partition, no unit is split, and the assignment reveals nothing to
//! anyone without the key. Partitions are encoded Parquet files, one prefix per partition
//! under the job's scratch prefix, so a deployment that partitions on the coordinator can
//! grant each worker access to its own prefixes only (shard readers write to every one).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type};
use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt32Array};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use futures::StreamExt;
use hmac::{Hmac, Mac};
use object_store::buffered::BufWriter;
use parquet::arrow::AsyncArrowWriter;
use sha2::Sha256;

use super::domain::{Domain, Encoding};
use super::input::{BATCH_ROWS, KeyedBatch};
use super::parquet_io;
use super::sketch::UnitSketch;
use super::{DataError, EncodedBatch};
use crate::entropy::os_seed;
use crate::storage::{self, StoreLocation};

/// Name of the privacy-unit column in partition files.
pub const UNIT_COLUMN: &str = "__unit";

/// A per-job secret that keys the partition hash.
#[derive(Clone)]
pub struct PartitionKey([u8; 32]);

impl PartitionKey {
    /// A fresh key from the OS entropy source.
    pub fn generate() -> Result<Self, DataError> {
        let key = os_seed().map_err(|e| DataError::Internal(e.to_string()))?;
        Ok(Self(key))
    }

    /// The key as a shard task carries it to its worker (over the authenticated channel,
    /// for that job only).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.to_vec()
    }

    /// A key as a task carried it: exactly 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DataError> {
        let key =
            bytes.try_into().map_err(|_| DataError::Internal(format!("a partition key of {} bytes", bytes.len())))?;
        Ok(Self(key))
    }

    /// The partition (of `count`) that `unit` belongs to.
    pub fn partition_of(&self, unit: &str, count: u32) -> u32 {
        Self::partition_of_digest(self.digest(unit), count)
    }

    /// The first 128 bits of the unit's keyed hash: what the partition writer remembers of a
    /// unit to count it (16 bytes, whatever the id's length; a collision among 10⁹ units has
    /// probability below 10⁻²⁰).
    fn digest(&self, unit: &str) -> u128 {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(unit.as_bytes());
        let digest = mac.finalize().into_bytes();
        u128::from_le_bytes(digest[..16].try_into().expect("16 bytes"))
    }

    /// The key a database's rows' keys are hashed under ([`RowKeys`]): derived from this
    /// one, so a row's key never hashes as a unit does.
    pub fn row_keys(&self) -> RowKeys {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(b"rhosynth database row keys");
        let mut key = [0u8; 32];
        key.copy_from_slice(&mac.finalize().into_bytes());
        RowKeys(key)
    }

    fn partition_of_digest(digest: u128, count: u32) -> u32 {
        ((digest as u64) % u64::from(count)) as u32
    }
}

/// A database row's keys (its own or its parent's) as a partition holds them: 52 bits of
/// a keyed hash, exact in a double. Keys are compared within one unit's rows only, so two
/// of a unit's k keys share one with probability about k²/2⁵³ (10⁻¹⁰ at a thousand
/// admissions), and without the job's key a partition's hashes cannot be turned back into
/// keys by trying every short id.
pub struct RowKeys([u8; 32]);

impl RowKeys {
    pub fn hash(&self, key: &str) -> f64 {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(key.as_bytes());
        let digest = mac.finalize().into_bytes();
        (u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")) >> 12) as f64
    }

    /// A database child table's rows read with their parent's key, then their own if
    /// declared (`database::partition::keys_read`), as partitioned: their values, then
    /// their own key's and their parent key's hashes (`database::KEY_COLUMN`,
    /// `database::PARENT_KEY_COLUMN`; missing without a key).
    pub fn hashed(&self, KeyedBatch { mut rows, keys }: KeyedBatch) -> EncodedBatch {
        let mut keys = keys.into_iter();
        let parent_keys = keys.next().expect("the parent key is read");
        let own_keys = keys.next().unwrap_or_else(|| vec![None; rows.len()]);
        rows.values.push(own_keys.iter().map(|k| k.as_deref().map(|k| self.hash(k))).collect());
        rows.values.push(parent_keys.iter().map(|k| k.as_deref().map(|k| self.hash(k))).collect());
        rows
    }
}

/// Arrow schema of a partition file.
pub fn partition_schema(domain: &Domain) -> SchemaRef {
    let mut fields = vec![Field::new(UNIT_COLUMN, DataType::Utf8, false)];
    fields.extend(domain.columns.iter().map(|c| {
        let data_type = match c.encoding {
            Encoding::Categorical { .. } => DataType::UInt32,
            Encoding::Numeric { .. } => DataType::Float64,
        };
        Field::new(&c.name, data_type, true)
    }));
    Arc::new(Schema::new(fields))
}

fn to_record_batch(schema: &SchemaRef, domain: &Domain, rows: &EncodedBatch) -> Result<RecordBatch, DataError> {
    let mut columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from_iter_values(rows.units.iter()))];
    for (c, values) in domain.columns.iter().zip(&rows.values) {
        let array: ArrayRef = match c.encoding {
            Encoding::Categorical { .. } => {
                Arc::new(values.iter().map(|v| v.map(|x| x as u32)).collect::<UInt32Array>())
            }
            Encoding::Numeric { .. } => Arc::new(values.iter().copied().collect::<Float64Array>()),
        };
        columns.push(array);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| DataError::Internal(e.to_string()))
}

/// The file of partition `k` under `prefix` (a partition's own prefix, so object-store
/// policies can grant each worker its own).
pub fn partition_file(prefix: &str, k: u32) -> String {
    format!("{prefix}/partition-{k:05}/{PARTITION_FILE}")
}

const PARTITION_FILE: &str = "part-00000.parquet";

/// The bucket that the reader of `shard` writes beside the partition file at
/// `partition_url` (partitioning by the workers, `data::shard`): that shard's rows of the
/// partition.
pub fn bucket_file(partition_url: &str, shard: u32) -> String {
    let dir = partition_url.strip_suffix(PARTITION_FILE).unwrap_or(partition_url).trim_end_matches('/');
    format!("{dir}/shard-{shard:05}.parquet")
}

/// Units by a 16-byte digest of their id, with their rows: what counting units exactly
/// holds (20 bytes a unit, where a `u128` key would align it to 32; none per row). The
/// coordinator's reading counts by the keyed digest, a partition's owner by its own.
#[derive(Default)]
pub struct UnitRows(HashMap<[u8; 16], u32>);

impl UnitRows {
    /// Counts a row of the unit `id`; `true` when it is the unit's first.
    pub fn add(&mut self, id: [u8; 16]) -> bool {
        let rows = self.0.entry(id).or_insert(0);
        *rows = rows.saturating_add(1);
        *rows == 1
    }

    pub fn units(&self) -> u64 {
        self.0.len() as u64
    }

    /// Units by their number of rows (sparse: its size never follows a unit's row count).
    pub fn by_rows(&self) -> BTreeMap<u32, u64> {
        let mut histogram = BTreeMap::new();
        self.0.values().for_each(|&rows| *histogram.entry(rows).or_insert(0) += 1);
        histogram
    }
}

/// Writes the encoded rows into `count` partition files under `scratch/<job_id>/`, or one
/// shard's buckets beside them.
pub struct PartitionWriter {
    key: PartitionKey,
    schema: SchemaRef,
    domain: Domain,
    writers: Vec<AsyncArrowWriter<BufWriter>>,
    urls: Vec<String>,
    /// The units seen so far, by keyed digest: what grows with the data. A shard's buckets
    /// count none: their partition's owner counts them (`data::shard`).
    units: Option<UnitRows>,
    units_per_partition: Vec<u64>,
    rows_per_partition: Vec<u64>,
    /// A shard's sketch of each bucket's units (empty when not asked for).
    sketches: Vec<UnitSketch>,
}

/// What partitioning produced. The unit counts are private: they may leave the
/// coordinator only through a DP release. They bound what a worker's aggregate of a
/// partition may hold (a worker's own claim is not trusted).
pub struct Partitioned {
    pub urls: Vec<String>,
    pub units: u64,
    pub units_per_partition: Vec<u64>,
    /// Units by their number of rows (sparse: its size never follows a unit's row count).
    pub rows_per_unit: BTreeMap<u32, u64>,
}

impl PartitionWriter {
    /// The partitions of `count` under `scratch/<job_id>/`, counting their units.
    pub fn new(
        scratch: &StoreLocation,
        job_id: &str,
        domain: &Domain,
        count: u32,
        key: PartitionKey,
    ) -> Result<Self, DataError> {
        let files = (0..count).map(|k| partition_file(job_id, k)).collect();
        Self::writing(scratch, files, domain, key, Some(UnitRows::default()))
    }

    /// The buckets of `shard` beside the `count` partitions under `scratch` (the job's
    /// partition prefix), counting rows, and sketching each bucket's units when
    /// `sketch_units`.
    pub fn buckets(
        scratch: &StoreLocation,
        domain: &Domain,
        (count, key): (u32, PartitionKey),
        shard: u32,
        sketch_units: bool,
    ) -> Result<Self, DataError> {
        let files = (0..count).map(|k| bucket_file(&partition_file("", k), shard)).collect();
        let mut writer = Self::writing(scratch, files, domain, key, None)?;
        if sketch_units {
            writer.sketches = vec![UnitSketch::default(); count as usize];
        }
        Ok(writer)
    }

    fn writing(
        scratch: &StoreLocation,
        files: Vec<String>,
        domain: &Domain,
        key: PartitionKey,
        units: Option<UnitRows>,
    ) -> Result<Self, DataError> {
        let schema = partition_schema(domain);
        let mut writers = Vec::new();
        let mut urls = Vec::new();
        // Named absolutely: the workers that read them may run elsewhere on the machine.
        let base = storage::absolute_url(&scratch.url);
        for relative in &files {
            let path = scratch.child(relative);
            let writer = parquet_io::create_writer(scratch.store.clone(), path, schema.clone())
                .map_err(|e| DataError::Internal(e.to_string()))?;
            writers.push(writer);
            urls.push(format!("{}/{}", base.trim_end_matches('/'), relative.trim_start_matches('/')));
        }
        let count = files.len();
        Ok(Self {
            key,
            schema,
            domain: domain.clone(),
            writers,
            urls,
            units,
            units_per_partition: vec![0; count],
            rows_per_partition: vec![0; count],
            sketches: Vec::new(),
        })
    }

    /// Routes each row to its unit's partition.
    pub async fn write(&mut self, batch: EncodedBatch) -> Result<(), DataError> {
        let count = self.writers.len() as u32;
        let mut split: Vec<EncodedBatch> = (0..count).map(|_| EncodedBatch::empty(self.domain.columns.len())).collect();
        for (i, unit) in batch.units.into_iter().enumerate() {
            let digest = self.key.digest(&unit);
            let partition = PartitionKey::partition_of_digest(digest, count) as usize;
            let target = &mut split[partition];
            if let Some(units) = &mut self.units
                && units.add(digest.to_le_bytes())
            {
                self.units_per_partition[partition] += 1;
            }
            self.rows_per_partition[partition] += 1;
            if let Some(sketch) = self.sketches.get_mut(partition) {
                sketch.insert(digest);
            }
            for (d, values) in batch.values.iter().enumerate() {
                target.values[d].push(values[i]);
            }
            target.units.push(unit);
        }
        for (writer, rows) in self.writers.iter_mut().zip(&split) {
            if !rows.units.is_empty() {
                let rb = to_record_batch(&self.schema, &self.domain, rows)?;
                writer.write(&rb).await.map_err(|e| DataError::Internal(format!("writing a partition: {e}")))?;
            }
        }
        Ok(())
    }

    /// Finishes every file; returns their URLs in partition order and the unit count.
    pub async fn finish(mut self) -> Result<Partitioned, DataError> {
        self.close().await?;
        let units = self.units.unwrap_or_default();
        Ok(Partitioned {
            urls: self.urls,
            units: units.units(),
            units_per_partition: self.units_per_partition,
            rows_per_unit: units.by_rows(),
        })
    }

    /// Finishes a shard's buckets; returns the rows written to each partition's, and the
    /// sketches of their units.
    pub async fn finish_buckets(mut self) -> Result<(Vec<u64>, Vec<UnitSketch>), DataError> {
        self.close().await?;
        Ok((self.rows_per_partition, self.sketches))
    }

    async fn close(&mut self) -> Result<(), DataError> {
        for writer in std::mem::take(&mut self.writers) {
            writer.close().await.map_err(|e| DataError::Internal(format!("closing a partition: {e}")))?;
        }
        Ok(())
    }
}

/// A partition file's encoded rows, a batch at a time.
pub struct PartitionReader<'a> {
    url: &'a str,
    domain: &'a Domain,
    stream: parquet::arrow::async_reader::ParquetRecordBatchStream<parquet_io::ObjectReader>,
}

impl<'a> PartitionReader<'a> {
    pub async fn open(url: &'a str, domain: &'a Domain) -> Result<Self, DataError> {
        let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.to_string(), message: e.to_string() };
        let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
        let (schema, stream) =
            parquet_io::open_stream(location.store, path, BATCH_ROWS).await.map_err(|e| read_err(&e))?;
        if schema.as_ref() != partition_schema(domain).as_ref() {
            return Err(read_err(&"partition file does not match the job's domain"));
        }
        Ok(Self { url, domain, stream })
    }

    /// The next batch, or `None` after the last.
    pub async fn next_batch(&mut self) -> Result<Option<EncodedBatch>, DataError> {
        let Some(batch) = self.stream.next().await else {
            return Ok(None);
        };
        let batch = batch.map_err(|e| DataError::Read { file: self.url.to_string(), message: e.to_string() })?;
        let units = batch.column(0).as_string::<i32>().iter().map(|u| u.unwrap_or_default().to_string()).collect();
        let values = self
            .domain
            .columns
            .iter()
            .enumerate()
            .map(|(d, c)| {
                let column = batch.column(d + 1);
                match c.encoding {
                    Encoding::Categorical { .. } => {
                        column.as_primitive::<UInt32Type>().iter().map(|v| v.map(f64::from)).collect()
                    }
                    Encoding::Numeric { .. } => column.as_primitive::<Float64Type>().iter().collect(),
                }
            })
            .collect();
        Ok(Some(EncodedBatch { units, values }))
    }
}

/// Streams the encoded rows of one partition file.
pub async fn read_partition(
    url: &str,
    domain: &Domain,
    mut sink: impl FnMut(EncodedBatch) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let mut reader = PartitionReader::open(url, domain).await?;
    while let Some(batch) = reader.next_batch().await? {
        sink(batch)?;
    }
    Ok(())
}
