//! AIM (McKenna, Mullins, Sheldon & Miklau 2022): adaptive, workload-aware selection of
//! marginals with graphical-model inference.
//!
//! What it measures: the workers count every candidate table once — every subset of the
//! workload's column sets (by default every set of three columns while their tables fit the cell budget, else every pair and the smallest triples), each unit contributing
//! at most m = `max_rows_per_unit` rows — and return exact sums, which stay on the
//! coordinator as private values. Nothing is released from them but through the rounds.
//!
//! The rounds: first every column's 1-way table with Gaussian noise; then, while budget
//! remains, the exponential mechanism picks the candidate whose model marginal is worst
//! (quality w_r·(‖M_r(D) − M_r(p̂)‖₁ − √(2/π)·σm·n_r), sensitivity m·max w), a Gaussian
//! measures it, and the graphical model p̂ ([`crate::pgm`]) is refitted to everything
//! measured. Only candidates whose addition keeps the model within the spent share of
//! `max_model_cells` are eligible. When a measurement barely moved the model (by less than
//! its expected noise) the next rounds spend more: σ halves and ε doubles (annealing);
//! the last round spends exactly what is left.
//!
//! Privacy: the whole run is one zCDP budget ρ, calibrated to the job's (ε, δ) with the
//! RDP accountant and charged before the first release; each Gaussian costs 1/(2σ²) and
//! each draw ε²/8 from it, and the release filter refuses anything beyond ρ (see
//! `Mechanism::Zcdp`). Sampling and the default row count (the model's total) are
//! post-processing.

pub mod params;
pub mod plan;
pub mod rounds;

pub use params::{AimParams, Workload, WorkloadRule};
pub use plan::{AimPlan, check};

#[cfg(test)]
mod tests;
