//! Scores and guesses: how the auditor reads a release.
//!
//! Three scores, one chosen before the run (each a canary's evidence of inclusion; higher
//! means "in"):
//! - [`Score::Pairs`]: how much more the release likes the canary than the stand-in data
//!   does, summed over every pair of columns: ln p̂_release(cell) − ln p̂_stand-in(cell) of
//!   the canary's 2-way cells (add-½ smoothing), averaged over its rows. A generator of
//!   marginals reproduces the cells a canary added to; the stand-in's own frequencies are
//!   known to the auditor and cancel what real rows put there.
//! - [`Score::Nearest`]: minus the mean, over its rows, of the Gower distance to the
//!   nearest synthetic row (the evaluation's membership attack): a canary the generator
//!   memorised pulls a synthetic row towards it.
//! - [`Score::Loss`] (white-box, DP-SGD generators): how much training lowered the model's
//!   loss on the canary unit (`super::loss`): a model fits what it trained on, and the
//!   loss before training calibrates how hard the canary is to fit at all.
//!
//! The guesses are "in" for the k highest scores and "out" for the k lowest, ties broken
//! by a fair coin so that the order canaries were made in cannot count.

use std::collections::HashMap;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::data::domain::Domain;
use crate::data::table::Table;
use crate::eval::privacy::nearest_distances;

/// How a canary is scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Score {
    Pairs,
    Nearest,
    Loss,
}

impl Score {
    /// What the score is, for the report.
    pub fn describe(self) -> &'static str {
        match self {
            Score::Pairs => {
                "black-box: sum over column pairs of ln p(release) − ln p(stand-in) of the canary's 2-way cells (add-½), mean over its rows"
            }
            Score::Nearest => {
                "black-box: minus the mean over the canary's rows of the Gower distance to the nearest synthetic row"
            }
            Score::Loss => {
                "white-box (DP-SGD generators): the model's loss on the canary unit before training minus after, on the same draws of its non-private randomness (mean of 8; language models have none)"
            }
        }
    }
}

impl std::str::FromStr for Score {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "pairs" => Ok(Score::Pairs),
            "nearest" => Ok(Score::Nearest),
            "loss" => Ok(Score::Loss),
            other => Err(format!("unknown score '{other}': pairs, nearest or loss")),
        }
    }
}

/// Every 2-way table of a table's bins, sparse (only the cells rows reach: two columns of
/// many categories would make a dense table of billions of cells).
struct PairCounts {
    /// Per pair of columns (i, j): the counts by cell a·bins(j) + b, and the table's cells.
    pairs: Vec<(usize, usize, HashMap<usize, u32>, f64)>,
    rows: f64,
}

impl PairCounts {
    fn new(domain: &Domain, table: &Table) -> Self {
        let bins: Vec<Vec<usize>> =
            domain.columns.iter().zip(&table.columns).map(|(c, v)| v.iter().map(|x| c.bin(*x)).collect()).collect();
        let d = domain.columns.len();
        let pairs = (0..d)
            .flat_map(|i| ((i + 1)..d).map(move |j| (i, j)))
            .map(|(i, j)| {
                let width = domain.columns[j].bins();
                let mut counts = HashMap::new();
                bins[i].iter().zip(&bins[j]).for_each(|(a, b)| *counts.entry(a * width + b).or_insert(0) += 1);
                (i, j, counts, (domain.columns[i].bins() * width) as f64)
            })
            .collect();
        Self { pairs, rows: table.rows() as f64 }
    }

    /// Σ over pairs of the smoothed log frequency of `row`'s cells.
    fn log_likelihood(&self, domain: &Domain, row: &[usize]) -> f64 {
        self.pairs
            .iter()
            .map(|(i, j, counts, cells)| {
                let count = counts.get(&(row[*i] * domain.columns[*j].bins() + row[*j])).copied().unwrap_or(0);
                ((f64::from(count) + 0.5) / (self.rows + 0.5 * cells)).ln()
            })
            .sum()
    }
}

/// Each canary's pairs score; canary u's rows are `canaries` rows `ends[u − 1]..ends[u]`.
pub fn pair_scores(domain: &Domain, canaries: &Table, ends: &[usize], synthetic: &Table, stand_in: &Table) -> Vec<f64> {
    let (release, data) = (PairCounts::new(domain, synthetic), PairCounts::new(domain, stand_in));
    let per_row: Vec<f64> = (0..canaries.rows())
        .map(|r| {
            let row: Vec<usize> = domain.columns.iter().zip(&canaries.columns).map(|(c, v)| c.bin(v[r])).collect();
            release.log_likelihood(domain, &row) - data.log_likelihood(domain, &row)
        })
        .collect();
    unit_means(&per_row, ends)
}

/// Each canary's nearest score (rows as in [`pair_scores`]).
pub fn nearest_scores(domain: &Domain, canaries: &Table, ends: &[usize], synthetic: &Table) -> Vec<f64> {
    let per_row: Vec<f64> = nearest_distances(domain, canaries, synthetic).into_iter().map(|d| -d).collect();
    unit_means(&per_row, ends)
}

