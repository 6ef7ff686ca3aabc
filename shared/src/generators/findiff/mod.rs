//! DP-FinDiff (Sattarov, Schreyer & Borth): a Gaussian diffusion model over mixed-type
//! rows trained with DP-SGD on the distributed engine (`crate::dpsgd`).
//!
//! - Representation (`encoding`): numeric columns scaled by declared bounds, categorical
//!   columns through frozen random embeddings; nothing is computed from the rows.
//! - Training: ε-prediction with the *feature-aggregated* loss Σ_features (ε̂ − ε)² per
//!   row, clipped per unit. At fixed θ this equals the mean loss clipped at C/d with the
//!   update scaled by d. Timesteps follow the adaptive sampler P_k(t) ∝ t^{α_k}.
//! - Privacy: a unit-count release (Gaussian, sensitivity 1) fixes q = batch / N̂, then
//!   DP-SGD (Poisson rate q, σ, T steps); both are charged before the first round.
//! - Sampling: ancestral DDPM on a respaced schedule; post-processing, no budget.

pub mod diffusion;
pub mod encoding;
pub mod model;
pub mod params;
pub mod plan;
pub mod sampler;
pub mod task;

pub use model::FinDiffModel;
pub use params::FinDiffParams;
pub use plan::{FinDiffPlan, check};
pub use sampler::FinDiffSampler;
pub use task::{FinDiffModelSpec, FinDiffRound};
