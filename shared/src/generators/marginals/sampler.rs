//! Rows drawn from the noisy tables. The tables disagree with one another (each carries
//! its own noise), so the sampler first fits the graphical model that agrees with all of
//! them best (Private-PGM, [`crate::pgm`]) and draws rows from it; a flattened history is
//! drawn given its length. Post-processing only.

use rand::Rng;
use rand::rngs::ChaCha20Rng;
use rand::seq::SliceRandom;

use super::history::{HistoryLayout, LENGTH};
use super::plan::MarginalsPlan;
use crate::data::domain::{Domain, Encoding};
use crate::generators::Sampler;
use crate::output::{SyntheticUnits, SyntheticValue};
use crate::pgm::model::{cumulative, draw};
use crate::pgm::{GraphicalModel, Measurement};

/// Mirror-descent steps of the fit (Private-PGM's default).
const FIT_ITERATIONS: usize = 1000;

/// Rows drawn from a graphical model fitted to noisy tables (post-processing only): this
/// generator's and AIM's.
pub struct MarginalsSampler {
    domain: Domain,
    model: GraphicalModel,
    /// With a flattened history: its layout.
    history: Option<HistoryLayout>,
}

impl MarginalsSampler {
    /// From the summed tables, after the coordinator has added noise of standard
    /// deviation `noise` to every cell.
    pub fn new(plan: MarginalsPlan, noisy: &[f64], noise: f64) -> Self {
        let task = &plan.task;
        let sizes = task.sizes();
        let offsets = task.offsets();
        let measurements: Vec<Measurement> = task
            .tables
            .iter()
            .enumerate()
            .map(|(t, columns)| measurement(columns, &noisy[offsets[t]..offsets[t + 1]], &sizes, noise))
            .collect();
        let model = GraphicalModel::fit(&sizes, &measurements, FIT_ITERATIONS);
        Self { domain: plan.task.domain, model, history: plan.task.history }
    }

    /// From a model already fitted over `domain`'s columns.
    pub fn from_model(domain: Domain, model: GraphicalModel) -> Self {
        Self { domain, model, history: None }
    }

    /// The model's total: every table's noisy sum pooled by its variance, an estimate of
    /// the contributed rows released by the same mechanism (the default output size).
    pub fn noisy_total(&self) -> f64 {
        self.model.total
    }
}

/// A table (cells in its columns' order) as a measurement over ascending variables.
fn measurement(columns: &[usize], counts: &[f64], sizes: &[usize], sigma: f64) -> Measurement {
    let mut vars = columns.to_vec();
    vars.sort_unstable();
    if vars == columns {
        return Measurement { vars, counts: counts.to_vec(), sigma };
    }
    // A pair listed (high, low): transpose.
    let (a, b) = (sizes[columns[0]], sizes[columns[1]]);
    let mut transposed = vec![0.0; counts.len()];
    for i in 0..a {
        for j in 0..b {
            transposed[j * a + i] = counts[i * b + j];
        }
    }
    Measurement { vars, counts: transposed, sigma }
}

impl Sampler for MarginalsSampler {
    fn rows_per_draw(&self) -> usize {
        self.history.as_ref().map_or(1, |h| h.steps)
    }

    fn sample(&mut self, rows: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        if self.history.is_some() {
            return self.histories(rows, rng);
        }
        let domain = &self.domain;
        let rows = self
            .model
            .sample(rows, rng)
            .into_iter()
            .map(|bins| bins.iter().enumerate().map(|(c, &bin)| domain.columns[c].draw(bin, rng)).collect())
            .collect();
        SyntheticUnits::one_row_each(rows)
    }
}

impl MarginalsSampler {
    /// `units` histories: each one's length drawn from the model's, then its flattened
    /// row from the model given that length (one conditioned model at a time: each is as
    /// large as the model); in random order.
    fn histories(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let layout = self.history.as_ref().expect("a history layout");
        let lengths = self.model.marginal(&[LENGTH]);
        let table = cumulative(lengths.values.iter().copied().enumerate());
        let mut per_length = vec![0; layout.steps];
        for _ in 0..units {
            per_length[draw(&table, rng)] += 1;
        }
        let sizes = layout.sizes(&self.domain);
        let mut histories = Vec::with_capacity(units);
        for (l, &count) in per_length.iter().enumerate().filter(|(_, c)| **c > 0) {
            let length = l + 1;
            let model = self.model.conditioned(&layout.given_length(length, &sizes));
            for flat in model.sample(count, rng) {
                let bins = layout.unflatten(&flat, length, self.domain.columns.len());
                histories.push(decode_history(layout, &self.domain, &bins, rng));
            }
        }
        histories.shuffle(rng);
        let mut out = SyntheticUnits::default();
        for rows in histories {
            out.push(rows);
        }
        out
    }
}

/// A history's rows (bins per column at each step) as values: the order column's first
/// value drawn in its bin, each later one the previous value plus a gap drawn in its bin
/// (within the column's bounds). Rows are ordered with missing values last, as the
/// counted histories were: from the first missing value or gap on, the value is missing.
fn decode_history(
    layout: &HistoryLayout,
    domain: &Domain,
    bins: &[Vec<usize>],
    rng: &mut impl Rng,
) -> Vec<Vec<SyntheticValue>> {
    // The previous order value; `None` once one was missing.
    let mut clock: Option<f64> = None;
    let order = layout.order_column();
    bins.iter()
        .enumerate()
        .map(|(t, row)| {
            row.iter()
                .enumerate()
                .map(|(c, &bin)| {
                    let column = layout.column_at(domain, c, t);
                    // Absent cannot be drawn before the length (its mass is zero) but for a
                    // draw whose every allowed cell underflowed: read as missing.
                    if bin >= column.bins() {
                        return SyntheticValue::Missing;
                    }
                    let value = column.draw(bin, rng);
                    if Some(c) != order {
                        return value;
                    }
                    let Encoding::Numeric { kind, min, max, .. } = domain.columns[c].encoding else {
                        unreachable!("a numeric order column")
                    };
                    clock = match (numeric(&value), clock) {
                        (Some(v), _) if t == 0 => Some(v),
                        (Some(gap), Some(previous)) => Some((previous + gap).clamp(min, max)),
                        _ => None,
                    };
                    clock.map_or(SyntheticValue::Missing, |v| SyntheticValue::numeric(kind, v))
                })
                .collect()
        })
        .collect()
}

/// A numeric value as a number.
fn numeric(value: &SyntheticValue) -> Option<f64> {
    match value {
        SyntheticValue::Integer(x) | SyntheticValue::Datetime(x) => Some(*x as f64),
        SyntheticValue::Real(x) => Some(*x),
        SyntheticValue::Missing | SyntheticValue::Category(_) => None,
    }
}
