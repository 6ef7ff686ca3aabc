//! DP marginals: the baseline generator (also PATH's "Direct").
//!
//! What it measures: the 1-way marginal of every synthesised column and the 2-way
//! marginals along a tree over the columns (a star around the target column by default,
//! else a chain in column order, or the `pairs` the spec names). Numeric columns are
//! counted on their public bins; a missing value is a bin of its own.
//!
//! Privacy: each unit contributes at most m = `max_rows_per_unit` rows (a unit with more
//! is subsampled uniformly inside its worker with a CSPRNG). A row adds 1 to one cell of
//! each of the K tables, so one unit moves the concatenated count vector by at most m in
//! every table: L2 sensitivity m·√K under add/remove of a unit. The coordinator adds
//! N(0, (σ·m·√K)²) to every cell, with σ calibrated so that this single Gaussian release
//! meets the job's (ε, δ) under its accountant.
//!
//! Synthesis (post-processing): negative noisy counts are clamped to 0; the root column
//! is drawn from its 1-way marginal and every other column from its noisy conditional
//! given its parent (falling back to its own 1-way marginal when the parent's row is
//! empty). Numeric values are drawn uniformly inside their bin. The default number of
//! rows is the noisy total of the root's table — an estimate of the contributed rows
//! released by the same mechanism, so it costs nothing extra.

use std::collections::HashMap;

use rand::rngs::ChaCha20Rng;
use rand::{CryptoRng, Rng, RngExt};
use serde::{Deserialize, Serialize};

use super::{PlanError, require_columns};
use crate::accounting::PrivacyError;
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::{Binning, Domain, Encoding};
use crate::data::{DataError, EncodedBatch};
use crate::entropy::os_rng;
use crate::output::SyntheticValue;
use crate::sampling::{Reservoir, pick};
use crate::spec::{ColumnKind, GeneratorSpec, JobSpec};

/// This generator's name in plan errors.
const GENERATOR: &str = "marginals";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// Kind name of marginals tasks in the protocol.
pub const TASK_KIND: &str = "marginals";

/// What a worker computes over its partitions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginalsTask {
    pub domain: Domain,
    /// Column indices of each measured table (1 or 2 columns).
    pub tables: Vec<Vec<usize>>,
    pub max_rows_per_unit: u32,
    /// Every unit is a single row (no unit column): no grouping needed.
    pub row_level: bool,
}

/// The measurement plan of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginalsPlan {
    pub task: MarginalsTask,
    /// Tree edges (parent, child) in sampling order; `root` has no parent.
    pub edges: Vec<(usize, usize)>,
    pub root: usize,
}

impl MarginalsPlan {
    pub fn new(spec: &JobSpec, domain: &Domain) -> Result<Self, PlanError> {
        require_columns(GENERATOR, domain)?;
        let n = domain.columns.len();
        let GeneratorSpec::Marginals(params) = &spec.generator else {
            return Err(invalid("the job's generator is another"));
        };
        let index = |name: &str| {
            domain.index_of(name).ok_or_else(|| invalid(format!("pair names '{name}', not a synthesised column")))
        };
        let target = spec.schema.target.as_deref().and_then(|t| domain.index_of(t));
        let (root, edges) = match &params.pairs {
            Some(pairs) => {
                let edges: Vec<(usize, usize)> =
                    pairs.iter().map(|[p, c]| Ok((index(p)?, index(c)?))).collect::<Result<_, PlanError>>()?;
                let root = edges.first().map_or(0, |e| e.0);
                (root, edges)
            }
            None => match target {
                Some(t) => (t, (0..n).filter(|c| *c != t).map(|c| (t, c)).collect()),
                None => (0, (1..n).map(|c| (c - 1, c)).collect()),
            },
        };
        // The edges must form a tree reaching every column from the root, parents first.
        let mut reached = vec![false; n];
        reached[root] = true;
        for &(p, c) in &edges {
            if !reached[p] || reached[c] {
                return Err(invalid(format!(
                    "pairs must form a tree listed parents first; ({}, {}) does not",
                    domain.columns[p].name, domain.columns[c].name
                )));
            }
            reached[c] = true;
        }
        if let Some(c) = reached.iter().position(|r| !r) {
            return Err(invalid(format!("column '{}' is in no pair", domain.columns[c].name)));
        }
        let mut tables: Vec<Vec<usize>> = (0..n).map(|c| vec![c]).collect();
        tables.extend(edges.iter().map(|&(p, c)| vec![p, c]));
        let task = MarginalsTask {
            domain: domain.clone(),
            tables,
            max_rows_per_unit: params.max_rows_per_unit,
            row_level: spec.schema.unit_column.is_none(),
        };
        Ok(Self { task, edges, root })
    }

