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
//! * sequence lengths: rows per unit, real against synthetic (total variation);
//! * dynamics, per numeric feature: the lag-1 autocorrelation (Pearson correlation of each
//!   value with the unit's previous present value, over all units' consecutive pairs; the
//!   values clamped to the declared bounds, as every metric here reads them) of
//!   the training, held-out and synthetic tables, and the feature's transition error (the
//!   Frobenius norm above) of the synthetic and of the held-out tables against the
//!   training tables — the held-out figures are the real-vs-real floor. Rows that look
//!   right one at a time can still have no dynamics; these say so.
//!
//! Nearest-neighbour search is exact and pruned by lower bounds of the normalised DTW:
//! the gap between two sequences' value ranges (every matched pair costs at least that),
//! then an envelope bound (each value is matched at least once, to something inside the
//! other's range, on a path of at most n + m − 1 steps), then DTW with early abandoning
//! (the cheapest cell of a row over the longest path). Candidates are visited after the
//! 32 with the smallest range gap, so the best distance tightens early. Up to
//! `EvalLimits::tdcr_queries` synthetic and held-out query tables are searched against up
//! to `tdcr_reference` training tables (uniform samples of the units beyond that; the same
//! reference sample for both query sets), in parallel; `cargo bench -p rhosynth-shared
//! --bench tdcr` times 10⁴ × 10⁵. A comparison costs O(n·m) DTW cells per feature, so both
//! samples shrink by one factor when a brute-force search would fill more than
//! `tdcr_cells` cells (see [`tdcr_caps`]). State transitions, pooled W1 and sequence
//! lengths read every row.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fidelity::js_distance;
use super::{EvalLimits, Sampling, is_numeric, par_map};
use crate::data::domain::Domain;
use crate::data::table::Table;

pub const STATES: usize = 5;

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
    /// Per numeric feature, what it does over time within a unit.
    #[serde(default)]
    pub dynamics: Vec<Dynamics>,
}

/// A numeric feature's dynamics within units.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Dynamics {
    pub column: String,
    /// Lag-1 autocorrelation of the training, held-out and synthetic tables (`None`: fewer
    /// than two consecutive pairs, or no variation).
    pub lag1_real: Option<f64>,
    pub lag1_holdout: Option<f64>,
    pub lag1_synthetic: Option<f64>,
    /// Transition error against the training tables: synthetic, and held-out (the floor).
    pub transition_error: f64,
    pub holdout_transition_error: f64,
}

impl Longitudinal {
    /// Mean over features of |lag-1 synthetic − lag-1 real| (features whose real lag-1
    /// exists; a synthetic table without one counts as 0, no dynamics).
    pub fn mean_lag1_gap(&self) -> Option<f64> {
        mean_gap(&self.dynamics, |d| d.lag1_synthetic)
    }

    /// The same for the held-out tables: the real-vs-real floor.
    pub fn holdout_mean_lag1_gap(&self) -> Option<f64> {
        mean_gap(&self.dynamics, |d| d.lag1_holdout)
    }

    /// Mean over features of the held-out tables' transition error.
    pub fn holdout_transition_error(&self) -> f64 {
        let n = self.dynamics.len().max(1) as f64;
        self.dynamics.iter().map(|d| d.holdout_transition_error).sum::<f64>() / n
    }

    /// The dynamics in one line, each beside its real-vs-real floor (the benchmarks').
    pub fn dynamics_summary(&self) -> String {
        let f = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.3}"));
        format!(
            "mean lag-1 gap {} (held-out {}); transition error {:.3} (held-out {:.3}); rows-per-unit TV {:.3}",
            f(self.mean_lag1_gap()),
            f(self.holdout_mean_lag1_gap()),
            self.state_transition_divergence,
            self.holdout_transition_error(),
            self.sequence_length_tv
        )
    }
}

fn mean_gap(dynamics: &[Dynamics], other: impl Fn(&Dynamics) -> Option<f64>) -> Option<f64> {
    let gaps: Vec<f64> = dynamics.iter().filter_map(|d| Some((other(d).unwrap_or(0.0) - d.lag1_real?).abs())).collect();
    (!gaps.is_empty()).then(|| gaps.iter().sum::<f64>() / gaps.len() as f64)
}

/// Lag-1 autocorrelation of `feature` over every unit's consecutive values.
pub fn lag1(tables: &[Vec<Vec<f64>>], feature: usize) -> Option<f64> {
    let pairs: Vec<(f64, f64)> = tables.iter().flat_map(|t| t[feature].windows(2).map(|w| (w[0], w[1]))).collect();
    pearson(&pairs)
}

