//! The public rule that caps a unit's rows, applied to one unit's rows alone, as read, on
//! the worker that reads the unit whole ([`super::read_units`]).
//!
//! The root keeps the unit's first row. A child table keeps at most its `max_per_parent`
//! rows of each kept parent row: the first by `order_by` (missing values last, ties in the
//! order read), or without it a sample whose draw for a row is a hash, under a fixed
//! public key, of the table, the unit, its parent and its place among that parent's rows.
//! A row whose parent is absent among the unit's kept rows (not in the parent table, dropped
//! by a cap, or another unit's) is left out, so a dropped admission takes its charts with
//! it; a row whose own key repeats one of the unit's kept rows is kept, and its children go
//! to the first. Which rows a unit keeps is a function of its own rows alone: adding or
//! removing a unit changes no other unit's, wherever their rows sit in the files.
//!
//! Rows arrive as partitioned ([`super::partition`]), a table's after its parent's: their
//! values, then (a child's) the hashes of their own key and of their parent's; each is
//! capped as it comes ([`Capper`]), so what a worker holds is bounded by the caps, not by
//! the rows read. They leave as views read them: their values, then their ordinal among
//! the unit's kept rows of the table (in parent order, then cap order) and their parent's.
//! What was dropped is counted, not shown: the counts are private (the operator's log).
//!
//! What a unit holds while it is capped is bounded by its caps alone
//! ([`unit_rows_bytes`]): its kept rows, a cap's candidates per parent row, their keys,
//! and (reading in passes) at most [`CAPPED_KEYS_HELD`] keys of rows a cap dropped per
//! table. It is bounded by the rows read of it too, as [`row_read_bytes`] counts them. The
//! capper's [`Capper::size`] adds up, per unit, the smaller of the two bounds (the caps'
//! at most [`UNIT_ROWS_BYTES`], which the plan checks): what reading in passes keeps
//! within a public bound (`passes`). A function of the rows read, never of which rows the
//! caps keep, so that when a pass splits follows the data's size, not the caps a
//! submitter chose.

use std::cmp::Ordering;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use sha2::{Digest, Sha256};

use super::view::{Layout, UnitRows};

/// Keys the sample that caps a table without `order_by`: public and fixed, so a rerun on
/// the same files keeps the same rows. It is not privacy noise: the cap bounds a unit's
/// rows whichever rows it keeps, and the kept rows are a function of that unit's own rows,
/// so nothing rests on the draw being secret (and no accounting claims amplification by
/// this sample). The worker's reservoir draws from the OS instead because it picks rows
/// afresh for each count.
const CAP_SAMPLE_KEY: &[u8] = b"rhosynth database cap sample v1";

/// Keys of rows a cap dropped that a unit remembers per table when read in passes, so
/// their children are counted as over the cap. Beyond them a capped row's children count
/// as without their parent: dropped all the same, and what a unit holds stays bounded by
/// its caps, not by the rows it has beyond them. (A whole reading, `read_units`,
/// remembers every one.)
pub const CAPPED_KEYS_HELD: usize = 4096;

/// The most a unit's rows count for in [`Capper::size`]: the plan refuses caps under which
/// one unit's rows could hold more ([`unit_rows_bytes`]), so a pass (`passes::PASS_BYTES`,
/// four times this) always holds a unit, whatever its rows.
pub const UNIT_ROWS_BYTES: u64 = 64 << 20;

/// What holding a row costs beside its values: its vector, a candidate's rank, order and
/// key, its slot in a heap or a list. With [`VALUE_BYTES`], [`KEY_BYTES`] and
/// [`GROUP_BYTES`], an account of a worker's memory generous rather than exact: what the
/// bound on it is checked against.
const ROW_BYTES: u64 = 96;
/// A held value (an `Option<f64>`).
const VALUE_BYTES: u64 = 16;
/// A held key and its slot in a map or a set.
const KEY_BYTES: u64 = 48;
/// A parent row's group of candidates, as much as one child row can cost: its heap's
/// first allocation (room for four) and its node in the unit's map of groups.
const GROUP_BYTES: u64 = 288;
/// A unit beside its rows and its name: its tables' lists and maps at their first
/// allocations.
const UNIT_BYTES: u64 = 640;
const UNIT_TABLE_BYTES: u64 = 320;

/// What holding a row of `values` values costs ([`ROW_BYTES`]).
pub fn row_bytes(values: usize) -> u64 {
    ROW_BYTES + VALUE_BYTES * values as u64
}

/// What a row of table `t` counts for as read, as its partition holds it (a child's with
/// its key and its share of a group of candidates): the most holding it or its key can
/// cost.
pub fn row_read_bytes(layout: &Layout, t: usize) -> u64 {
    let table = &layout.tables[t];
    row_bytes(table.read_domain().columns.len()) + if table.parent.is_some() { KEY_BYTES + GROUP_BYTES } else { 0 }
}

/// What a unit costs beside its rows and its name.
pub fn unit_overhead(layout: &Layout) -> u64 {
    UNIT_BYTES + UNIT_TABLE_BYTES * layout.tables.len() as u64
}

