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
//! Nearest-neighbour searches are exact (the nearest row among the rows searched), with
//! early abandoning, cache-blocked and in parallel. Their cost is bounded by
//! [`EvalLimits`]: at most `dcr_queries` synthetic and held-out query rows against at most
//! `dcr_reference` training rows (one uniform sample of the training table, shared by both
//! query sets so that they stay comparable); the attack scores `attack_records` members and
//! non-members against `attack_reference` synthetic rows. The exact-copy rate reads every
//! row of both tables (a hash look-up per row).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::{EvalLimits, Sampling, par_map};
use crate::data::domain::{Domain, Encoding};
use crate::data::table::Table;

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

/// The encoded value of a missing cell: far from every encoded value, equal to itself.
const MISSING: f64 = -1e300;
/// Columns summed between two early-abandoning checks (and the row padding).
const LANES: usize = 8;
/// Query rows sharing one pass over a block of reference rows, and that block's rows.
const QUERY_TILE: usize = 32;
const REFERENCE_BLOCK: usize = 256;

/// Rows encoded so that the Gower term of every column is `min(|a − b|, 1)`: numeric
/// values scaled by the declared range, category codes doubled (two different codes are
/// ≥ 2 apart), missing as [`MISSING`] (1 from any value, 0 from another missing). Row
/// major, padded with zeros to a multiple of [`LANES`] columns.
pub struct Points {
    width: usize,
    values: Vec<f64>,
}

impl Points {
    fn rows(&self) -> usize {
        self.values.len() / self.width.max(1)
    }

    fn row(&self, r: usize) -> &[f64] {
        &self.values[r * self.width..(r + 1) * self.width]
    }
}

struct Gower {
    /// Per column: `Some((min, range))` for numeric, `None` for categorical.
    scales: Vec<Option<(f64, f64)>>,
}

impl Gower {
    fn new(domain: &Domain) -> Self {
        let scales = domain
            .columns
            .iter()
            .map(|c| match c.encoding {
                Encoding::Numeric { min, max, .. } => Some((min, max - min)),
                Encoding::Categorical { .. } => None,
            })
            .collect();
        Self { scales }
    }

    fn points(&self, table: &Table, indices: &[usize]) -> Points {
        let width = self.scales.len().div_ceil(LANES).max(1) * LANES;
        let mut values = vec![0.0; indices.len() * width];
        for (row, &r) in values.chunks_exact_mut(width).zip(indices) {
            for ((slot, column), scale) in row.iter_mut().zip(&table.columns).zip(&self.scales) {
                *slot = match (column[r], scale) {
                    (None, _) => MISSING,
                    (Some(x), Some((min, range))) => (x - min) / range,
                    (Some(code), None) => 2.0 * code,
                };
            }
        }
        Points { width, values }
    }

