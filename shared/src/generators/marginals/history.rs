//! PATH's "Direct" baseline: a unit's history as one flattened row.
//!
//! The variables are the history's length (its first L rows, 1 to L), each static column
//! once (from the first row), and every other column at each of the L steps, with one
//! more value, *absent*, past the history's end. The order column is its value at the
//! first step and its gap to the previous row after (public geometric bins, as the
//! sequence generator's), so that a history's clock runs as real ones do. Measured: every variable's 1-way table,
//! each column's table of adjacent steps and, for a declared pair, its table at every
//! step. A unit is one flattened row whatever its length, so it moves each of the K
//! tables by at most 1: L2 sensitivity √K. Sampling draws a length, then the other
//! variables from the fitted model given that length (present before it, absent after),
//! so every history is whole.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::generators::{PlanError, order_with_gaps};
use crate::spec::{ColumnKind, JobSpec};

/// How a history is flattened; the variables' order is [length, statics, step 0's
/// dynamics, step 1's, …].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryLayout {
    /// L: a unit's first rows (in order) that are flattened.
    pub steps: usize,
    /// Domain index of the column rows are ordered by (file order without one), and the
    /// domain of its gap to the previous row (a missing value when either is missing).
    pub order: Option<(usize, ColumnDomain)>,
    /// Geometric bins of the gap over the order column's declared range.
    pub gap_bins: u32,
    /// Domain columns measured once per unit.
    pub statics: Vec<usize>,
    /// Domain columns measured at every step.
    pub dynamics: Vec<usize>,
}

/// The length's variable.
pub const LENGTH: usize = 0;

impl HistoryLayout {
    /// The spec's flattening of `steps` rows, with these static columns (names) and
    /// `gap_bins` bins of the order column's gaps.
    pub fn new(
        generator: &'static str,
        spec: &JobSpec,
        domain: &Domain,
        steps: usize,
        static_columns: &[String],
        gap_bins: u32,
    ) -> Result<Self, PlanError> {
        let invalid = |message: String| PlanError::new(generator, message);
        if spec.schema.unit_column.is_none() {
            return Err(invalid("history_rows needs the schema's unit_column".into()));
        }
        let order = order_with_gaps(generator, spec, domain, gap_bins)?.map(|(c, _)| c);
        let mut statics = Vec::new();
        for name in static_columns {
            let c =
                domain.index_of(name).ok_or_else(|| invalid(format!("static column '{name}' is not synthesised")))?;
            if Some(c) == order {
                return Err(invalid(format!("static column '{name}' is the order column")));
            }
            if statics.contains(&c) {
                return Err(invalid(format!("static column '{name}' is listed twice")));
            }
            statics.push(c);
        }
        Ok(Self::of_indices(domain, steps, order, statics, gap_bins).expect("checked above"))
    }

    /// The layout of these domain indices, or `None` if they do not fit the domain (an
    /// index outside it, a static listed twice or ordering, a non-numeric order column).
    /// The gap's domain is always derived here, never taken as given.
    pub fn of_indices(
        domain: &Domain,
        steps: usize,
        order: Option<usize>,
        statics: Vec<usize>,
        gap_bins: u32,
    ) -> Option<Self> {
        let columns = domain.columns.len();
        let distinct = statics.iter().enumerate().all(|(i, c)| !statics[..i].contains(c));
        if !distinct
            || statics.iter().chain(&order).any(|&c| c >= columns)
            || order.is_some_and(|c| statics.contains(&c))
        {
            return None;
        }
        let order = match order {
            Some(c) => {
                let column = &domain.columns[c];
                let Encoding::Numeric { kind, min, max, .. } = column.encoding else { return None };
                let integer = kind == ColumnKind::Integer;
                let kind = if integer { ColumnKind::Integer } else { ColumnKind::Continuous };
                let binning = Binning::gaps(max - min, gap_bins, integer);
                let encoding = Encoding::Numeric { kind, min: 0.0, max: max - min, binning };
                Some((c, ColumnDomain { name: format!("{} gap", column.name), encoding, missing: true }))
            }
            None => None,
        };
        let dynamics = (0..columns).filter(|c| !statics.contains(c)).collect();
        Some(Self { steps, order, gap_bins, statics, dynamics })
    }

    /// Domain index of the order column.
    pub fn order_column(&self) -> Option<usize> {
        self.order.as_ref().map(|(c, _)| *c)
    }

    /// The domain of column `c`'s value at `step`: the gap's for the order column after
    /// the first step.
    pub fn column_at<'a>(&'a self, domain: &'a Domain, c: usize, step: usize) -> &'a ColumnDomain {
        match &self.order {
            Some((order, gap)) if *order == c && step > 0 => gap,
            _ => &domain.columns[c],
        }
    }

