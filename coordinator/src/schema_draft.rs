//! A schema draft's domains released with DP: what is charged (constructed with the noise
//! it pays for, so the two cannot disagree) and the measure that draws it.
//!
//! Per column, whatever the data: a Gaussian 4-cell histogram of cell shapes (integer,
//! decimal, text, missing), a Gaussian histogram over fixed magnitude buckets (the bounds),
//! a Gaussian histogram over a grid between them (tighter bounds and the bins' quantiles),
//! and a partition selection over the values (the categories). Rows count with L2
//! sensitivity m (a unit adds at most m rows); values with L0 = m, L∞ = 1 (a unit counts
//! once per value, in at most m values). A column uses either the numeric or the
//! categorical releases; both are charged, since which one is decided by a release.

use rhosynth_privacy::release::{Private, Releases, Unpaid};
use rhosynth_shared::accounting::PrivacyError;
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, calibrate_sigma};
use rhosynth_shared::accounting::math::normal_isf;
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use rhosynth_shared::schema_draft::Measure;
use rhosynth_shared::schema_draft::grid::{GRID_CELLS, Grid};
use rhosynth_shared::schema_draft::profile::ColumnProfile;

/// Buckets per doubling of magnitude: bounds within a factor 2^(1/4) (19%) of the data's.
const PER_OCTAVE: i32 = 4;

/// Magnitudes 2^(e/4) for e in this range (closed) bound the buckets: up to 2⁵³, the
/// largest bound a spec takes; smaller magnitudes are 0, larger ones the last bucket's.
const EXPONENTS: std::ops::RangeInclusive<i32> = -20 * PER_OCTAVE..=53 * PER_OCTAVE - 1;

/// The probability that a release reads some empty bucket as holding numbers (a spurious,
/// far bound): the cutoff is the noise's quantile at this share over one histogram's
/// buckets.
const FALSE_CELL: f64 = 1e-3;

/// The releases of a draft of `columns` columns at (ε, δ), half of δ for the thresholds.
pub struct DraftRelease {
    pub max_rows_per_unit: u32,
    pub noise_multiplier: f64,
    pub threshold_delta: f64,
    columns: usize,
}

impl DraftRelease {
    pub fn new(
        columns: usize,
        max_rows_per_unit: u32,
        epsilon: f64,
        delta: f64,
        options: &AccountingOptions,
    ) -> Result<Self, PrivacyError> {
        let threshold_delta = delta / (2.0 * columns.max(1) as f64);
        let plan = |noise_multiplier| Self { max_rows_per_unit, noise_multiplier, threshold_delta, columns };
        let sigma = calibrate_sigma(epsilon, delta, Accountant::Rdp, options, |s| plan(s).mechanisms())?;
        Ok(plan(sigma))
    }

    /// What a draft is charged.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        let m = self.max_rows_per_unit;
        let mut mechanisms = vec![Mechanism::Gaussian {
            l2_sensitivity: f64::from(m),
            noise_multiplier: self.noise_multiplier,
            releases: 3 * self.columns as u64,
            adjacency: Adjacency::AddRemove,
        }];
        mechanisms.extend((0..self.columns).map(|_| Mechanism::PartitionSelection {
            max_partitions: m,
            noise_multiplier: self.noise_multiplier,
            threshold_delta: self.threshold_delta,
        }));
        mechanisms
    }

    /// The measure drawing these releases, paid by `releases`.
    pub fn measure<'a>(&'a self, releases: &'a mut Releases) -> Noisy<'a> {
        Noisy { plan: self, releases }
    }

    fn rows_sensitivity(&self) -> f64 {
        f64::from(self.max_rows_per_unit)
    }

    /// A noisy count above this is read as a bucket holding rows, in a histogram of `cells`.
    fn cutoff(&self, cells: usize) -> f64 {
        self.noise_multiplier * self.rows_sensitivity() * normal_isf(FALSE_CELL / cells as f64)
    }
}

fn magnitude(e: i32) -> f64 {
    2f64.powf(f64::from(e) / f64::from(PER_OCTAVE))
}

/// The buckets of magnitude, ascending in value: −2^((e+1)/4)..−2^(e/4) for e descending,
/// 0, then 2^(e/4)..2^((e+1)/4) for e ascending; each with its edges.
fn buckets() -> Vec<(f64, f64)> {
    let negative = EXPONENTS.rev().map(|e| (-magnitude(e + 1), -magnitude(e)));
    let positive = EXPONENTS.map(|e| (magnitude(e), magnitude(e + 1)));
    negative.chain([(0.0, 0.0)]).chain(positive).collect()
}

