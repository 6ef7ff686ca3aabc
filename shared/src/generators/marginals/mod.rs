//! DP marginals: the baseline generator, of rows or (PATH's "Direct") of histories.
//!
//! What it measures: the 1-way marginal of every synthesised column and the 2-way
//! marginals of the spec's `pairs` (a star around the target column by default, else a
//! chain in column order). Numeric columns are counted on their public bins; a missing
//! value is a bin of its own. With `history_rows`, each unit's history is one flattened
//! row and the tables are over its steps ([`history`]).
//!
//! Privacy: each unit contributes at most m = `max_rows_per_unit` rows (a unit with more
//! is subsampled uniformly inside its worker with a CSPRNG). A row adds 1 to one cell of
//! each of the K tables, so one unit moves the concatenated count vector by at most m in
//! every table: L2 sensitivity m·√K under add/remove of a unit. The coordinator adds
//! N(0, (σ·m·√K)²) to every cell, with σ calibrated so that this single Gaussian release
//! meets the job's (ε, δ) under its accountant.
//!
//! Synthesis (post-processing): the noisy tables disagree (each has its own noise, some
//! cells are negative), so a graphical model is fitted to all of them at once by least
//! squares weighted by their noise (Private-PGM, [`crate::pgm`]) and rows are drawn from
//! it. Numeric values are drawn uniformly inside their bin. The default number of rows is
//! the model's total — the tables' noisy sums pooled by their variance, an estimate of the
//! contributed rows released by the same mechanism, so it costs nothing extra.

pub mod history;
pub mod params;
pub mod plan;
pub mod sampler;
pub mod task;

pub use params::MarginalsParams;
pub use plan::{MarginalsPlan, check};
pub use sampler::MarginalsSampler;
pub use task::MarginalsTask;

#[cfg(test)]
mod tests;