/// The most one unit's rows hold while it is capped in passes, from the caps alone: in
/// each table its kept rows (at most the table's reach) with their keys, while the table
/// is read a cap's candidates beyond them per parent row, and the capped keys it
/// remembers of a table with children. Public: what the plan refuses caps by.
pub fn unit_rows_bytes(layout: &Layout) -> u64 {
    let mut bytes: u64 = 0;
    for t in 0..layout.tables.len() {
        let candidates = layout.reach(t) + layout.tables[t].parent.map_or(0, |p| layout.reach(p));
        bytes = bytes.saturating_add(candidates.saturating_mul(row_read_bytes(layout, t)));
        if layout.children(t).next().is_some() {
            bytes = bytes.saturating_add(CAPPED_KEYS_HELD as u64 * KEY_BYTES);
        }
    }
    bytes
}

/// Rows of one table that reading left out, by reason. Private: counts of the input.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DroppedRows {
    /// Beyond the cap of their parent row (the root: a unit's rows after its first), or
    /// whose parent row (or an ancestor's) a cap dropped (in passes, among the first
    /// [`CAPPED_KEYS_HELD`] a unit's table had dropped).
    pub over_cap: u64,
    /// Whose parent row is absent: not in the parent table (among its unit's rows),
    /// dropped from it for another reason than a cap, or (in passes) capped past the
    /// [`CAPPED_KEYS_HELD`] remembered.
    pub without_parent: u64,
    /// Whose own key another kept row already holds: their children go to the first.
    pub duplicate_keys: u64,
    /// That broke the table's schema (under `bad_rows = "skip"`): counted as partitioned.
    pub bad: u64,
}

impl DroppedRows {
    /// Adds what a cap left out elsewhere (another pass, another partition) to this.
    pub fn add(&mut self, other: &DroppedRows) {
        self.over_cap += other.over_cap;
        self.without_parent += other.without_parent;
        self.duplicate_keys += other.duplicate_keys;
        self.bad += other.bad;
    }
}

/// A row's values as read.
type Row = Vec<Option<f64>>;

/// A child row competing for its parent's cap: the smallest ranks are kept.
struct Candidate {
    rank: f64,
    seq: usize,
    row: Row,
    key: Option<u64>,
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

/// The rows of one parent row competing for its cap, and how many have competed.
#[derive(Default)]
struct Group {
    kept: BinaryHeap<Candidate>,
    seen: u64,
}

/// A child row's parent row, as looked up.
enum Parent {
    /// Kept, at this ordinal among its unit's rows of the parent table.
    At(u32),
    /// Dropped by a cap.
    Capped,
    Absent,
}

/// A key's hash as a partition holds it: exact in a double.
fn key_of(value: Option<f64>) -> Option<u64> {
    value.map(|v| v as u64)
}

/// One unit's rows as capped so far.
struct Unit {
    /// Its kept rows of each table read (values, then a child's ordinal and parent's).
    kept: Vec<Vec<Row>>,
    /// Per table, its kept rows' ordinals by own key, and the keys of the rows a cap
    /// dropped (on them or on an ancestor: their children are dropped by the cap too).
    places: Vec<HashMap<u64, u32>>,
    capped: Vec<HashSet<u64>>,
    /// The table being read: its rows competing for their parents' caps, by parent, and
    /// how many of its rows the unit has had.
    groups: BTreeMap<u32, Group>,
    read: usize,
    /// Its rows read so far, as [`row_read_bytes`] counts them.
    read_bytes: u64,
}

/// A partition's units capped as their rows are read, table by table in layout order
/// (each table's rows whole before the next's, in the order read). What it holds is a
/// unit's kept rows and, while a table is read, at most a cap's rows a parent row (and
/// keys of rows a cap dropped): never the rows as read.
pub struct Capper<'l> {
    layout: &'l Layout,
    units: BTreeMap<String, Unit>,
    /// The table whose rows arrive.
    table: usize,
    dropped: Vec<DroppedRows>,
    /// Capped keys a unit remembers per table.
    remembered: usize,
    /// [`Self::size`].
    size: u64,
}

impl<'l> Capper<'l> {
    /// A capper remembering at most `remembered` capped keys a unit and table
    /// ([`CAPPED_KEYS_HELD`] when reading in passes).
    pub fn new(layout: &'l Layout, remembered: usize) -> Self {
        let dropped = vec![DroppedRows::default(); layout.tables.len()];
        Self { layout, units: BTreeMap::new(), table: 0, dropped, remembered, size: 0 }
    }

    /// Per unit, what it costs beside its rows, its name, and the smaller of its rows
    /// read ([`row_read_bytes`]) and [`UNIT_ROWS_BYTES`], added up: at least what it holds
    /// (under caps the plan admits), a function of the rows read alone.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// What `unit` alone counts for in [`Self::size`] (nothing if it has no root row).
    pub fn unit_size(&self, unit: &str) -> u64 {
        self.units
            .get(unit)
            .map_or(0, |state| unit_overhead(self.layout) + unit.len() as u64 + state.read_bytes.min(UNIT_ROWS_BYTES))
    }

