//! Rows drawn from the noisy tables. The tables disagree with one another (each carries
//! its own noise), so the sampler first fits the graphical model that agrees with all of
//! them best (Private-PGM, [`crate::pgm`]) and draws rows from it. Post-processing only.

use rand::rngs::ChaCha20Rng;
use rand::{Rng, RngExt};

use super::plan::MarginalsPlan;
use crate::data::domain::{Binning, Domain, Encoding};
use crate::generators::Sampler;
use crate::output::{SyntheticUnits, SyntheticValue};
use crate::pgm::{GraphicalModel, Measurement};
use crate::spec::ColumnKind;

/// Mirror-descent steps of the fit (Private-PGM's default).
const FIT_ITERATIONS: usize = 1000;

/// Rows drawn from a graphical model fitted to noisy tables (post-processing only): this
/// generator's and AIM's.
pub struct MarginalsSampler {
    domain: Domain,
    model: GraphicalModel,
}

impl MarginalsSampler {
    /// From the summed tables, after the coordinator has added noise of standard
    /// deviation `noise` to every cell.
    pub fn new(plan: MarginalsPlan, noisy: &[f64], noise: f64) -> Self {
        let task = &plan.task;
        let domain: Vec<usize> = task.domain.columns.iter().map(|c| c.bins()).collect();
        let offsets = task.offsets();
        let measurements: Vec<Measurement> = task
            .tables
            .iter()
            .enumerate()
            .map(|(t, columns)| measurement(columns, &noisy[offsets[t]..offsets[t + 1]], &domain, noise))
            .collect();
        let model = GraphicalModel::fit(&domain, &measurements, FIT_ITERATIONS);
        Self { domain: plan.task.domain, model }
    }

    /// From a model already fitted over `domain`'s columns.
    pub fn from_model(domain: Domain, model: GraphicalModel) -> Self {
        Self { domain, model }
    }

    /// The model's total: every table's noisy sum pooled by its variance, an estimate of
    /// the contributed rows released by the same mechanism (the default output size).
    pub fn noisy_total(&self) -> f64 {
        self.model.total
    }
}

/// A table (cells in its columns' order) as a measurement over ascending variables.
fn measurement(columns: &[usize], counts: &[f64], domain: &[usize], sigma: f64) -> Measurement {
    let mut vars = columns.to_vec();
    vars.sort_unstable();
    if vars == columns {
        return Measurement { vars, counts: counts.to_vec(), sigma };
    }
    // A pair listed (high, low): transpose.
    let (a, b) = (domain[columns[0]], domain[columns[1]]);
    let mut transposed = vec![0.0; counts.len()];
    for i in 0..a {
        for j in 0..b {
            transposed[j * a + i] = counts[i * b + j];
        }
    }
    Measurement { vars, counts: transposed, sigma }
}

impl Sampler for MarginalsSampler {
    fn sample(&mut self, rows: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let domain = &self.domain;
        let rows = self
            .model
            .sample(rows, rng)
            .into_iter()
            .map(|bins| bins.iter().enumerate().map(|(c, &bin)| decode_bin(domain, c, bin, rng)).collect())
            .collect();
        SyntheticUnits::one_row_each(rows)
    }
}

/// Draws a value inside `bin` of column `c`.
fn decode_bin(domain: &Domain, c: usize, bin: usize, rng: &mut impl Rng) -> SyntheticValue {
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
