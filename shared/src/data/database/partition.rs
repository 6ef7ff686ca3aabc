//! Reading a database by unit and capping it: every table's rows under their root unit,
//! one set of partitions per table keyed by one partition key. The root keeps one row per
//! unit; a child table keeps at most its `max_per_parent` rows per parent row by the
//! spec's public rule (the first by `order_by`, else a keyed sample), a dropped row's
//! children go with it, and a row whose parent is absent is left out.
//!
//! Each unit's rows are read from their own unit key and capped among themselves alone
//! (a row's parent is looked up among its unit's rows; a sample's draw is keyed by the
//! row's unit, parent and place among that parent's rows): adding or removing one unit's
//! rows, wherever they sit in the files, changes no other unit's kept rows.
//!
//! The coordinator holds the kept rows of the child tables in memory while it caps them.
//! What was dropped is counted, not shown: the counts are private (the operator's log).

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet};

use sha2::{Digest, Sha256};

use super::{Database, Layout};
use crate::data::domain::Domain;
use crate::data::input::{BATCH_ROWS, InputReader, KeyedBatch};
use crate::data::partition::{PartitionKey, PartitionWriter, Partitioned};
use crate::data::{DataError, EncodedBatch};
use crate::spec::TableSpec;
use crate::storage::StoreLocation;

/// Keys the sample that caps a table without `order_by`: public and fixed, so a rerun on
/// the same files keeps the same rows. It is not privacy noise: the cap bounds a unit's
/// rows whichever rows it keeps, and the kept rows are a function of that unit's own rows,
/// so nothing rests on the draw being secret (and no accounting claims amplification by
/// this sample). The worker's reservoir draws from the OS instead because it picks rows
/// afresh for each count.
const CAP_SAMPLE_KEY: &[u8] = b"rhosynth database cap sample v1";

/// Rows of one table that reading left out, by reason. Private: counts of the input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DroppedRows {
    /// Beyond the cap of their parent row (the root: a unit's rows after its first), or
    /// whose parent row (or an ancestor's) a cap dropped.
    pub over_cap: u64,
    /// Whose parent row is absent: not in the parent table (among its unit's rows), or
    /// dropped from it for another reason than a cap.
    pub without_parent: u64,
    /// Whose own key another kept row already holds: their children go to the first.
    pub duplicate_keys: u64,
    /// That broke the table's schema (under `bad_rows = "skip"`).
    pub bad: u64,
}

/// One table's partitions.
pub struct PartitionedTable {
    pub name: String,
    pub domain: Domain,
    pub partitions: Partitioned,
    pub dropped: DroppedRows,
}

/// The kept rows of a table that has children: each one's ordinal by unit and own key.
type Places = HashMap<(String, String), u32>;

/// The rows of a table dropped by a cap, on them or on an ancestor: by unit and own key
/// (their children are dropped by the cap too, not for want of a parent).
type Capped = HashSet<(String, String)>;

/// Where a child table's parent rows are: the root's units, or a table's places.
enum Parents<'p> {
    Root(&'p HashSet<String>),
    Table(&'p Places, &'p Capped),
}

/// A child row's parent row, as looked up.
enum Parent {
    /// Kept, at this ordinal among its unit's rows of the parent table.
    At(u32),
    /// Dropped by a cap.
    Capped,
    Absent,
}

impl Parents<'_> {
    /// The parent row of a row of `unit` referring to `key`: looked up among that unit's
    /// rows only.
    fn find(&self, unit: &str, key: Option<&String>) -> Parent {
        match (self, key) {
            (Parents::Root(units), _) if units.contains(unit) => Parent::At(0),
            (Parents::Table(places, capped), Some(key)) => {
                let key = (unit.to_string(), key.clone());
                match places.get(&key) {
                    Some(at) => Parent::At(*at),
                    None if capped.contains(&key) => Parent::Capped,
                    None => Parent::Absent,
                }
            }
            _ => Parent::Absent,
        }
    }
}

/// A child row competing for its parent's cap: the smallest ranks are kept.
struct Candidate {
    rank: f64,
    seq: u64,
    values: Vec<Option<f64>>,
    key: Option<String>,
}

