//! A partition read in passes over its units, so that what a worker holds at once stays
//! within a public bound whatever the partition's size. A pass keeps the units whose
//! digest falls in its class (a residue modulo a power of two) and caps them (`cap`); a
//! pass whose units' size (`Capper::size`: per unit the smaller of its rows read and a
//! public bound, at least what it holds) would pass [`PASS_BYTES`] is abandoned before any
//! of it is used, and read again as two (its class split by the next bit of the digest).
//! A unit alone always fits: the plan refuses caps under which its rows might hold more
//! than a quarter of a pass (`cap::UNIT_ROWS_BYTES`). The first passes follow the
//! partition files' row counts, from their footers, so a pass splits only where its
//! units' digests fall unevenly.
//!
//! How many passes a partition takes follows its rows read, never which rows the caps
//! keep: the data's size, which changes only how long its task runs, and which no
//! submitter sees before a schedule boundary, as the time of any private read. Each pass
//! reads the whole partition again: a partition whose rows fill many passes takes as many
//! readings (the worker's log says how many), so a job should have enough partitions for
//! each to fill about one.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::cap::{CAPPED_KEYS_HELD, Capper, DroppedRows, row_read_bytes, unit_overhead};
use super::view::{Layout, UnitRows};
use crate::data::DataError;
use crate::data::parquet_io;
use crate::data::partition::PartitionReader;
use crate::storage;

/// What one pass's units may hold on a worker, by `Capper::size`'s account: what a count
/// task holds of its partition at once, beside a view's batches.
pub const PASS_BYTES: u64 = 256 << 20;

/// The units of a pass: those whose digest is `residue` modulo `modulus`, a power of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pass {
    residue: u64,
    modulus: u64,
}

impl Pass {
    /// Every unit.
    pub const ALL: Pass = Pass { residue: 0, modulus: 1 };

    /// The passes of `count` classes (a power of two) that together hold every unit.
    fn classes(count: u64) -> impl DoubleEndedIterator<Item = Pass> {
        (0..count).map(move |residue| Pass { residue, modulus: count })
    }

    fn holds(&self, unit: &str) -> bool {
        let digest = Sha256::digest(unit.as_bytes());
        u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")) & (self.modulus - 1) == self.residue
    }

    /// Its units in two passes, by the next bit of their digest (`None`: no bit left).
    fn split(self) -> Option<[Pass; 2]> {
        let modulus = self.modulus.checked_mul(2)?;
        Some([Pass { residue: self.residue, modulus }, Pass { residue: self.residue + self.modulus, modulus }])
    }
}

/// A pass's units, capped, and what the caps left out of each table.
pub type CappedUnits = (BTreeMap<String, UnitRows>, Vec<DroppedRows>);

/// Reads `urls` (the same partition index of every table, in layout order): the units of
/// `pass`, whole, each capped by the spec's public rule (`cap`), each table's kept rows in
/// the order of their places; and what the cap left out of each table. With a `limit`,
/// remembering [`CAPPED_KEYS_HELD`] capped keys a unit and table, and `None` when their size
/// would pass it (then nothing of them is returned); without, every capped key.
pub async fn read_pass(
    layout: &Layout,
    urls: &[String],
    pass: Pass,
    limit: Option<u64>,
) -> Result<Option<CappedUnits>, DataError> {
    if urls.len() != layout.tables.len() {
        return Err(DataError::Internal(format!("{} partition files for {} tables", urls.len(), layout.tables.len())));
    }
    let mut capper = Capper::new(layout, if limit.is_some() { CAPPED_KEYS_HELD } else { usize::MAX });
    for (t, (table, url)) in layout.tables.iter().zip(urls).enumerate() {
        let domain = table.read_domain();
        let mut reader = PartitionReader::open(url, &domain).await?;
        while let Some(batch) = reader.next_batch().await? {
            for (i, unit) in batch.units.iter().enumerate() {
                if pass.modulus == 1 || pass.holds(unit) {
                    capper.push(t, unit, batch.values.iter().map(|column| column[i]).collect());
                    if let Some(limit) = limit.filter(|&limit| capper.size() > limit) {
                        // Its rows count for at most a quarter of a pass (`UNIT_ROWS_BYTES`):
                        // only an id of some 192 MiB makes one unit too large, which no
                        // split would help.
                        if capper.unit_size(unit) > limit {
                            return Err(DataError::Internal("a unit whose id alone fills a pass".into()));
                        }
                        return Ok(None);
                    }
                }
            }
        }
    }
    Ok(Some(capper.finish()))
}

