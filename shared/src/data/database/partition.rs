//! Reading a database by unit: every table's rows under their root unit, as read, into one
//! set of partitions per table under one partition key, so a unit's rows in every table
//! land in the same partition index and a worker reads the unit whole. Nothing is capped
//! or joined here: the worker that reads a unit caps it ([`super::cap`]), its rows alone.
//! A child row carries, beside its values, its own key and its parent's key as keyed
//! hashes under a key derived from the job's partition key ([`super::KEY_COLUMN`],
//! [`super::PARENT_KEY_COLUMN`]: `PartitionKey::row_keys`), and a partition holds a unit's
//! rows in the order they were read (what the cap's ties and sample follow).
//!
//! Rows stream from the files into the partition writers: the coordinator holds no row
//! and no key, so its memory does not grow with the rows (the writers keep a 16-byte
//! digest a unit to count them, and each partition's buffers: a row group and its upload).

use super::Database;
use super::view::Layout;
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::input::{InputReader, KeyedBatch};
use crate::data::partition::{PartitionKey, PartitionWriter, Partitioned};
use crate::spec::TableSpec;
use crate::storage::StoreLocation;

/// One table's partitions, its rows as read.
pub struct PartitionedTable {
    pub name: String,
    /// Its partitions' domain ([`super::view::TableLayout::read_domain`]).
    pub domain: Domain,
    pub partitions: Partitioned,
    /// Rows that broke the table's schema (under `bad_rows = "skip"`), left out as read.
    /// Private: a count of the input (the operator's log).
    pub bad: u64,
}

/// Reads every table of `db` and writes each into `partitions` partitions under
/// `prefix/<table>/`, a unit's rows in the same partition index in every table. Tables in
/// the order declared, the root first.
pub async fn partition_database(
    db: &Database<'_>,
    scratch: &StoreLocation,
    prefix: &str,
    partitions: u32,
    key: PartitionKey,
) -> Result<Vec<PartitionedTable>, DataError> {
    let layout = Layout::of(db);
    // Every table's files fit its columns before any row of any table is read.
    InputReader::new(db.root_input, db.root_schema, &layout.tables[0].domain).check_headers().await?;
    for table in db.tables {
        let (schema, columns) = (table.schema(db.unit_key()), Domain::of_columns(&table.columns, db.default_bins));
        InputReader::new(&table.input, &schema, &columns).with_keys(keys_read(table)).check_headers().await?;
    }
    let row_keys = key.row_keys();
    let root = layout.tables[0].read_domain();
    let mut writer =
        PartitionWriter::new(scratch, &format!("{prefix}/{}", db.root_name()), &root, partitions, key.clone())?;
    let mut reader = InputReader::new(db.root_input, db.root_schema, &root);
    while let Some(batch) = reader.next_batch().await? {
        writer.write(batch).await?;
    }
    let bad = reader.skipped().map_or(0, |s| s.rows);
    let partitioned = writer.finish().await?;
    let mut out =
        vec![PartitionedTable { name: db.root_name().to_string(), domain: root, partitions: partitioned, bad }];
    for (table, laid) in db.tables.iter().zip(&layout.tables[1..]) {
        let domain = laid.read_domain();
        let schema = table.schema(db.unit_key());
        let columns = Domain::of_columns(&table.columns, db.default_bins);
        let mut reader = InputReader::new(&table.input, &schema, &columns).with_keys(keys_read(table));
        let mut writer =
            PartitionWriter::new(scratch, &format!("{prefix}/{}", table.name), &domain, partitions, key.clone())?;
        while let Some(KeyedBatch { mut rows, keys }) = reader.next_keyed_batch().await? {
            let mut keys = keys.into_iter();
            let parent_keys = keys.next().expect("the parent key is read");
            let own_keys = keys.next().unwrap_or_else(|| vec![None; rows.len()]);
            rows.values.push(own_keys.iter().map(|k| k.as_deref().map(|k| row_keys.hash(k))).collect());
            rows.values.push(parent_keys.iter().map(|k| k.as_deref().map(|k| row_keys.hash(k))).collect());
            writer.write(rows).await?;
        }
        let bad = reader.skipped().map_or(0, |s| s.rows);
        out.push(PartitionedTable { name: table.name.clone(), domain, partitions: writer.finish().await?, bad });
    }
    Ok(out)
}

/// The keys a child table's rows are read with: its parent's, then its own if declared.
fn keys_read(table: &TableSpec) -> Vec<&str> {
    std::iter::once(table.parent.key.as_str()).chain(table.key.as_deref()).collect()
}