    /// Values of each variable: L lengths, the statics' bins, the dynamics' bins and absent.
    pub fn sizes(&self, domain: &Domain) -> Vec<usize> {
        let mut sizes = vec![self.steps];
        sizes.extend(self.statics.iter().map(|&c| domain.columns[c].bins()));
        for t in 0..self.steps {
            sizes.extend(self.dynamics.iter().map(|&c| self.column_at(domain, c, t).bins() + 1));
        }
        sizes
    }

    /// The variable of domain column `column` at `step` (a static's one variable at any).
    fn variable(&self, column: usize, step: usize) -> usize {
        match self.statics.iter().position(|&c| c == column) {
            Some(i) => 1 + i,
            None => {
                let j = self.dynamics.iter().position(|&c| c == column).expect("a domain column");
                1 + self.statics.len() + step * self.dynamics.len() + j
            }
        }
    }

    /// The measured tables (variable sets): every variable's 1-way table, each dynamic
    /// column's adjacent steps, and each pair (domain columns) at every step — once if
    /// both are static.
    pub fn tables(&self, pairs: &[Vec<usize>]) -> Vec<Vec<usize>> {
        let variables = 1 + self.statics.len() + self.steps * self.dynamics.len();
        let mut tables: Vec<Vec<usize>> = (0..variables).map(|v| vec![v]).collect();
        for &c in &self.dynamics {
            tables.extend((1..self.steps).map(|t| vec![self.variable(c, t - 1), self.variable(c, t)]));
        }
        for pair in pairs {
            let (a, b) = (pair[0], pair[1]);
            let steps = if self.statics.contains(&a) && self.statics.contains(&b) { 1 } else { self.steps };
            tables.extend((0..steps).map(|t| vec![self.variable(a, t), self.variable(b, t)]));
        }
        tables
    }

    /// A unit's rows in order (the first L are used) as values of the variables.
    pub fn flatten(&self, rows: &[OrderedRow], domain: &Domain) -> Vec<usize> {
        let n = rows.len().min(self.steps);
        let mut flat = vec![n.saturating_sub(1)];
        flat.extend(self.statics.iter().map(|&c| rows.first().map_or(0, |row| row.bins[c])));
        for t in 0..self.steps {
            for &c in &self.dynamics {
                let column = self.column_at(domain, c, t);
                flat.push(match &self.order {
                    _ if t >= n => column.bins(),
                    // Rows are in order: the gap is ≥ 0 (the last bin holds any beyond the range).
                    Some((order, gap)) if *order == c && t > 0 => {
                        gap.bin(rows[t].order.zip(rows[t - 1].order).map(|(v, previous)| v - previous))
                    }
                    _ => rows[t].bins[c],
                });
            }
        }
        flat
    }

    /// The values each variable may take in a history of `length` rows: that length;
    /// a column's bins before it, absent from it on.
    pub fn given_length(&self, length: usize, sizes: &[usize]) -> Vec<(usize, Vec<bool>)> {
        let mut allowed = vec![(LENGTH, (0..self.steps).map(|l| l + 1 == length).collect())];
        for t in 0..self.steps {
            for &c in &self.dynamics {
                let v = self.variable(c, t);
                let absent = sizes[v] - 1;
                allowed.push((v, (0..sizes[v]).map(|x| (x == absent) != (t < length)).collect()));
            }
        }
        allowed
    }

    /// The `length` rows (bins in domain order, `columns` of them) of a flattened row.
    pub fn unflatten(&self, flat: &[usize], length: usize, columns: usize) -> Vec<Vec<usize>> {
        (0..length)
            .map(|t| {
                let mut row = vec![0; columns];
                for &c in self.statics.iter().chain(&self.dynamics) {
                    row[c] = flat[self.variable(c, t)];
                }
                row
            })
            .collect()
    }
}

/// A row of a history: where it falls in the unit's order, and its bins.
pub struct OrderedRow {
    /// The order column's value.
    pub order: Option<f64>,
    /// Rows read before it (ties in the order column keep file order).
    pub arrival: u64,
    pub bins: Vec<usize>,
}

/// Keeps a unit's first `steps` rows, in order: by the order value (missing last), ties in
/// file order.
pub fn keep_first(rows: &mut Vec<OrderedRow>, steps: usize) {
    rows.sort_by(|a, b| {
        let order = match (a.order, b.order) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        order.then(a.arrival.cmp(&b.arrival))
    });
    rows.truncate(steps);
}
