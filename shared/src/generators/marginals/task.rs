//! The worker's side: contingency tables of bounded per-unit contributions, their wire
//! form, and the coordinator's check of what a worker returns.

use std::collections::HashMap;

use rand::CryptoRng;
use rand::rngs::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::data::domain::Domain;
use crate::data::{DataError, EncodedBatch};
use crate::entropy::os_rng;
use crate::sampling::Reservoir;
use crate::spec::JobSpec;

/// What a worker computes over its partitions (`CountTables` on the wire).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginalsTask {
    pub domain: Domain,
    /// Column indices of each measured table (1 or 2 columns).
    pub tables: Vec<Vec<usize>>,
    pub max_rows_per_unit: u32,
    /// Every unit is a single row (no unit column): no grouping needed.
    pub row_level: bool,
}

impl MarginalsTask {
    /// `tables` of `domain` counted over the units `spec` declares (rows, without a unit
    /// column), at most `max_rows_per_unit` rows from each.
    pub fn new(spec: &JobSpec, domain: &Domain, tables: Vec<Vec<usize>>, max_rows_per_unit: u32) -> Self {
        Self { domain: domain.clone(), tables, max_rows_per_unit, row_level: spec.schema.unit_column.is_none() }
    }

    /// Cells of each table.
    pub fn table_sizes(&self) -> Vec<usize> {
        self.tables.iter().map(|t| t.iter().map(|&c| self.domain.columns[c].bins()).product()).collect()
    }

    /// Each table's first cell in the concatenated counts, then the end.
    pub fn offsets(&self) -> Vec<usize> {
        let mut offsets = vec![0];
        for size in self.table_sizes() {
            offsets.push(offsets.last().unwrap() + size);
        }
        offsets
    }

    pub fn cells(&self) -> usize {
        self.table_sizes().iter().sum()
    }

    /// L2 sensitivity of the concatenated tables per unit: m·√K.
    pub fn sensitivity(&self) -> f64 {
        f64::from(self.max_rows_per_unit) * (self.tables.len() as f64).sqrt()
    }

    /// Worker side: counts of bounded contributions over the given rows.
    pub fn counter(&self) -> Result<Counter<'_, ChaCha20Rng>, DataError> {
        // Which rows of a unit are kept is private randomness: OS-keyed CSPRNG.
        let rng = os_rng().map_err(|e| DataError::Internal(e.to_string()))?;
        Ok(Counter { task: self, counts: vec![0.0; self.cells()], units: HashMap::new(), row_units: 0, rng })
    }

    /// Checks a worker's result: right size, non-negative whole counts, and no table with
    /// more than `units × m` — anything else is a broken or hostile worker.
    pub fn validate(&self, counts: &[f64], units: u64) -> Result<(), String> {
        if counts.len() != self.cells() {
            return Err(format!("expected {} cells, got {}", self.cells(), counts.len()));
        }
        if counts.iter().any(|c| !(c.is_finite() && *c >= 0.0 && c.fract() == 0.0)) {
            return Err("counts must be non-negative integers".into());
        }
        let limit = units as f64 * f64::from(self.max_rows_per_unit);
        let mut offset = 0;
        for size in self.table_sizes() {
            let total: f64 = counts[offset..offset + size].iter().sum();
            if total > limit {
                return Err(format!("a table sums to {total}, above units × max_rows_per_unit"));
            }
            offset += size;
        }
        Ok(())
    }
}

/// Accumulates a worker's contingency tables.
pub struct Counter<'a, R: CryptoRng> {
    task: &'a MarginalsTask,
    counts: Vec<f64>,
    /// Per unit: the kept rows' bins.
    units: HashMap<String, Reservoir<Vec<usize>>>,
    row_units: u64,
    rng: R,
}

impl<R: CryptoRng> Counter<'_, R> {
    fn add_row(counts: &mut [f64], task: &MarginalsTask, bins: &[usize]) {
        let mut offset = 0;
        for (table, size) in task.tables.iter().zip(task.table_sizes()) {
            let cell = table.iter().fold(0, |acc, &c| acc * task.domain.columns[c].bins() + bins[c]);
            counts[offset + cell] += 1.0;
            offset += size;
        }
    }

    pub fn add(&mut self, batch: &EncodedBatch) {
        let columns = &self.task.domain.columns;
        for (i, unit) in batch.units.iter().enumerate() {
            let bins: Vec<usize> = columns.iter().zip(&batch.values).map(|(c, v)| c.bin(v[i])).collect();
            if self.task.row_level {
                Self::add_row(&mut self.counts, self.task, &bins);
                self.row_units += 1;
                continue;
            }
            let m = self.task.max_rows_per_unit as usize;
            self.units.entry(unit.clone()).or_default().offer(bins, m, &mut self.rng);
        }
    }

    /// The summed tables and the number of contributing units.
    pub fn finish(mut self) -> (Vec<f64>, u64) {
        for kept in self.units.values() {
            for bins in kept.kept() {
                Self::add_row(&mut self.counts, self.task, bins);
            }
        }
        let units = self.row_units + self.units.len() as u64;
        (self.counts, units)
    }
}

/// The task as `CountTables` (`dpsynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use dpsynth_proto::{CountTables, MAX_RESULT_VALUES, TableColumns};

    use super::MarginalsTask;
    use crate::data::domain::Domain;
    use crate::wire::{WireError, from_json, to_json};

    impl From<&MarginalsTask> for CountTables {
        fn from(task: &MarginalsTask) -> Self {
            CountTables {
                domain_json: to_json(&task.domain),
                tables: task
                    .tables
                    .iter()
                    .map(|t| TableColumns { columns: t.iter().map(|&c| c as u32).collect() })
                    .collect(),
                max_rows_per_unit: task.max_rows_per_unit,
                row_level: task.row_level,
            }
        }
    }

    impl TryFrom<&CountTables> for MarginalsTask {
        type Error = WireError;

        fn try_from(wire: &CountTables) -> Result<Self, WireError> {
            let domain: Domain = from_json("domain", &wire.domain_json)?;
            let tables: Vec<Vec<usize>> =
                wire.tables.iter().map(|t| t.columns.iter().map(|&c| c as usize).collect()).collect();
            if tables.iter().flatten().any(|&c| c >= domain.columns.len()) || tables.iter().any(Vec::is_empty) {
                return Err(WireError::new("a table names no column or a column outside the domain"));
            }
            // Every table's cells, and their sum, within what one result may hold.
            let cells = tables.iter().try_fold(0u64, |total, table| {
                let size = table.iter().try_fold(1u64, |n, &c| n.checked_mul(domain.columns[c].bins() as u64))?;
                total.checked_add(size).filter(|&t| t <= MAX_RESULT_VALUES)
            });
            if cells.is_none() {
                return Err(WireError::new(format!("the tables hold more than {MAX_RESULT_VALUES} cells")));
            }
            Ok(MarginalsTask { domain, tables, max_rows_per_unit: wire.max_rows_per_unit, row_level: wire.row_level })
        }
    }
}
