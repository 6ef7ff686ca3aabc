//! Disjoint partitions by privacy unit. A keyed hash (HMAC-SHA256 under a per-job secret
//! key from the OS CSPRNG) of the unit id picks the partition, so every row of a unit
//! lands in the same partition, no unit is split, and the assignment reveals nothing to
//! anyone without the key. Partitions are encoded Parquet files, one prefix per partition
//! under the job's scratch prefix, so a deployment can grant each worker access to its own
//! prefixes only.

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
use super::input::BATCH_ROWS;
use super::parquet_io;
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

    fn partition_of_digest(digest: u128, count: u32) -> u32 {
        ((digest as u64) % u64::from(count)) as u32
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

/// Writes the encoded rows into `count` partition files under `scratch/<job_id>/`.
pub struct PartitionWriter {
    key: PartitionKey,
    schema: SchemaRef,
    domain: Domain,
    writers: Vec<AsyncArrowWriter<BufWriter>>,
    urls: Vec<String>,
    /// The units seen so far, by keyed digest (as bytes: 20 bytes an entry, where a `u128`
    /// key would align it to 32), with their rows: the coordinator's only state that grows
    /// with the data (none per row), needed to count units and their rows exactly.
    units: HashMap<[u8; 16], u32>,
    units_per_partition: Vec<u64>,
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
    pub fn new(
        scratch: &StoreLocation,
        job_id: &str,
        domain: &Domain,
        count: u32,
        key: PartitionKey,
    ) -> Result<Self, DataError> {
        let schema = partition_schema(domain);
        let mut writers = Vec::new();
        let mut urls = Vec::new();
        for k in 0..count {
            // One prefix per partition: object-store policies can grant each worker its own.
            let relative = format!("{job_id}/partition-{k:05}/part-00000.parquet");
            let path = scratch.child(&relative);
            let writer = parquet_io::create_writer(scratch.store.clone(), path, schema.clone())
                .map_err(|e| DataError::Internal(e.to_string()))?;
            writers.push(writer);
            urls.push(format!("{}/{relative}", scratch.url.trim_end_matches('/')));
        }
        let units_per_partition = vec![0; count as usize];
        Ok(Self { key, schema, domain: domain.clone(), writers, urls, units: HashMap::new(), units_per_partition })
    }

    /// Routes each row to its unit's partition.
    pub async fn write(&mut self, batch: EncodedBatch) -> Result<(), DataError> {
        let count = self.writers.len() as u32;
        let mut split: Vec<EncodedBatch> = (0..count).map(|_| EncodedBatch::empty(self.domain.columns.len())).collect();
        for (i, unit) in batch.units.into_iter().enumerate() {
            let digest = self.key.digest(&unit);
            let partition = PartitionKey::partition_of_digest(digest, count) as usize;
            let target = &mut split[partition];
            let rows = self.units.entry(digest.to_le_bytes()).or_insert(0);
            if *rows == 0 {
                self.units_per_partition[partition] += 1;
            }
            *rows = rows.saturating_add(1);
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
    pub async fn finish(self) -> Result<Partitioned, DataError> {
        for writer in self.writers {
            writer.close().await.map_err(|e| DataError::Internal(format!("closing a partition: {e}")))?;
        }
        let mut rows_per_unit = BTreeMap::new();
        self.units.values().for_each(|&rows| *rows_per_unit.entry(rows).or_insert(0) += 1);
        Ok(Partitioned {
            urls: self.urls,
            units: self.units.len() as u64,
            units_per_partition: self.units_per_partition,
            rows_per_unit,
        })
    }
}

/// Streams the encoded rows of one partition file.
pub async fn read_partition(
    url: &str,
    domain: &Domain,
    mut sink: impl FnMut(EncodedBatch) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.to_string(), message: e.to_string() };
    let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
    let (schema, mut stream) =
        parquet_io::open_stream(location.store, path, BATCH_ROWS).await.map_err(|e| read_err(&e))?;
    if schema.as_ref() != partition_schema(domain).as_ref() {
        return Err(read_err(&"partition file does not match the job's domain"));
    }
    while let Some(batch) = stream.next().await {
        let batch = batch.map_err(|e| read_err(&e))?;
        let units = batch.column(0).as_string::<i32>().iter().map(|u| u.unwrap_or_default().to_string()).collect();
        let values = domain
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
        sink(EncodedBatch { units, values })?;
    }
    Ok(())
}
