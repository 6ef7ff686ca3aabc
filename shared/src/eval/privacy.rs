//! Empirical privacy diagnostics (not guarantees):
//!
//! * DCR, distance to closest training record, in the Gower distance on the encoded
//!   space (numeric: |a − b| over the declared range; categorical: 0/1; missing matches
//!   only missing), averaged over columns. Reported as 5th percentile and median for
//!   synthetic rows, and for held-out real rows as the reference: synthetic rows much
//!   closer to the training data than held-out rows are suspicious.
//! * NRS: the share of synthetic rows that exactly copy a training row.
//! * Membership-inference AUC of a distance attack: a record's score is minus its
//!   distance to the nearest synthetic row; AUC of training (members) against held-out
//!   (non-members) records. 0.5 means the attack cannot tell them apart.
//!
//! Nearest-neighbour searches are exact, with early abandoning, in parallel, over evenly
//! spaced samples of at most `SAMPLE` query rows (all reference rows are searched).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{Table, par_map};
use crate::data::domain::{Domain, Encoding};

/// Query rows sampled for DCR and the membership attack.
pub const SAMPLE: usize = 10_000;
/// Members and non-members scored by the membership attack, and synthetic rows it uses.
const ATTACK_SAMPLE: usize = 1000;
const ATTACK_REFERENCE: usize = 8000;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PrivacyDiagnostics {
    pub dcr_synthetic_p5: f64,
    pub dcr_synthetic_median: f64,
    pub dcr_holdout_p5: f64,
    pub dcr_holdout_median: f64,
    /// Sorted DCRs of the sampled synthetic and held-out rows (for the report's plot).
    pub dcr_synthetic: Vec<f64>,
    pub dcr_holdout: Vec<f64>,
    pub exact_copy_rate: f64,
    pub membership_auc: f64,
}

/// Rows as vectors, with each column's scale for the Gower distance.
struct Points {
    rows: Vec<Vec<Option<f64>>>,
}

fn points(table: &Table, indices: impl Iterator<Item = usize>) -> Points {
    Points { rows: indices.map(|r| table.columns.iter().map(|c| c[r]).collect()).collect() }
}

fn spaced(n: usize, k: usize) -> impl Iterator<Item = usize> {
    let step = n.div_ceil(k.max(1)).max(1);
    (0..n).step_by(step)
}

struct Gower {
    /// Per column: `Some(range)` for numeric, `None` for categorical.
    ranges: Vec<Option<f64>>,
}

impl Gower {
    fn new(domain: &Domain) -> Self {
        let ranges = domain
            .columns
            .iter()
            .map(|c| match c.encoding {
                Encoding::Numeric { min, max, .. } => Some(max - min),
                Encoding::Categorical { .. } => None,
            })
            .collect();
        Self { ranges }
    }

    /// Sum of per-column distances, abandoned once above `bound`.
    fn distance(&self, a: &[Option<f64>], b: &[Option<f64>], bound: f64) -> f64 {
        let mut total = 0.0;
        for ((x, y), range) in a.iter().zip(b).zip(&self.ranges) {
            total += match (x, y, range) {
                (None, None, _) => 0.0,
                (None, _, _) | (_, None, _) => 1.0,
                (Some(x), Some(y), Some(r)) => ((x - y).abs() / r).min(1.0),
                (Some(x), Some(y), None) => f64::from(u8::from(x != y)),
            };
            if total > bound {
                break;
            }
        }
        total
    }

    /// Mean-per-column distance from each query to its nearest reference row.
    fn nearest(&self, queries: &Points, reference: &Points) -> Vec<f64> {
        let d = self.ranges.len().max(1) as f64;
        par_map(&queries.rows, |q| {
            let mut best = f64::INFINITY;
            for r in &reference.rows {
                best = best.min(self.distance(q, r, best));
                if best == 0.0 {
                    break;
                }
            }
            best / d
        })
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// AUC that a positive scores above a negative (ties count half).
pub fn auc(positives: &[f64], negatives: &[f64]) -> f64 {
    let mut all: Vec<(f64, bool)> =
        positives.iter().map(|s| (*s, true)).chain(negatives.iter().map(|s| (*s, false))).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Mann–Whitney U with average ranks for ties.
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let rank = (i + j + 1) as f64 / 2.0;
        rank_sum += rank * all[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    let (p, n) = (positives.len() as f64, negatives.len() as f64);
    (rank_sum - p * (p + 1.0) / 2.0) / (p * n)
}

fn row_key(table: &Table, r: usize) -> Vec<u64> {
    table.columns.iter().map(|c| c[r].map_or(u64::MAX, f64::to_bits)).collect()
}

pub fn evaluate(domain: &Domain, train: &Table, test: &Table, synthetic: &Table) -> PrivacyDiagnostics {
    let gower = Gower::new(domain);
    let train_all = points(train, 0..train.rows());
    let synthetic_sample = points(synthetic, spaced(synthetic.rows(), SAMPLE));
    let holdout_sample = points(test, spaced(test.rows(), SAMPLE));
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let dcr_synthetic = sorted(gower.nearest(&synthetic_sample, &train_all));
    let dcr_holdout = sorted(gower.nearest(&holdout_sample, &train_all));

    let training_rows: HashSet<Vec<u64>> = (0..train.rows()).map(|r| row_key(train, r)).collect();
    let copies = (0..synthetic.rows()).filter(|r| training_rows.contains(&row_key(synthetic, *r))).count();

    let synthetic_reference = points(synthetic, spaced(synthetic.rows(), ATTACK_REFERENCE));
    let members = points(train, spaced(train.rows(), ATTACK_SAMPLE));
    let non_members = points(test, spaced(test.rows(), ATTACK_SAMPLE));
    let score = |p: &Points| gower.nearest(p, &synthetic_reference).into_iter().map(|d| -d).collect::<Vec<_>>();
    PrivacyDiagnostics {
        dcr_synthetic_p5: quantile(&dcr_synthetic, 0.05),
        dcr_synthetic_median: quantile(&dcr_synthetic, 0.5),
        dcr_holdout_p5: quantile(&dcr_holdout, 0.05),
        dcr_holdout_median: quantile(&dcr_holdout, 0.5),
        dcr_synthetic,
        dcr_holdout,
        exact_copy_rate: if synthetic.rows() == 0 { 0.0 } else { copies as f64 / synthetic.rows() as f64 },
        membership_auc: auc(&score(&members), &score(&non_members)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_of_separable_and_identical_scores() {
        assert_eq!(auc(&[2.0, 3.0], &[0.0, 1.0]), 1.0);
        assert_eq!(auc(&[1.0, 1.0], &[1.0, 1.0]), 0.5);
        assert!((auc(&[0.1, 0.4, 0.35, 0.8], &[0.2, 0.3, 0.6, 0.05]) - 0.6875).abs() < 1e-12);
    }
}