/// Pearson correlation of the pairs (`None` below two pairs or without variance).
pub fn pearson(pairs: &[(f64, f64)]) -> Option<f64> {
    let n = pairs.len() as f64;
    if n < 2.0 {
        return None;
    }
    let (mx, my) = pairs.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (sxy, sxx, syy) = pairs.iter().fold((0.0, 0.0, 0.0), |(c, vx, vy), (x, y)| {
        (c + (x - mx) * (y - my), vx + (x - mx).powi(2), vy + (y - my).powi(2))
    });
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

/// DTW with absolute cost: (total cost, warping-path length). `abandon`: give up (return
/// `None`) once every path's cost divided by the longest possible path exceeds it.
pub fn dtw(a: &[f64], b: &[f64], abandon: f64) -> Option<(f64, usize)> {
    dtw_in(a, b, abandon, &mut Vec::new())
}

/// [`dtw`] with its two rows in `scratch` (reused across calls: no allocation per pair).
fn dtw_in(a: &[f64], b: &[f64], abandon: f64, scratch: &mut Vec<(f64, usize)>) -> Option<(f64, usize)> {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return Some((0.0, 1));
    }
    let longest = (n + m - 1) as f64;
    // cost and path length of the best path to each cell (ties: shorter path).
    scratch.clear();
    scratch.resize(2 * (m + 1), (f64::INFINITY, 0));
    let (mut prev, mut cur) = scratch.split_at_mut(m + 1);
    prev[0] = (0.0, 0);
    for i in 1..=n {
        cur[0] = (f64::INFINITY, 0);
        let mut row_min = f64::INFINITY;
        let x = a[i - 1];
        for j in 1..=m {
            // The first of (diagonal, up, left) with the least (cost, length); costs are ≥ 0
            // or +∞, never NaN, so `<` orders them as `total_cmp` does.
            let better = |c: (f64, usize), best: (f64, usize)| c.0 < best.0 || (c.0 == best.0 && c.1 < best.1);
            let mut best = prev[j - 1];
            if better(prev[j], best) {
                best = prev[j];
            }
            if better(cur[j - 1], best) {
                best = cur[j - 1];
            }
            cur[j] = (best.0 + (x - b[j - 1]).abs(), best.1 + 1);
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

/// A table as the TDCR search sees it: per feature, the ordered present values and their
/// range.
pub struct SeqTable {
    features: Vec<(Vec<f64>, f64, f64)>,
}

impl SeqTable {
    pub fn new(features: Vec<Vec<f64>>) -> Self {
        let features = features
            .into_iter()
            .map(|v| {
                let (lo, hi) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(*x), b.max(*x)));
                (v, lo, hi)
            })
            .collect();
        Self { features }
    }
}

fn outside(x: f64, lo: f64, hi: f64) -> f64 {
    if x < lo {
        lo - x
    } else if x > hi {
        x - hi
    } else {
        0.0
    }
}

/// O(1) bound per feature: every matched pair is at least the gap between the ranges.
fn range_gap(q: &SeqTable, r: &SeqTable) -> f64 {
    q.features
        .iter()
        .zip(&r.features)
        .filter(|((a, _, _), (b, _, _))| !a.is_empty() && !b.is_empty())
        .map(|((_, qlo, qhi), (_, rlo, rhi))| (rlo - qhi).max(qlo - rhi).max(0.0))
        .sum()
}

/// O(n + m) bound per feature: each value is matched at least once, to something inside
/// the other sequence's range; a warping path has at most n + m − 1 steps.
fn envelope(a: &[f64], alo: f64, ahi: f64, b: &[f64], blo: f64, bhi: f64) -> f64 {
    if a.is_empty() || b.is_empty() {
        return 0.0;
    }
    let from_a: f64 = a.iter().map(|x| outside(*x, blo, bhi)).sum();
    let from_b: f64 = b.iter().map(|x| outside(*x, alo, ahi)).sum();
    from_a.max(from_b) / (a.len() + b.len() - 1) as f64
}

/// Buffers one search reuses for every candidate.
#[derive(Default)]
struct Scratch {
    bounds: Vec<f64>,
    dtw: Vec<(f64, usize)>,
}

/// Exact distance of `q` to `r` if it is below `best`, else `None`.
fn distance_below(q: &SeqTable, r: &SeqTable, best: f64, scratch: &mut Scratch) -> Option<f64> {
    let gap = range_gap(q, r);
    if gap >= best {
        return None;
    }
    // Tighter per-feature bounds first, then exact DTW with early abandoning.
    let Scratch { bounds, dtw: rows } = scratch;
    bounds.clear();
    bounds.extend(q.features.iter().zip(&r.features).map(|((a, alo, ahi), (b, blo, bhi))| {
        let g = (blo - ahi).max(alo - bhi).max(0.0);
        envelope(a, *alo, *ahi, b, *blo, *bhi).max(if a.is_empty() || b.is_empty() { 0.0 } else { g })
    }));
    let mut remaining: f64 = bounds.iter().sum();
    if remaining >= best {
        return None;
    }
    let mut total = 0.0;
    for (((a, _, _), (b, _, _)), bound) in q.features.iter().zip(&r.features).zip(bounds.iter()) {
        remaining -= bound;
        let (cost, len) = dtw_in(a, b, best - total - remaining, rows)?;
        total += cost / len as f64;
        if total + remaining >= best {
            return None;
        }
    }
    Some(total)
}

/// Nearest-neighbour TDCR distance of each query table to the reference tables: exact,
/// searched in order of the cheap range bound (a good first candidate makes the bounds
/// bite), queries spread over all cores.
pub fn nearest(queries: &[SeqTable], references: &[SeqTable]) -> Vec<f64> {
    const SEED_CANDIDATES: usize = 32;
    let search = |q: &SeqTable| -> f64 {
        let mut order: Vec<(f64, usize)> = references.iter().enumerate().map(|(i, r)| (range_gap(q, r), i)).collect();
        let k = SEED_CANDIDATES.min(order.len());
        if k == 0 {
            return f64::INFINITY;
        }
        order.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
        order[..k].sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut best = f64::INFINITY;
        let mut scratch = Scratch::default();
        for &(gap, i) in &order {
            if gap >= best {
                continue;
            }
            if let Some(d) = distance_below(q, &references[i], best, &mut scratch) {
                best = d;
            }
        }
        best
    };
    par_map(queries, search)
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

/// Mean length of each feature's sequences.
fn mean_lengths(tables: &[Vec<Vec<f64>>], features: usize) -> Vec<f64> {
    let n = tables.len().max(1) as f64;
    (0..features).map(|f| tables.iter().map(|t| t[f].len() as f64).sum::<f64>() / n).collect()
}

/// The TDCR sample sizes: the query and reference caps, both shrunk by one factor when a
/// brute-force search over the samples would fill more than `limits.tdcr_cells` DTW cells
/// (estimated from the mean lengths: Σ over query sets of queries × references ×
/// Σ_features n̄·m̄), since a comparison costs O(n·m) per feature however many tables
/// there are.
fn tdcr_caps(references: &[Vec<Vec<f64>>], queries: [&[Vec<Vec<f64>>]; 2], limits: &EvalLimits) -> (usize, usize) {
    let features = references.first().map_or(0, Vec::len);
    let reference_lengths = mean_lengths(references, features);
    let per_pair: Vec<f64> = queries
        .iter()
        .map(|q| mean_lengths(q, features).iter().zip(&reference_lengths).map(|(a, b)| a * b).sum())
        .collect();
    let cells = |query_cap: usize, reference_cap: usize| -> f64 {
        let r = references.len().min(reference_cap) as f64;
        queries.iter().zip(&per_pair).map(|(q, c)| q.len().min(query_cap) as f64 * r * c).sum()
    };
    let budget = limits.tdcr_cells as f64;
    let (mut query_cap, mut reference_cap) = (limits.tdcr_queries, limits.tdcr_reference);
    let total = cells(query_cap, reference_cap);
    if total <= budget {
        return (query_cap, reference_cap);
    }
    let largest = queries.iter().map(|q| q.len().min(query_cap)).max().unwrap_or(0) as f64;
    let r = references.len().min(reference_cap) as f64;
    let mut factor = (budget / total).sqrt();
    loop {
        query_cap = ((largest * factor) as usize).max(1);
        reference_cap = ((r * factor) as usize).max(1);
        if cells(query_cap, reference_cap) <= budget || (query_cap, reference_cap) == (1, 1) {
            return (query_cap, reference_cap);
        }
        factor *= 0.95;
    }
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

#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    domain: &Domain,
    order: usize,
    train: &Table,
    test: &Table,
    synthetic: &Table,
    limits: &EvalLimits,
    sampling: &mut Sampling,
) -> Longitudinal {
    let features: Vec<usize> =
        (0..domain.columns.len()).filter(|&d| d != order && is_numeric(&domain.columns[d])).collect();
    let (tr, te, sy) =
        (sequences(train, order, &features), sequences(test, order, &features), sequences(synthetic, order, &features));

    let mut dynamics = Vec::with_capacity(features.len());
    for (f, &column) in features.iter().enumerate() {
        let mut pooled: Vec<f64> = tr.iter().flat_map(|t| t[f].iter().copied()).collect();
        pooled.sort_by(f64::total_cmp);
        let cuts: Vec<f64> =
            (1..STATES).map(|k| pooled.get(k * pooled.len() / STATES).copied().unwrap_or(0.0)).collect();
        let real = transition_matrix(&tr, f, &cuts);
        let error = |tables: &[Vec<Vec<f64>>]| {
            real.iter().zip(&transition_matrix(tables, f, &cuts)).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt()
        };
        dynamics.push(Dynamics {
            column: domain.columns[column].name.clone(),
            lag1_real: lag1(&tr, f),
            lag1_holdout: lag1(&te, f),
            lag1_synthetic: lag1(&sy, f),
            transition_error: error(&sy),
            holdout_transition_error: error(&te),
        });
    }
    let state_transition_divergence = if features.is_empty() {
        0.0
    } else {
        dynamics.iter().map(|d| d.transition_error).sum::<f64>() / features.len() as f64
    };

    sampling.record("state transitions, sequence lengths", "train", train.rows(), train.rows());
    sampling.record("state transitions, sequence lengths", "synthetic", synthetic.rows(), synthetic.rows());
    let mut index = |metric: &str, name: &str, tables: &[Vec<Vec<f64>>], cap: usize| {
        let picked = sampling.sample(metric, name, tables.len(), cap);
        picked.into_iter().map(|k| SeqTable::new(tables[k].clone())).collect::<Vec<_>>()
    };
    let (query_cap, reference_cap) = tdcr_caps(&tr, [&sy, &te], limits);
    let references = index("TDCR reference (tables)", "train", &tr, reference_cap);
    let synthetic_queries = index("TDCR queries (tables)", "synthetic", &sy, query_cap);
    let holdout_queries = index("TDCR queries (tables)", "test", &te, query_cap);
    let from_synthetic = nearest(&synthetic_queries, &references);
    let from_holdout = nearest(&holdout_queries, &references);
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
        dynamics,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lag-1 of AR(1) sequences x_t = ρ·x_{t−1} + e_t (stationary start) is ρ within a
    /// few standard errors, (1 − ρ²)/√n for n pairs; of independent values, 0 likewise.
    #[test]
    fn lag1_of_ar1_histories_is_their_rho() {
        use rand::SeedableRng;
        use rand_distr::{Distribution, StandardNormal};
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(7);
        for rho in [0.0, 0.3, 0.8] {
            let tables: Vec<Vec<Vec<f64>>> = (0..400)
                .map(|_| {
                    let mut x: f64 = StandardNormal.sample(&mut rng);
                    x /= (1.0f64 - rho * rho).sqrt();
                    let mut values = Vec::new();
                    for _ in 0..10 {
                        values.push(x);
                        let e: f64 = StandardNormal.sample(&mut rng);
                        x = rho * x + e;
                    }
                    vec![values]
                })
                .collect();
            let n = 400.0 * 9.0;
            let got = lag1(&tables, 0).unwrap();
            assert!((got - rho).abs() < 4.0 * (1.0 - rho * rho) / f64::sqrt(n), "ρ = {rho}: {got}");
        }
        assert_eq!(lag1(&[vec![vec![1.0, 2.0]]], 0), None, "one pair");
        assert_eq!(lag1(&[vec![vec![3.0, 3.0, 3.0]]], 0), None, "no variation");
    }

    #[test]
    fn dtw_worked_example_from_path() {
        let x = [80.0, 81.0, 82.0, 85.0, 83.0, 84.0, 88.0, 92.0, 90.0, 87.0];
        let y = [82.0, 83.0, 83.0, 84.0, 86.0, 89.0, 93.0, 93.0, 91.0, 89.0, 88.0, 99.0];
        let (cost, len) = dtw(&x, &y, f64::INFINITY).unwrap();
        assert_eq!(cost, 25.0);
        assert!((12..=21).contains(&len));
    }

    #[test]
    fn tdcr_samples_shrink_with_the_tables_lengths() {
        let tables = |n: usize, len: usize| vec![vec![vec![0.0; len]; 2]; n];
        let limits =
            EvalLimits { tdcr_queries: 100, tdcr_reference: 1000, tdcr_cells: 1_000_000, ..Default::default() };
        // 2 × 100 queries × 1000 references × 2 features × 1 cell: within the budget.
        assert_eq!(tdcr_caps(&tables(5000, 1), [&tables(500, 1), &tables(50, 1)], &limits), (100, 1000));
        // 10 × 10 cells per feature: 100 × (100 + 50) × 1000 × 2 = 3·10⁷ cells, 30× over.
        let (q, r) = tdcr_caps(&tables(5000, 10), [&tables(500, 10), &tables(50, 10)], &limits);
        assert!((q.min(500) + q.min(50)) * r * 200 <= 1_000_000, "{q} x {r}");
        assert!((15..=18).contains(&q) && (150..=182).contains(&r), "{q} x {r}");
    }

    #[test]
    fn dtw_abandons_hopeless_candidates() {
        assert!(dtw(&[0.0; 5], &[100.0; 5], 1.0).is_none());
        assert_eq!(dtw(&[1.0, 2.0], &[1.0, 2.0], 0.0), Some((0.0, 2)));
    }
}
