//! Longitudinal fidelity (definitions as in PATH), for tables where each privacy unit has
//! ordered rows:
//!
//! * pooled per-feature W1: the row-level W1 of `fidelity` (all rows pooled);
//! * state-transition divergence: each numeric feature is cut into `STATES` states at
//!   quantiles of the real training data; per table, consecutive rows give transitions;
//!   the Frobenius norm of the difference of the row-normalised transition matrices,
//!   averaged over features;
//! * TDCR: the distance of two tables is Σ_features DTW(a, b)/|warping path| with
//!   absolute-difference cost; each synthetic table and each held-out table gets its
//!   nearest-neighbour distance to the training tables, and the report gives the
//!   Jensen–Shannon distance (natural log; maximum √ln 2) between the two histograms;
//! * sequence lengths: rows per unit, real against synthetic (total variation).
//!
//! Nearest-neighbour search is exact, with early abandoning: a candidate is dropped as
//! soon as the features summed so far, or the cheapest row of a DTW matrix divided by the
//! longest possible path, already exceed the best distance found. At most `QUERIES`
//! query tables are searched (evenly spaced), against every training table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fidelity::js_distance;
use super::{Table, is_numeric};
use crate::data::domain::Domain;

pub const STATES: usize = 5;
pub const QUERIES: usize = 500;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Longitudinal {
    pub state_transition_divergence: f64,
    pub tdcr_js: f64,
    pub tdcr_synthetic_median: f64,
    pub tdcr_holdout_median: f64,
    pub sequence_length_tv: f64,
    /// Rows per unit: histogram labels (lengths) and shares, real and synthetic.
    pub lengths: Vec<usize>,
    pub real_lengths: Vec<f64>,
    pub synthetic_lengths: Vec<f64>,
}

/// DTW with absolute cost: (total cost, warping-path length). `abandon`: give up (return
/// `None`) once every path's cost divided by the longest possible path exceeds it.
pub fn dtw(a: &[f64], b: &[f64], abandon: f64) -> Option<(f64, usize)> {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return Some((0.0, 1));
    }
    let longest = (n + m - 1) as f64;
    // cost and path length of the best path to each cell (ties: shorter path).
    let mut prev: Vec<(f64, usize)> = vec![(f64::INFINITY, 0); m + 1];
    let mut cur = prev.clone();
    prev[0] = (0.0, 0);
    for i in 1..=n {
        cur[0] = (f64::INFINITY, 0);
        let mut row_min = f64::INFINITY;
        for j in 1..=m {
            let best = [prev[j - 1], prev[j], cur[j - 1]]
                .into_iter()
                .min_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)))
                .expect("three candidates");
            cur[j] = (best.0 + (a[i - 1] - b[j - 1]).abs(), best.1 + 1);
            row_min = row_min.min(cur[j].0);
        }
        if row_min / longest > abandon {
            return None;
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    Some(prev[m])
}

/// Each unit's rows, ordered: per feature, the present values in order.
fn sequences(table: &Table, order: usize, features: &[usize]) -> Vec<Vec<Vec<f64>>> {
    let mut by_unit: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (r, u) in table.units.iter().enumerate() {
        by_unit.entry(u).or_default().push(r);
    }
    by_unit
        .into_values()
        .map(|mut rows| {
            rows.sort_by(|x, y| {
                let key = |r: &usize| table.columns[order][*r].unwrap_or(f64::NEG_INFINITY);
                key(x).total_cmp(&key(y))
            });
            features.iter().map(|&f| rows.iter().filter_map(|&r| table.columns[f][r]).collect()).collect()
        })
        .collect()
}

/// Nearest-neighbour table distance of each query to the references.
fn nearest(queries: &[Vec<Vec<f64>>], references: &[Vec<Vec<f64>>]) -> Vec<f64> {
    queries
        .iter()
        .map(|q| {
            let mut best = f64::INFINITY;
            'candidates: for r in references {
                let mut total = 0.0;
                for (a, b) in q.iter().zip(r) {
                    match dtw(a, b, best - total) {
                        Some((cost, len)) => total += cost / len as f64,
                        None => continue 'candidates,
                    }
                    if total >= best {
                        continue 'candidates;
                    }
                }
                best = total;
            }
            best
        })
        .collect()
}

fn spaced<T: Clone>(items: &[T], k: usize) -> Vec<T> {
    let step = items.len().div_ceil(k.max(1)).max(1);
    items.iter().step_by(step).cloned().collect()
}