    /// The smallest σ for which the one release meets the job's (ε, δ).
    pub fn calibrate(&self, spec: &JobSpec, options: &AccountingOptions) -> Result<f64, PrivacyError> {
        let p = &spec.privacy;
        calibrate_sigma(p.epsilon, p.delta, p.accountant, options, |s| vec![self.mechanism(s)])
    }

    /// The single Gaussian release this plan makes, with noise multiplier `sigma`.
    pub fn mechanism(&self, sigma: f64) -> Mechanism {
        Mechanism::Gaussian {
            l2_sensitivity: self.task.sensitivity(),
            noise_multiplier: sigma,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }
    }
}

impl MarginalsTask {
    /// Cells of each table.
    pub fn table_sizes(&self) -> Vec<usize> {
        self.tables.iter().map(|t| t.iter().map(|&c| self.domain.columns[c].bins()).product()).collect()
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

/// Noisy tables turned into sampling distributions (post-processing only).
pub struct Synthesizer {
    plan: MarginalsPlan,
    /// 1-way distributions per column.
    marginals: Vec<Vec<f64>>,
    /// Per edge child: P(child | parent) rows.
    conditionals: HashMap<usize, (usize, Vec<Vec<f64>>)>,
    /// Noisy total of the root's table (the default output size).
    pub noisy_total: f64,
}

fn normalised(weights: &[f64]) -> Option<Vec<f64>> {
    let clamped: Vec<f64> = weights.iter().map(|w| w.max(0.0)).collect();
    let total: f64 = clamped.iter().sum();
    (total > 0.0).then(|| clamped.iter().map(|w| w / total).collect())
}

impl Synthesizer {
    /// From the summed tables, after the coordinator has added the noise.
    pub fn new(plan: MarginalsPlan, noisy: &[f64]) -> Self {
        let task = &plan.task;
        let sizes = task.table_sizes();
        let mut offsets = vec![0];
        for s in &sizes {
            offsets.push(offsets.last().unwrap() + s);
        }
        let table = |t: usize| &noisy[offsets[t]..offsets[t + 1]];
        let n = task.domain.columns.len();
        let marginals: Vec<Vec<f64>> =
            (0..n).map(|c| normalised(table(c)).unwrap_or_else(|| vec![1.0 / sizes[c] as f64; sizes[c]])).collect();
        let mut conditionals = HashMap::new();
        for (e, &(p, c)) in plan.edges.iter().enumerate() {
            let (bp, bc) = (task.domain.columns[p].bins(), task.domain.columns[c].bins());
            let joint = table(n + e);
            let rows = (0..bp)
                .map(|i| normalised(&joint[i * bc..(i + 1) * bc]).unwrap_or_else(|| marginals[c].clone()))
                .collect();
            conditionals.insert(c, (p, rows));
        }
        let noisy_total = table(plan.root).iter().sum();
        Self { plan, marginals, conditionals, noisy_total }
    }

    /// Draws one synthetic row as bins per column.
    pub fn sample_bins(&self, rng: &mut impl Rng) -> Vec<usize> {
        let n = self.plan.task.domain.columns.len();
        let mut bins = vec![0; n];
        bins[self.plan.root] = pick(&self.marginals[self.plan.root], rng);
        for &(_, c) in &self.plan.edges {
            let (p, rows) = &self.conditionals[&c];
            bins[c] = pick(&rows[bins[*p]], rng);
        }
        bins
    }

    pub fn domain(&self) -> &Domain {
        &self.plan.task.domain
    }
}

/// Draws a value inside `bin` of column `c`.
pub fn decode_bin(domain: &Domain, c: usize, bin: usize, rng: &mut impl Rng) -> SyntheticValue {
    let column = &domain.columns[c];
    if column.missing && bin == column.bins() - 1 {
        return SyntheticValue::Missing;
    }
    match &column.encoding {
        Encoding::Categorical { categories, .. } => SyntheticValue::Category(
            categories.get(bin).cloned().unwrap_or_else(|| crate::spec::OTHER_CATEGORY.to_string()),
        ),
        Encoding::Numeric { binning: Binning::Integer(ranges), .. } => {
            let (lo, hi) = ranges[bin];
            SyntheticValue::Integer(rng.random_range(lo..=hi))
        }
        Encoding::Numeric { binning: Binning::Real(edges), kind, .. } => {
            let v = edges[bin] + rng.random::<f64>() * (edges[bin + 1] - edges[bin]);
            if *kind == ColumnKind::Datetime {
                SyntheticValue::Datetime(v.floor() as i64)
            } else {
                SyntheticValue::Real(v)
            }
        }
    }
}
