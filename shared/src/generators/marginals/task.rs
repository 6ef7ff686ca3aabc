//! The worker's side: contingency tables of bounded per-unit contributions, their wire
//! form, and the coordinator's check of what a worker returns.

use std::collections::HashMap;

use rand::CryptoRng;
use rand::rngs::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use super::history::{HistoryLayout, OrderedRow, keep_first};
use crate::data::database::DatabaseView;
use crate::data::domain::Domain;
use crate::data::{DataError, EncodedBatch};
use crate::entropy::os_rng;
use crate::sampling::Reservoir;
use crate::spec::JobSpec;

/// The most cells the fitted model's cliques may hold together (8 bytes each, a few
/// copies while fitting, every fitting step a pass over them): pairs that form dense
/// cycles need large cliques and are refused. The tables themselves are held to it too.
pub const MAX_MODEL_CELLS: f64 = 1e6;

/// What a worker computes over its partitions (`CountTables` on the wire).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginalsTask {
    pub domain: Domain,
    /// Variables of each measured table (1 or 2): domain columns, or a flattened
    /// history's variables.
    pub tables: Vec<Vec<usize>>,
    pub max_rows_per_unit: u32,
    /// Every unit is a single row (no unit column): no grouping needed.
    pub row_level: bool,
    /// Each unit counted as one flattened history (PATH's Direct), not as rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<HistoryLayout>,
    /// The rows counted are a database view's, read from one partition of every table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<DatabaseView>,
}

impl MarginalsTask {
    /// `tables` of `domain` counted over the units `spec` declares (rows, without a unit
    /// column), at most `max_rows_per_unit` rows from each.
    pub fn new(spec: &JobSpec, domain: &Domain, tables: Vec<Vec<usize>>, max_rows_per_unit: u32) -> Self {
        Self {
            domain: domain.clone(),
            tables,
            max_rows_per_unit,
            row_level: spec.schema.unit_column.is_none(),
            history: None,
            database: None,
        }
    }

    /// `tables` of the variables of `history`, each unit one flattened history.
    pub fn over_histories(domain: &Domain, history: HistoryLayout, tables: Vec<Vec<usize>>) -> Self {
        Self {
            domain: domain.clone(),
            tables,
            max_rows_per_unit: 1,
            row_level: false,
            history: Some(history),
            database: None,
        }
    }

    /// `tables` of a database view's columns, each unit giving at most the viewed table's
    /// cap product rows (all it has).
    pub fn over_view(database: DatabaseView, tables: Vec<Vec<usize>>) -> Self {
        let reach = database.view.max_rows_per_unit(&database.layout);
        Self {
            domain: database.view.domain(&database.layout),
            tables,
            max_rows_per_unit: u32::try_from(reach).expect("a spec's caps multiply to at most 2³²"),
            row_level: false,
            history: None,
            database: Some(database),
        }
    }

    /// Values of each variable the tables are over.
    pub fn sizes(&self) -> Vec<usize> {
        match &self.history {
            Some(history) => history.sizes(&self.domain),
            None => self.domain.columns.iter().map(|c| c.bins()).collect(),
        }
    }

    /// Cells of each table.
    pub fn table_sizes(&self) -> Vec<usize> {
        let sizes = self.sizes();
        self.tables.iter().map(|t| t.iter().map(|&v| sizes[v]).product()).collect()
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
        Ok(Counter {
            task: self,
            sizes: self.sizes(),
            table_sizes: self.table_sizes(),
            counts: vec![0.0; self.cells()],
            units: HashMap::new(),
            histories: HashMap::new(),
            arrivals: 0,
            row_units: 0,
            rng,
        })
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
    /// Values of each variable, and cells of each table.
    sizes: Vec<usize>,
    table_sizes: Vec<usize>,
    counts: Vec<f64>,
    /// Per unit: the kept rows' bins.
    units: HashMap<String, Reservoir<Vec<usize>>>,
    /// Per unit, counted as a history: its first rows in order among those read so far.
    histories: HashMap<String, Vec<OrderedRow>>,
    /// Rows read, for ties in the order column (file order).
    arrivals: u64,
    row_units: u64,
    rng: R,
}

impl<R: CryptoRng> Counter<'_, R> {
    /// One count in a cell of every table; `values` indexed by variable.
    fn add_row(&mut self, values: &[usize]) {
        let mut offset = 0;
        for (table, size) in self.task.tables.iter().zip(&self.table_sizes) {
            let cell = table.iter().fold(0, |acc, &v| acc * self.sizes[v] + values[v]);
            self.counts[offset + cell] += 1.0;
            offset += size;
        }
    }

    pub fn add(&mut self, batch: &EncodedBatch) {
        if self.task.database.is_some() {
            return self.add_whole_units(batch);
        }
        let columns = &self.task.domain.columns;
        for (i, unit) in batch.units.iter().enumerate() {
            let bins: Vec<usize> = columns.iter().zip(&batch.values).map(|(c, v)| c.bin(v[i])).collect();
            if let Some(history) = &self.task.history {
                let order = history.order_column().and_then(|c| batch.values[c][i]);
                let rows = self.histories.entry(unit.clone()).or_default();
                rows.push(OrderedRow { order, arrival: self.arrivals, bins });
                self.arrivals += 1;
                // Memory stays within two windows per unit.
                if rows.len() >= 2 * history.steps {
                    keep_first(rows, history.steps);
                }
            } else if self.task.row_level {
                self.add_row(&bins);
                self.row_units += 1;
            } else {
                let m = self.task.max_rows_per_unit as usize;
                self.units.entry(unit.clone()).or_default().offer(bins, m, &mut self.rng);
            }
        }
    }