fn unit_means(per_row: &[f64], ends: &[usize]) -> Vec<f64> {
    let mut start = 0;
    ends.iter()
        .map(|&end| {
            let rows = &per_row[start..end];
            start = end;
            rows.iter().sum::<f64>() / rows.len().max(1) as f64
        })
        .collect()
}

/// What the guesses got right.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guesses {
    pub made: u64,
    pub correct: u64,
}

/// Guesses "in" for the `k` highest scores and "out" for the `k` lowest (fewer when there
/// are fewer than 2k canaries), ties in a random order.
pub fn guess(scores: &[f64], included: &[bool], k: usize, rng: &mut impl Rng) -> Guesses {
    assert_eq!(scores.len(), included.len());
    let mut order: Vec<(f64, u64, usize)> = scores.iter().enumerate().map(|(i, s)| (*s, rng.random(), i)).collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let k = k.min(order.len() / 2);
    let right_in = order[..k].iter().filter(|(_, _, i)| included[*i]).count();
    let right_out = order[order.len() - k..].iter().filter(|(_, _, i)| !included[*i]).count();
    Guesses { made: 2 * k as u64, correct: (right_in + right_out) as u64 }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::ChaCha8Rng;

    use super::*;

    fn domain() -> Domain {
        crate::testing::schema_domain(
            r#"[[schema.columns]]
name = "a"
kind = "categorical"
categories = ["x", "y", "z"]
[[schema.columns]]
name = "b"
kind = "integer"
min = 0
max = 3
[[schema.columns]]
name = "c"
kind = "categorical"
categories = ["u", "v"]"#,
        )
    }

    fn table(rows: &[[f64; 3]]) -> Table {
        Table {
            units: vec![String::new(); rows.len()],
            columns: (0..3).map(|d| rows.iter().map(|r| Some(r[d])).collect()).collect(),
        }
    }

    #[test]
    fn pair_scores_are_the_log_ratio_of_release_to_stand_in() {
        let domain = domain();
        // Canary 0 is (z, 3, v) twice (a two-row unit); canary 1 is (x, 0, u).
        let canaries = table(&[[2.0, 3.0, 1.0], [2.0, 3.0, 1.0], [0.0, 0.0, 0.0]]);
        let stand_in = table(&[[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]);
        let release = table(&[[2.0, 3.0, 1.0], [2.0, 3.0, 1.0], [0.0, 1.0, 0.0], [1.0, 2.0, 0.0]]);
        let got = pair_scores(&domain, &canaries, &[2, 3], &release, &stand_in);
        // By hand, add-½ smoothing: pair (a, b) has 12 cells, (a, c) 6, (b, c) 8; 4 rows each.
        let ln = |count: f64, cells: f64| ((count + 0.5) / (4.0 + 0.5 * cells)).ln();
        let canary0 = (ln(2.0, 12.0) + ln(2.0, 6.0) + ln(2.0, 8.0)) - (ln(0.0, 12.0) + ln(0.0, 6.0) + ln(0.0, 8.0));
        // Canary 1's cells: (x, 0) 0 vs 2, (x, u) 1 vs 2, (0, u) 0 vs 1.
        let canary1 = (ln(0.0, 12.0) + ln(1.0, 6.0) + ln(0.0, 8.0)) - (ln(2.0, 12.0) + ln(2.0, 6.0) + ln(1.0, 8.0));
        assert!((got[0] - canary0).abs() < 1e-12 && (got[1] - canary1).abs() < 1e-12, "{got:?}");
        assert!(got[0] > 0.0 && got[1] < 0.0);
    }

    #[test]
    fn nearest_scores_are_minus_the_mean_gower_distance() {
        let domain = domain();
        let canaries = table(&[[2.0, 3.0, 1.0], [0.0, 0.0, 0.0]]);
        let release = table(&[[2.0, 3.0, 1.0], [1.0, 0.0, 0.0]]);
        let got = nearest_scores(&domain, &canaries, &[1, 2], &release);
        // Canary 0 is in the release; canary 1 differs from (y, 0, u) in one of 3 columns.
        assert_eq!(got, vec![0.0, -1.0 / 3.0]);
    }

    #[test]
    fn guesses_take_both_ends_and_count_what_they_got_right() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        // Scores 0..10; the included are 9, 8, 7 and 1.
        let scores: Vec<f64> = (0..10).map(f64::from).collect();
        let included: Vec<bool> = (0..10).map(|i| [1, 7, 8, 9].contains(&i)).collect();
        // In: 9, 8, 7 (right); out: 0, 1, 2 (1 is wrong).
        assert_eq!(guess(&scores, &included, 3, &mut rng), Guesses { made: 6, correct: 5 });
        // k beyond half the canaries is cut to half.
        assert_eq!(guess(&scores, &included, 50, &mut rng).made, 10);
    }

    #[test]
    fn tied_scores_are_guessed_by_a_coin() {
        // All scores equal: which canaries are guessed "in" must not follow their order.
        let (n, k) = (1000, 100);
        let scores = vec![0.0; n];
        let included: Vec<bool> = (0..n).map(|i| i < n / 2).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let g = guess(&scores, &included, k, &mut rng);
        // Each guess right with probability ½: 200 guesses, mean 100, sd ≈ 7; 5 sd.
        assert!((g.correct as i64 - 100).abs() < 36, "{g:?}");
    }
}
