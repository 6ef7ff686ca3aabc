//! Reading a database by unit: every table's rows under their root unit, as read, into one
//! set of partitions per table under one partition key, so a unit's rows in every table
//! land in the same partition index and a worker reads the unit whole. Nothing is capped
//! or joined here: the worker that reads a unit caps it ([`super::cap`]), its rows alone.
//! A child row carries, beside its values, its own key and its parent's key as keyed
//! hashes under a key derived from the job's partition key ([`super::KEY_COLUMN`],
//! [`super::PARENT_KEY_COLUMN`]: `PartitionKey::row_keys`), and a partition holds a unit's
//! rows in the order they were read (what the cap's ties and sample follow).
//!
//! The workers partition a database as they partition one table, a shard at a time
//! (`data::shard`), a table after another under one key ([`shard_jobs`]): a shard's
//! reader hashes its rows' keys, and the partitions are row for row those the
//! coordinator's own reading writes ([`partition_database`], under `partition_by =
//! "coordinator"` and for an owner's evaluation). There, rows stream from the files into
//! the partition writers: the coordinator holds no row and no key, but each partition's
//! buffers (a row group and its upload) and a 16-byte digest a unit to count them.

use super::Database;
use super::view::Layout;
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::input::InputReader;
use crate::data::partition::{PartitionKey, PartitionWriter, Partitioned};
use crate::data::shard::ShardJob;
use crate::data::source::Source;
use crate::spec::TableSpec;
use crate::storage::{self, StoreLocation};

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
    check_headers(db).await?;
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
        while let Some(keyed) = reader.next_keyed_batch().await? {
            writer.write(row_keys.hashed(keyed)).await?;
        }
        let bad = reader.skipped().map_or(0, |s| s.rows);
        out.push(PartitionedTable { name: table.name.clone(), domain, partitions: writer.finish().await?, bad });
    }
    Ok(out)
}

/// Checks that every table's files fit its columns, before any row of any table is read.
pub async fn check_headers(db: &Database<'_>) -> Result<(), DataError> {
    let root = Domain::of_columns(&db.root_schema.columns, db.default_bins);
    InputReader::new(db.root_input, db.root_schema, &root).check_headers().await?;
    for table in db.tables {
        let (schema, columns) = (table.schema(db.unit_key()), Domain::of_columns(&table.columns, db.default_bins));
        InputReader::new(&table.input, &schema, &columns).with_keys(keys_read(table)).check_headers().await?;
    }
    Ok(())
}

/// What the workers partition `db` by (`data::shard`): a job a table, in layout order,
/// with the table's name, each writing `partitions` partitions under
/// `partitions_url/<table>`, as [`partition_database`] writes them (the same rows in the
/// same order for a key). Files named absolutely, as the ledger binds them.
pub fn shard_jobs(db: &Database<'_>, partitions_url: &str, partitions: u32) -> Vec<(String, ShardJob)> {
    let layout = Layout::of(db);
    let absolute = |input: &Source| Source {
        urls: input.urls.iter().map(|u| storage::absolute_url(u)).collect(),
        ..input.clone()
    };
    let tables = std::iter::once((db.root_input, db.root_schema.clone(), Vec::new()))
        .chain(db.tables.iter().map(|t| (&t.input, t.schema(db.unit_key()), keys_read(t))));
    tables
        .zip(&layout.tables)
        .map(|((input, schema, keys), laid)| {
            let job = ShardJob {
                input: absolute(input),
                schema,
                domain: laid.read_domain(),
                partitions_url: format!("{}/{}", partitions_url.trim_end_matches('/'), laid.name),
                partitions,
                keys: keys.into_iter().map(str::to_string).collect(),
            };
            (laid.name.clone(), job)
        })
        .collect()
}

/// The keys a child table's rows are read with: its parent's, then its own if declared.
pub fn keys_read(table: &TableSpec) -> Vec<&str> {
    std::iter::once(table.parent.key.as_str()).chain(table.key.as_deref()).collect()
}