/// Reads `urls` as [`read_pass`] reads them, every unit at once: what a check of one
/// partition reads (the owner's evaluation, tests), unbounded.
pub async fn read_units(layout: &Layout, urls: &[String]) -> Result<CappedUnits, DataError> {
    Ok(read_pass(layout, urls, Pass::ALL, None).await?.expect("no limit"))
}

/// `urls` read in passes, each holding at most `limit` bytes ([`PASS_BYTES`] on a worker),
/// a pass's units at a time; with what the caps left out of each table of the passes read.
pub struct PassReader<'a> {
    layout: &'a Layout,
    urls: &'a [String],
    limit: u64,
    /// The passes still to read, the next last.
    pending: Vec<Pass>,
    dropped: Vec<DroppedRows>,
    /// Readings of the partition so far, a split pass's included.
    readings: u32,
}

impl<'a> PassReader<'a> {
    pub async fn open(layout: &'a Layout, urls: &'a [String], limit: u64) -> Result<Self, DataError> {
        let pending = Pass::classes(first_classes(layout, urls, limit).await?).rev().collect();
        let dropped = vec![DroppedRows::default(); layout.tables.len()];
        Ok(Self { layout, urls, limit, pending, dropped, readings: 0 })
    }

    /// The next pass's units, capped (`None`: every unit was read).
    pub async fn next_pass(&mut self) -> Result<Option<BTreeMap<String, UnitRows>>, DataError> {
        while let Some(pass) = self.pending.pop() {
            self.readings += 1;
            let Some((units, left_out)) = read_pass(self.layout, self.urls, pass, Some(self.limit)).await? else {
                // (Without a bit left: units whose digests share 64 bits, more than a pass
                // holds together.)
                let [first, second] = pass
                    .split()
                    .ok_or_else(|| DataError::Internal("units whose digests agree in every bit fill a pass".into()))?;
                self.pending.extend([second, first]);
                continue;
            };
            self.dropped.iter_mut().zip(&left_out).for_each(|(total, d)| total.add(d));
            return Ok(Some(units));
        }
        Ok(None)
    }

    /// How many times the partition was read so far (a pass split, its reading too).
    pub fn readings(&self) -> u32 {
        self.readings
    }

    /// What the caps left out of each table, in the passes read so far.
    pub fn dropped(&self) -> &[DroppedRows] {
        &self.dropped
    }
}

/// How many classes the first passes over `urls` take: as many (a power of two) as their
/// rows' size (`Capper::size`, each unit's name taken as 32 bytes) fills passes of `limit`
/// bytes.
async fn first_classes(layout: &Layout, urls: &[String], limit: u64) -> Result<u64, DataError> {
    let mut bytes: u64 = 0;
    for (t, url) in urls.iter().enumerate() {
        let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.clone(), message: e.to_string() };
        let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
        let rows: u64 = parquet_io::row_group_rows(location.store, path).await.map_err(|e| read_err(&e))?.iter().sum();
        let unit = if t == 0 { unit_overhead(layout) + 32 } else { 0 };
        bytes = bytes.saturating_add(rows.saturating_mul(row_read_bytes(layout, t) + unit));
    }
    Ok(bytes.div_ceil(limit.max(1)).max(1).next_power_of_two())
}
