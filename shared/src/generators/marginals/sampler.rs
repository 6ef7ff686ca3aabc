//! Rows drawn from the noisy tables: the root column from its 1-way marginal, every other
//! column from its conditional given its parent. Post-processing only.

use std::collections::HashMap;

use rand::rngs::ChaCha20Rng;
use rand::{Rng, RngExt};

use super::plan::MarginalsPlan;
use crate::data::domain::{Binning, Domain, Encoding};
use crate::generators::Sampler;
use crate::output::{SyntheticUnits, SyntheticValue};
use crate::sampling::pick;
use crate::spec::ColumnKind;

/// Noisy tables turned into sampling distributions (post-processing only).
pub struct MarginalsSampler {
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

impl MarginalsSampler {
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
    fn sample_bins(&self, rng: &mut impl Rng) -> Vec<usize> {
        let n = self.plan.task.domain.columns.len();
        let mut bins = vec![0; n];
        bins[self.plan.root] = pick(&self.marginals[self.plan.root], rng);
        for &(_, c) in &self.plan.edges {
            let (p, rows) = &self.conditionals[&c];
            bins[c] = pick(&rows[bins[*p]], rng);
        }
        bins
    }
}

impl Sampler for MarginalsSampler {
    fn sample(&mut self, rows: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let domain = &self.plan.task.domain;
        let rows = (0..rows)
            .map(|_| {
                let bins = self.sample_bins(rng);
                bins.iter().enumerate().map(|(c, &bin)| decode_bin(domain, c, bin, rng)).collect()
            })
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