    /// Counts a row of `bytes` read of a unit that holds `state`.
    fn count_read(size: &mut u64, state: &mut Unit, bytes: u64) {
        let before = state.read_bytes.min(UNIT_ROWS_BYTES);
        state.read_bytes = state.read_bytes.saturating_add(bytes);
        *size += state.read_bytes.min(UNIT_ROWS_BYTES) - before;
    }

    /// A row of table `t` of `unit`, as read: its values, then (a child's) its own key's
    /// and its parent key's hashes. Tables come in layout order.
    pub fn push(&mut self, t: usize, unit: &str, row: Row) {
        assert!(t >= self.table && t < self.layout.tables.len(), "tables in layout order");
        while self.table < t {
            self.close_table();
        }
        let tables = self.layout.tables.len();
        let read_bytes = row_read_bytes(self.layout, t);
        let Some(p) = self.layout.tables[t].parent else {
            let size = &mut self.size;
            let state = self.units.entry(unit.to_string()).or_insert_with(|| {
                *size += unit_overhead(self.layout) + unit.len() as u64;
                Unit {
                    kept: vec![Vec::new(); tables],
                    places: vec![HashMap::new(); tables],
                    capped: vec![HashSet::new(); tables],
                    groups: BTreeMap::new(),
                    read: 0,
                    read_bytes: 0,
                }
            });
            Self::count_read(size, state, read_bytes);
            match state.kept[0].is_empty() {
                true => state.kept[0].push(row),
                false => self.dropped[0].over_cap += 1,
            }
            return;
        };
        // A unit without a root row keeps nothing: its rows are without their parent.
        let Some(state) = self.units.get_mut(unit) else {
            self.dropped[t].without_parent += 1;
            return;
        };
        Self::count_read(&mut self.size, state, read_bytes);
        let table = &self.layout.tables[t];
        let own = table.values();
        let referred = self.layout.children(t).next().is_some();
        let key = key_of(row[own]);
        let parent = match (p, key_of(row[own + 1])) {
            (0, _) => Parent::At(0),
            (_, None) => Parent::Absent,
            (_, Some(parent)) => match state.places[p].get(&parent) {
                Some(&at) => Parent::At(at),
                None if state.capped[p].contains(&parent) => Parent::Capped,
                None => Parent::Absent,
            },
        };
        let parent = match parent {
            Parent::At(parent) => parent,
            Parent::Capped => {
                self.dropped[t].over_cap += 1;
                remember_capped(&mut state.capped[t], key.filter(|_| referred), self.remembered);
                return;
            }
            Parent::Absent => {
                self.dropped[t].without_parent += 1;
                return;
            }
        };
        let group = state.groups.entry(parent).or_default();
        let rank = match table.order_by {
            // Missing last: never kept before a row with a value.
            Some(d) => row[d].unwrap_or(f64::INFINITY),
            None => sample_rank(&table.name, unit, parent, group.seen),
        };
        group.seen += 1;
        group.kept.push(Candidate { rank, seq: state.read, row, key });
        state.read += 1;
        if group.kept.len() > table.max_per_parent as usize {
            let over = group.kept.pop().expect("over the cap");
            remember_capped(&mut state.capped[t], over.key.filter(|_| referred), self.remembered);
            self.dropped[t].over_cap += 1;
        }
    }

    /// The table read so far closed: each unit's kept rows of it in parent order, then cap
    /// order, numbered; the next table's rows may come.
    fn close_table(&mut self) {
        let t = self.table;
        let own = self.layout.tables[t].values();
        for state in self.units.values_mut() {
            for (parent, group) in std::mem::take(&mut state.groups) {
                for candidate in group.kept.into_sorted_vec() {
                    let ordinal = state.kept[t].len() as u32;
                    if let Some(key) = candidate.key {
                        match state.places[t].entry(key) {
                            Entry::Occupied(_) => self.dropped[t].duplicate_keys += 1,
                            Entry::Vacant(slot) => {
                                slot.insert(ordinal);
                            }
                        }
                    }
                    let mut row = candidate.row;
                    row.truncate(own);
                    row.extend([Some(f64::from(ordinal)), Some(f64::from(parent))]);
                    state.kept[t].push(row);
                }
            }
            state.read = 0;
        }
        self.table += 1;
    }

    /// Every unit's kept rows, and what the caps left out of each table.
    pub fn finish(mut self) -> (BTreeMap<String, UnitRows>, Vec<DroppedRows>) {
        while self.table < self.layout.tables.len() {
            self.close_table();
        }
        let units = self.units.into_iter().map(|(unit, state)| (unit, UnitRows { tables: state.kept })).collect();
        (units, self.dropped)
    }
}

/// Remembers a capped row's key while a unit holds fewer than `remembered` of its table's.
fn remember_capped(capped: &mut HashSet<u64>, key: Option<u64>, remembered: usize) {
    if let Some(key) = key.filter(|_| capped.len() < remembered) {
        capped.insert(key);
    }
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