    /// Sum of per-column distances, abandoned (returning a partial sum above `bound`) once
    /// above `bound`.
    #[inline]
    fn distance(a: &[f64], b: &[f64], bound: f64) -> f64 {
        let mut total = 0.0;
        for (x, y) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
            let mut lanes = [0.0; LANES];
            for k in 0..LANES {
                lanes[k] = (x[k] - y[k]).abs().min(1.0);
            }
            total += lanes.iter().sum::<f64>();
            if total > bound {
                break;
            }
        }
        total
    }

    /// Mean-per-column distance from each query to its nearest reference row.
    fn nearest(&self, queries: &Points, reference: &Points) -> Vec<f64> {
        let d = self.scales.len().max(1) as f64;
        let width = queries.width;
        let tiles: Vec<usize> = (0..queries.rows()).step_by(QUERY_TILE).collect();
        let best = par_map(&tiles, |&start| {
            let end = (start + QUERY_TILE).min(queries.rows());
            let mut best = vec![f64::INFINITY; end - start];
            for block in reference.values.chunks(REFERENCE_BLOCK * width) {
                for (q, best) in (start..end).zip(best.iter_mut()) {
                    if *best == 0.0 {
                        continue;
                    }
                    let q = queries.row(q);
                    for r in block.chunks_exact(width) {
                        let distance = Self::distance(q, r, *best);
                        if distance < *best {
                            *best = distance;
                            if distance == 0.0 {
                                break;
                            }
                        }
                    }
                }
            }
            best
        });
        best.into_iter().flatten().map(|b| b / d).collect()
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

/// Each row of `queries`' mean-per-column Gower distance to its nearest row of `reference`
/// (exact, every row of both).
pub fn nearest_distances(domain: &Domain, queries: &Table, reference: &Table) -> Vec<f64> {
    let gower = Gower::new(domain);
    let all = |t: &Table| (0..t.rows()).collect::<Vec<_>>();
    gower.nearest(&gower.points(queries, &all(queries)), &gower.points(reference, &all(reference)))
}

fn row_key(table: &Table, r: usize) -> Vec<u64> {
    table.columns.iter().map(|c| c[r].map_or(u64::MAX, f64::to_bits)).collect()
}

pub fn evaluate(
    domain: &Domain,
    train: &Table,
    test: &Table,
    synthetic: &Table,
    limits: &EvalLimits,
    sampling: &mut Sampling,
) -> PrivacyDiagnostics {
    let gower = Gower::new(domain);
    let reference = sampling.sample("DCR reference", "train", train.rows(), limits.dcr_reference);
    let reference = gower.points(train, &reference);
    let synthetic_queries = sampling.sample("DCR queries", "synthetic", synthetic.rows(), limits.dcr_queries);
    let holdout_queries = sampling.sample("DCR queries", "test", test.rows(), limits.dcr_queries);
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let dcr_synthetic = sorted(gower.nearest(&gower.points(synthetic, &synthetic_queries), &reference));
    let dcr_holdout = sorted(gower.nearest(&gower.points(test, &holdout_queries), &reference));
    drop(reference);

    sampling.record("exact-copy rate", "train", train.rows(), train.rows());
    sampling.record("exact-copy rate", "synthetic", synthetic.rows(), synthetic.rows());
    let training_rows: HashSet<Vec<u64>> = (0..train.rows()).map(|r| row_key(train, r)).collect();
    let copies = (0..synthetic.rows()).filter(|r| training_rows.contains(&row_key(synthetic, *r))).count();
    drop(training_rows);

    let attack_reference =
        sampling.sample("membership attack reference", "synthetic", synthetic.rows(), limits.attack_reference);
    let synthetic_reference = gower.points(synthetic, &attack_reference);
    let members = sampling.sample("membership attack members", "train", train.rows(), limits.attack_records);
    let non_members = sampling.sample("membership attack non-members", "test", test.rows(), limits.attack_records);
    let score = |table: &Table, rows: &[usize]| {
        gower.nearest(&gower.points(table, rows), &synthetic_reference).into_iter().map(|d| -d).collect::<Vec<_>>()
    };
    PrivacyDiagnostics {
        dcr_synthetic_p5: quantile(&dcr_synthetic, 0.05),
        dcr_synthetic_median: quantile(&dcr_synthetic, 0.5),
        dcr_holdout_p5: quantile(&dcr_holdout, 0.05),
        dcr_holdout_median: quantile(&dcr_holdout, 0.5),
        dcr_synthetic,
        dcr_holdout,
        exact_copy_rate: if synthetic.rows() == 0 { 0.0 } else { copies as f64 / synthetic.rows() as f64 },
        membership_auc: auc(&score(train, &members), &score(test, &non_members)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Gower distance as defined, one pair at a time (no encoding, no abandoning).
    fn gower(domain: &Domain, a: &Table, i: usize, b: &Table, j: usize) -> f64 {
        let terms = domain.columns.iter().enumerate().map(|(d, c)| match (a.columns[d][i], b.columns[d][j]) {
            (None, None) => 0.0,
            (None, _) | (_, None) => 1.0,
            (Some(x), Some(y)) => match c.encoding {
                Encoding::Numeric { min, max, .. } => ((x - y).abs() / (max - min)).min(1.0),
                Encoding::Categorical { .. } => f64::from(u8::from(x != y)),
            },
        });
        terms.sum::<f64>() / domain.columns.len() as f64
    }

    #[test]
    fn blocked_search_equals_brute_force_gower() {
        use rand::rngs::ChaCha8Rng;
        use rand::{RngExt, SeedableRng};
        let mut schema = String::new();
        for i in 0..11 {
            schema += &if i % 2 == 0 {
                format!("[[schema.columns]]\nname = \"n{i}\"\nkind = \"continuous\"\nmin = -5.0\nmax = 15.0\n")
            } else {
                format!(
                    "[[schema.columns]]\nname = \"c{i}\"\nkind = \"categorical\"\ncategories = [\"a\", \"b\", \"c\"]\n"
                )
            };
        }
        let domain = crate::testing::schema_domain(&schema);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut table = |rows: usize| Table {
            units: (0..rows).map(|r| r.to_string()).collect(),
            columns: (0..11)
                .map(|d| {
                    (0..rows)
                        .map(|_| {
                            let v = if d % 2 == 0 {
                                rng.random_range(-5.0..15.0_f64).round()
                            } else {
                                rng.random_range(0..3) as f64
                            };
                            (rng.random::<f64>() > 0.1).then_some(v)
                        })
                        .collect()
                })
                .collect(),
        };
        let (reference, queries) = (table(700), table(90));
        let gower_search = Gower::new(&domain);
        let all = |t: &Table| (0..t.rows()).collect::<Vec<_>>();
        let fast = gower_search.nearest(
            &gower_search.points(&queries, &all(&queries)),
            &gower_search.points(&reference, &all(&reference)),
        );
        for (q, got) in fast.iter().enumerate() {
            let want =
                (0..reference.rows()).map(|r| gower(&domain, &queries, q, &reference, r)).fold(f64::INFINITY, f64::min);
            assert!((got - want).abs() < 1e-12, "query {q}: {got} vs {want}");
        }
        // A copied row is at distance exactly 0, missing cells included.
        let copy = reference.select(&[5, 17]);
        assert_eq!(
            gower_search
                .nearest(&gower_search.points(&copy, &[0, 1]), &gower_search.points(&reference, &all(&reference))),
            [0.0, 0.0]
        );
    }

    #[test]
    fn auc_of_separable_and_identical_scores() {
        assert_eq!(auc(&[2.0, 3.0], &[0.0, 1.0]), 1.0);
        assert_eq!(auc(&[1.0, 1.0], &[1.0, 1.0]), 0.5);
        assert!((auc(&[0.1, 0.4, 0.35, 0.8], &[0.2, 0.3, 0.6, 0.05]) - 0.6875).abs() < 1e-12);
    }
}