    /// A database view's batch, which holds each of its units whole, its rows together
    /// (`ViewReader`): each unit counted as its rows end, at most `m` of them (its
    /// caps allow no more), so nothing is held past it.
    fn add_whole_units(&mut self, batch: &EncodedBatch) {
        let columns = &self.task.domain.columns;
        let m = self.task.max_rows_per_unit as usize;
        let mut start = 0;
        for end in 1..=batch.units.len() {
            if end < batch.units.len() && batch.units[end] == batch.units[start] {
                continue;
            }
            let mut kept = Reservoir::default();
            for i in start..end {
                kept.offer(columns.iter().zip(&batch.values).map(|(c, v)| c.bin(v[i])).collect(), m, &mut self.rng);
            }
            kept.kept().iter().for_each(|bins: &Vec<usize>| self.add_row(bins));
            self.row_units += 1;
            start = end;
        }
    }

    /// The summed tables and the number of contributing units.
    pub fn finish(mut self) -> (Vec<f64>, u64) {
        let units = self.row_units + (self.units.len() + self.histories.len()) as u64;
        for kept in std::mem::take(&mut self.units).into_values() {
            for bins in kept.kept() {
                self.add_row(bins);
            }
        }
        if let Some(history) = &self.task.history {
            for mut rows in std::mem::take(&mut self.histories).into_values() {
                keep_first(&mut rows, history.steps);
                self.add_row(&history.flatten(&rows, &self.task.domain));
            }
        }
        (self.counts, units)
    }
}

/// The task as `CountTables` (`rhosynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::{CountTables, MAX_RESULT_VALUES, TableColumns};

    use super::MarginalsTask;
    use crate::data::database::DatabaseView;
    use crate::data::domain::Domain;
    use crate::generators::marginals::history::HistoryLayout;
    use crate::generators::params::{MAX_GAP_BINS, MAX_HISTORY_ROWS};
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
                history_json: task.history.as_ref().map(to_json).unwrap_or_default(),
                database_json: task.database.as_ref().map(to_json).unwrap_or_default(),
            }
        }
    }

    impl TryFrom<&CountTables> for MarginalsTask {
        type Error = WireError;

        fn try_from(wire: &CountTables) -> Result<Self, WireError> {
            let domain: Domain = from_json("domain", &wire.domain_json)?;
            let history: Option<HistoryLayout> = match wire.history_json.as_str() {
                "" => None,
                json => Some(from_json("history layout", json)?),
            };
            if let Some(h) = &history {
                // Its variables (one 1-way table each) within what a result may hold, and
                // the layout exactly what its indices give (the gap's domain derived, not
                // taken as sent).
                let fits = (1..=MAX_HISTORY_ROWS as usize).contains(&h.steps)
                    && (1..=MAX_GAP_BINS).contains(&h.gap_bins)
                    && (h.steps as u64).saturating_mul(domain.columns.len() as u64) < MAX_RESULT_VALUES
                    && HistoryLayout::of_indices(&domain, h.steps, h.order_column(), h.statics.clone(), h.gap_bins)
                        .is_some_and(|derived| &derived == h);
                if !fits {
                    return Err(WireError::new("the history layout does not fit the domain"));
                }
            }
            let database: Option<DatabaseView> = match wire.database_json.as_str() {
                "" => None,
                json => Some(from_json("database view", json)?),
            };
            if let Some(view) = &database {
                // The view's domain and bound derived from its layout, not taken as sent.
                let fits = view.is_consistent()
                    && history.is_none()
                    && !wire.row_level
                    && view.view.domain(&view.layout) == domain
                    && u64::from(wire.max_rows_per_unit) == view.view.max_rows_per_unit(&view.layout);
                if !fits {
                    return Err(WireError::new("the database view does not fit its domain and bound"));
                }
            }
            let task = MarginalsTask {
                domain,
                tables: wire.tables.iter().map(|t| t.columns.iter().map(|&c| c as usize).collect()).collect(),
                max_rows_per_unit: wire.max_rows_per_unit,
                row_level: wire.row_level,
                history,
                database,
            };
            let sizes = task.sizes();
            if task.tables.iter().flatten().any(|&v| v >= sizes.len()) || task.tables.iter().any(Vec::is_empty) {
                return Err(WireError::new("a table names no variable or one outside the domain"));
            }
            // Every table's cells, and their sum, within what one result may hold.
            let cells = task.tables.iter().try_fold(0u64, |total, table| {
                let size = table.iter().try_fold(1u64, |n, &v| n.checked_mul(sizes[v] as u64))?;
                total.checked_add(size).filter(|&t| t <= MAX_RESULT_VALUES)
            });
            if cells.is_none() {
                return Err(WireError::new(format!("the tables hold more than {MAX_RESULT_VALUES} cells")));
            }
            Ok(task)
        }
    }
}