fn bucket_of(x: f64) -> usize {
    let n = EXPONENTS.clone().count();
    let e = (x.abs().log2() * f64::from(PER_OCTAVE)).floor();
    // 0 (e = −∞), or too small to tell from it.
    if e.is_nan() || e < f64::from(*EXPONENTS.start()) {
        return n;
    }
    let e = (e as i32).min(*EXPONENTS.end());
    let i = (e - EXPONENTS.start()) as usize;
    if x > 0.0 { n + 1 + i } else { n - 1 - i }
}

/// [`DraftRelease`]'s releases, each drawn from the charge's paid mechanisms.
pub struct Noisy<'a> {
    plan: &'a DraftRelease,
    releases: &'a mut Releases,
}

impl Noisy<'_> {
    fn rows(&mut self, exact: Vec<f64>) -> Result<Vec<f64>, Unpaid> {
        let plan = self.plan;
        self.releases.gaussian(Private::new(exact), plan.rows_sensitivity(), plan.noise_multiplier)
    }
}

impl Measure for Noisy<'_> {
    type Error = Unpaid;

    fn shapes(&mut self, column: &ColumnProfile) -> Result<[f64; 4], Unpaid> {
        let noisy = self.rows(column.shapes.to_vec())?;
        Ok([noisy[0], noisy[1], noisy[2], noisy[3]])
    }

    fn categories(&mut self, column: &ColumnProfile) -> Result<Vec<(String, f64)>, Unpaid> {
        let plan = self.plan;
        let counts = Private::new(column.values.values().copied().collect());
        let passed = self.releases.partition_selection(
            counts,
            plan.max_rows_per_unit,
            plan.noise_multiplier,
            plan.threshold_delta,
        )?;
        // Only the values that passed leave, with their noisy counts.
        Ok(column.values.keys().zip(passed).filter_map(|(value, count)| Some((value.clone(), count?))).collect())
    }

    fn bounds(&mut self, column: &ColumnProfile) -> Result<Option<(f64, f64)>, Unpaid> {
        let edges = buckets();
        let mut exact = vec![0.0; edges.len()];
        column.numbers.iter().for_each(|&x| exact[bucket_of(x)] += 1.0);
        let noisy = self.rows(exact)?;
        let cut = self.plan.cutoff(edges.len());
        let first = noisy.iter().position(|c| *c > cut);
        let last = noisy.iter().rposition(|c| *c > cut);
        Ok(first.zip(last).map(|(f, l)| (edges[f].0, edges[l].1)))
    }

    fn grid_noise_floor(&self) -> f64 {
        self.plan.cutoff(GRID_CELLS)
    }

    fn grid(&mut self, column: &ColumnProfile, grid: &Grid) -> Result<Vec<f64>, Unpaid> {
        let mut exact = vec![0.0; GRID_CELLS];
        column.numbers.iter().for_each(|&x| exact[grid.cell(x)] += 1.0);
        self.rows(exact)
    }

    fn lists_every_value(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ascending_and_hold_their_values() {
        let edges = buckets();
        assert!(edges.windows(2).all(|w| w[0].1 <= w[1].0), "ascending and disjoint");
        for x in [-3e9, -1.5, -1.0, 0.0, 1e-9, 0.75, 1.0, 17.0, 90.0, 4.5e18, 1e300] {
            let (lo, hi) = edges[bucket_of(x)];
            let inside = lo <= x && x <= hi;
            // Beyond the largest magnitude, or too small to tell from 0: the end buckets.
            let clamped = x.abs() >= 2f64.powi(53) || (x != 0.0 && x.abs() < 2f64.powi(-20));
            assert!(hi - lo <= 0.19 * lo.abs().max(hi.abs()) + 1e-300, "{lo}..{hi} is a quarter octave");
            assert!(inside || clamped, "{x} in {lo}..{hi}");
        }
        assert_eq!(bucket_of(1e-9), bucket_of(0.0));
        assert_eq!(bucket_of(1e300), edges.len() - 1);
    }

    /// The charge composes to the draft's ε at δ: one Gaussian release of each of three
    /// histograms and one partition selection per column, half of δ to the thresholds.
    #[test]
    fn the_charge_meets_the_drafts_budget() {
        let options = AccountingOptions::default();
        let plan = DraftRelease::new(6, 2, 1.0, 1e-6, &options).unwrap();
        let mechanisms = plan.mechanisms();
        let cost = rhosynth_shared::accounting::accountant::account(&mechanisms, Accountant::Rdp, 1e-6, &options);
        let epsilon = cost.unwrap().epsilon;
        assert!(epsilon <= 1.0 && epsilon > 0.999, "{epsilon}");
        let added: f64 = mechanisms.iter().map(Mechanism::added_delta).sum();
        assert!((added - 0.5e-6).abs() < 1e-18);
    }
}