fn transition_matrix(tables: &[Vec<Vec<f64>>], feature: usize, cuts: &[f64]) -> Vec<f64> {
    let state = |v: f64| cuts.partition_point(|c| *c <= v);
    let mut counts = vec![0.0; STATES * STATES];
    for t in tables {
        for w in t[feature].windows(2) {
            counts[state(w[0]) * STATES + state(w[1])] += 1.0;
        }
    }
    for row in counts.chunks_mut(STATES) {
        let total: f64 = row.iter().sum();
        if total > 0.0 {
            row.iter_mut().for_each(|x| *x /= total);
        }
    }
    counts
}

/// Rows per unit.
fn unit_lengths(table: &Table) -> Vec<usize> {
    let mut by_unit: BTreeMap<&str, usize> = BTreeMap::new();
    table.units.iter().for_each(|u| *by_unit.entry(u).or_default() += 1);
    by_unit.into_values().collect()
}

fn length_histogram(lengths: &[usize], max_len: usize) -> Vec<f64> {
    let mut h = vec![0.0; max_len + 1];
    lengths.iter().for_each(|n| h[*n] += 1.0);
    h.iter_mut().for_each(|x| *x /= lengths.len().max(1) as f64);
    h
}

pub fn evaluate(domain: &Domain, order: usize, train: &Table, test: &Table, synthetic: &Table) -> Longitudinal {
    let features: Vec<usize> =
        (0..domain.columns.len()).filter(|&d| d != order && is_numeric(&domain.columns[d])).collect();
    let (tr, te, sy) =
        (sequences(train, order, &features), sequences(test, order, &features), sequences(synthetic, order, &features));

    let mut divergence = 0.0;
    for (f, _) in features.iter().enumerate() {
        let mut pooled: Vec<f64> = tr.iter().flat_map(|t| t[f].iter().copied()).collect();
        pooled.sort_by(f64::total_cmp);
        let cuts: Vec<f64> =
            (1..STATES).map(|k| pooled.get(k * pooled.len() / STATES).copied().unwrap_or(0.0)).collect();
        let (a, b) = (transition_matrix(&tr, f, &cuts), transition_matrix(&sy, f, &cuts));
        divergence += a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    }
    let state_transition_divergence = if features.is_empty() { 0.0 } else { divergence / features.len() as f64 };

    let from_synthetic = nearest(&spaced(&sy, QUERIES), &tr);
    let from_holdout = nearest(&spaced(&te, QUERIES), &tr);
    let top = from_synthetic.iter().chain(&from_holdout).copied().filter(|x| x.is_finite()).fold(0.0, f64::max);
    let histogram = |v: &[f64]| {
        let mut h = vec![0.0; 20];
        v.iter().for_each(|x| h[((x / top.max(1e-12) * 20.0) as usize).min(19)] += 1.0);
        let total: f64 = h.iter().sum();
        h.into_iter().map(|x| x / total.max(1.0)).collect::<Vec<_>>()
    };
    let median = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
    };

    let (real_units, synthetic_units) = (unit_lengths(train), unit_lengths(synthetic));
    let max_len = real_units.iter().chain(&synthetic_units).copied().max().unwrap_or(0);
    let real_lengths = length_histogram(&real_units, max_len);
    let synthetic_lengths = length_histogram(&synthetic_units, max_len);
    let sequence_length_tv = 0.5 * real_lengths.iter().zip(&synthetic_lengths).map(|(a, b)| (a - b).abs()).sum::<f64>();
    Longitudinal {
        state_transition_divergence,
        tdcr_js: js_distance(&histogram(&from_synthetic), &histogram(&from_holdout)),
        tdcr_synthetic_median: median(&from_synthetic),
        tdcr_holdout_median: median(&from_holdout),
        sequence_length_tv,
        lengths: (0..=max_len).collect(),
        real_lengths,
        synthetic_lengths,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtw_worked_example_from_path() {
        let x = [80.0, 81.0, 82.0, 85.0, 83.0, 84.0, 88.0, 92.0, 90.0, 87.0];
        let y = [82.0, 83.0, 83.0, 84.0, 86.0, 89.0, 93.0, 93.0, 91.0, 89.0, 88.0, 99.0];
        let (cost, len) = dtw(&x, &y, f64::INFINITY).unwrap();
        assert_eq!(cost, 25.0);
        assert!((12..=21).contains(&len));
    }

    #[test]
    fn dtw_abandons_hopeless_candidates() {
        assert!(dtw(&[0.0; 5], &[100.0; 5], 1.0).is_none());
        assert_eq!(dtw(&[1.0, 2.0], &[1.0, 2.0], 0.0), Some((0.0, 2)));
    }
}
