//! The copula fitted in one process to a cohort's histories, each release's noise added by
//! the caller: for tests and benchmarks on simulated data (a job's releases are the
//! coordinator's, with noise from the OS generator).

use std::collections::BTreeMap;

use super::model::{CopulaModel, Released};
use super::plan::HistoryCopulaPlan;
use crate::data::histories::ValueHistory;
use crate::generators::sequence::plan::length_cells;

/// Fits the copula to `histories` as a job would; `noise(values, std)` adds each
/// release's noise (standard deviation `std` per value), or nothing for the ceiling.
pub fn fit(
    plan: &HistoryCopulaPlan,
    histories: &[ValueHistory],
    mut noise: impl FnMut(&mut [f64], f64),
) -> CopulaModel {
    let margins_task = plan.margins_task();
    let margin_noise = plan.margins_sigma * margins_task.sensitivity();
    let mut margins = margins_task.sum(histories).0;
    noise(&mut margins, margin_noise);
    let mut rows_per_unit = BTreeMap::new();
    histories.iter().for_each(|h| *rows_per_unit.entry(h.len() as u32).or_insert(0) += 1);
    let mut lengths = length_cells(&rows_per_unit, plan.layout.max_rows);
    noise(&mut lengths, plan.lengths_sigma);
    let (released, ..) = CopulaModel::margins(&plan.layout, &margins, margin_noise);
    let mut moments = plan.moments_task(&released).sum(histories).0;
    let moment_noise = plan.moments_sigma * plan.moment_clip;
    noise(&mut moments, moment_noise);
    CopulaModel::fit(plan.layout.clone(), Released { margins, margin_noise, moments, moment_noise }, lengths)
}