impl Candidate {
    fn order(&self, other: &Self) -> Ordering {
        self.rank.total_cmp(&other.rank).then(self.seq.cmp(&other.seq))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.order(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order(other)
    }
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
    let referred: HashSet<&str> = db.tables.iter().map(|t| t.parent.table.as_str()).collect();
    let layout = Layout::of(db);
    // Every table's files fit its columns before any row of any table is read.
    InputReader::new(db.root_input, db.root_schema, &layout.tables[0].domain).check_headers().await?;
    for table in db.tables {
        let (schema, columns) = (table.schema(db.unit_key()), Domain::of_columns(&table.columns, db.default_bins));
        InputReader::new(&table.input, &schema, &columns).with_keys(keys_read(table)).check_headers().await?;
    }
    let (root, units) = partition_root(db, &layout.tables[0].domain, scratch, prefix, partitions, key.clone()).await?;
    let mut places: HashMap<String, (Places, Capped)> = HashMap::new();
    let mut out = vec![root];
    for (table, layout) in db.tables.iter().zip(&layout.tables[1..]) {
        let parents = if table.parent.table == db.root_name() {
            Parents::Root(&units)
        } else {
            let (places, capped) =
                places.get(&table.parent.table).expect("a validated parent, read before its children");
            Parents::Table(places, capped)
        };
        let referred = referred.contains(table.name.as_str());
        let (partitioned, own) =
            partition_child(db, (table, &layout.domain, referred), parents, scratch, prefix, partitions, key.clone())
                .await?;
        if referred {
            places.insert(table.name.clone(), own);
        }
        out.push(partitioned);
    }
    Ok(out)
}

/// The root: a unit's first row, streamed into its partitions. Returns the units.
async fn partition_root(
    db: &Database<'_>,
    domain: &Domain,
    scratch: &StoreLocation,
    prefix: &str,
    partitions: u32,
    key: PartitionKey,
) -> Result<(PartitionedTable, HashSet<String>), DataError> {
    let name = db.root_name().to_string();
    let mut writer = PartitionWriter::new(scratch, &format!("{prefix}/{name}"), domain, partitions, key)?;
    let mut reader = InputReader::new(db.root_input, db.root_schema, domain);
    let mut units = HashSet::new();
    let mut dropped = DroppedRows::default();
    while let Some(batch) = reader.next_batch().await? {
        let repeated: Vec<bool> = batch.units.iter().map(|unit| !units.insert(unit.clone())).collect();
        dropped.over_cap += repeated.iter().filter(|r| **r).count() as u64;
        writer.write(batch.without(&repeated)).await?;
    }
    dropped.bad = reader.skipped().map_or(0, |s| s.rows);
    let partitions = writer.finish().await?;
    Ok((PartitionedTable { name, domain: domain.clone(), partitions, dropped }, units))
}

/// The rows of one parent row competing for its cap, and how many have competed.
#[derive(Default)]
struct Group {
    kept: BinaryHeap<Candidate>,
    seen: u64,
}

/// The keys a child table's rows are read with: its parent's, then its own if declared.
fn keys_read(table: &TableSpec) -> Vec<&str> {
    std::iter::once(table.parent.key.as_str()).chain(table.key.as_deref()).collect()
}

/// A child table: each parent row's rows capped, then written in unit order with their
/// places. Returns the kept rows' places by unit and own key, and (for a table with
/// children: `referred`) the keys of the rows a cap dropped.
async fn partition_child(
    db: &Database<'_>,
    (table, domain, referred): (&TableSpec, &Domain, bool),
    parents: Parents<'_>,
    scratch: &StoreLocation,
    prefix: &str,
    partitions: u32,
    key: PartitionKey,
) -> Result<(PartitionedTable, (Places, Capped)), DataError> {
    let schema = table.schema(db.unit_key());
    let columns = Domain::of_columns(&table.columns, db.default_bins);
    let mut reader = InputReader::new(&table.input, &schema, &columns).with_keys(keys_read(table));
    let order = table.order_by.as_deref().and_then(|o| columns.index_of(o));
    let cap = table.max_per_parent as usize;
    let mut groups: HashMap<(String, u32), Group> = HashMap::new();
    let mut dropped = DroppedRows::default();
    let mut capped = Capped::new();
    let mut seq = 0u64;
    while let Some(KeyedBatch { rows, keys }) = reader.next_keyed_batch().await? {
        let mut keys = keys.into_iter();
        let parent_keys = keys.next().expect("the parent key is read");
        let own_keys = keys.next().unwrap_or_default();
        for (i, unit) in rows.units.iter().enumerate() {
            let own_key = || own_keys.get(i).cloned().flatten();
            let parent = match parents.find(unit, parent_keys[i].as_ref()) {
                Parent::At(parent) => parent,
                Parent::Capped => {
                    dropped.over_cap += 1;
                    capped.extend(own_key().filter(|_| referred).map(|key| (unit.clone(), key)));
                    continue;
                }
                Parent::Absent => {
                    dropped.without_parent += 1;
                    continue;
                }
            };
            let group = groups.entry((unit.clone(), parent)).or_default();
            let rank = match order {
                // Missing last: never kept before a row with a value.
                Some(d) => rows.values[d][i].unwrap_or(f64::INFINITY),
                None => sample_rank(&table.name, unit, parent, group.seen),
            };
            group.seen += 1;
            seq += 1;
            let values = rows.values.iter().map(|column| column[i]).collect();
            group.kept.push(Candidate { rank, seq, values, key: own_key() });
            if group.kept.len() > cap {
                let dropped_row = group.kept.pop().expect("over the cap");
                capped.extend(dropped_row.key.filter(|_| referred).map(|key| (unit.clone(), key)));
                dropped.over_cap += 1;
            }
        }
    }
    dropped.bad = reader.skipped().map_or(0, |s| s.rows);

    // A unit's kept rows in parent order, then cap order.
    let mut kept: Vec<((String, u32), Candidate)> = groups
        .into_iter()
        .flat_map(|(parent, group)| group.kept.into_vec().into_iter().map(move |row| (parent.clone(), row)))
        .collect();
    kept.sort_by(|(a, x), (b, y)| a.cmp(b).then(x.order(y)));

    let mut writer = PartitionWriter::new(scratch, &format!("{prefix}/{}", table.name), domain, partitions, key)?;
    let mut own = Places::new();
    let mut batch = EncodedBatch::empty(domain.columns.len());
    let mut ordinal = 0u32;
    let mut previous: Option<String> = None;
    for ((unit, parent), row) in kept {
        ordinal = if previous.as_ref() == Some(&unit) { ordinal + 1 } else { 0 };
        if let Some(key) = row.key {
            match own.entry((unit.clone(), key)) {
                Entry::Occupied(_) => dropped.duplicate_keys += 1,
                Entry::Vacant(slot) => {
                    slot.insert(ordinal);
                }
            }
        }
        let links = [Some(f64::from(ordinal)), Some(f64::from(parent))];
        for (column, value) in batch.values.iter_mut().zip(row.values.into_iter().chain(links)) {
            column.push(value);
        }
        batch.units.push(unit.clone());
        previous = Some(unit);
        if batch.len() == BATCH_ROWS {
            writer.write(std::mem::replace(&mut batch, EncodedBatch::empty(domain.columns.len()))).await?;
        }
    }
    writer.write(batch).await?;
    let partitions = writer.finish().await?;
    Ok((PartitionedTable { name: table.name.clone(), domain: domain.clone(), partitions, dropped }, (own, capped)))
}

/// A row's draw in the sample that caps its parent's rows, in [0, 1): keyed by its table,
/// its unit, its parent and its place among that parent's rows as read, and nothing else.
fn sample_rank(table: &str, unit: &str, parent: u32, place: u64) -> f64 {
    let mut hash = Sha256::new();
    for part in [CAP_SAMPLE_KEY, table.as_bytes(), unit.as_bytes()] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    hash.update(parent.to_le_bytes());
    hash.update(place.to_le_bytes());
    let digest = hash.finalize();
    let bits = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
