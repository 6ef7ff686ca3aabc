//! The history copula: whole unit histories whose values keep their dynamics, from few
//! released numbers. Each column's values are a monotone map of a latent normal (a
//! Gaussian copula over its public bins); the latent normals follow a stationary VAR(1)
//! from row to row. A DP model whose parameters are a few released statistics, so that
//! the dynamics survive the noise at the cohort sizes people have, where DP-SGD of a
//! transformer does not (README, "Histories").
//!
//! - `task`: the workers' two rounds — each unit's margins (a share per block, L1 ≤ 1),
//!   then its mean products of normal scores (same-row and lag-1), clipped in L2.
//! - `plan`: the three Gaussian releases (margins, moments, lengths), calibrated together.
//! - `model`: the copula fitted to released values (post-processing): scores of bins,
//!   latent correlations corrected for coarse bins, A = R₁R₀⁻¹, the innovations.
//! - `shape`: each column's step-like lag dependence (two bounded ramps of its own
//!   previous latent), and the stationary map it needs.
//! - `sampler`: histories drawn from it.
//! - `simulated`: the same fit in one process, for tests and benchmarks.

pub mod model;
pub mod params;
pub mod plan;
pub mod sampler;
pub mod shape;
pub mod simulated;
pub mod task;

pub use model::{CopulaModel, Margin};
pub use params::HistoryCopulaParams;
pub use plan::{HistoryCopulaPlan, check};
pub use sampler::CopulaSampler;
pub use task::{CopulaLayout, HistoryStatisticsTask, Stage};

#[cfg(test)]
mod tests;
