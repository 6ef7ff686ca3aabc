//! Marginal calibration, a stage any generator may add (`[calibration]`): noisy 1-way
//! tables, and the target's pairs, counted on the workers like the marginals generator's
//! and released with a declared share of the job's budget (of ρ, its zCDP form); the
//! generator's output is then
//! reweighted to match them (`raking`) and resampled. The release is charged in the
//! generator's own ledger entry, and the generator's noise is calibrated with it in the
//! composition, so the job still costs its (ε, δ).

pub mod raking;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use crate::accounting::accountant::{AccountingOptions, zcdp_budget};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::Domain;
use crate::generators::PlanError;
use crate::generators::marginals::task::{MAX_MODEL_CELLS, MarginalsTask};
use crate::spec::JobSpec;

pub use raking::{CalibratedSampler, Targets};

/// The calibration a job's spec asks for, planned from public information alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPlan {
    /// Every column's 1-way table, then the target's pairs.
    pub task: MarginalsTask,
    /// σ of the tables' one Gaussian release (noise σ·Δ on every cell).
    pub noise_multiplier: f64,
    /// Units drawn per unit written.
    pub pool: u32,
}

impl CalibrationPlan {
    /// The plan of `spec`'s `[calibration]`, or `None` when it has none. Its release costs
    /// `epsilon_share` of ρ, the zCDP budget that meets the job's (ε, δ): the scale on which
    /// Gaussian releases add up, so that the generator keeps the rest of ρ.
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Option<Self>, PlanError> {
        let Some(calibration) = &spec.calibration else { return Ok(None) };
        let invalid = |message: String| PlanError::new("calibration", message);
        // Checked with the spec too; a plan never stands on an unchecked share.
        if !(calibration.epsilon_share > 0.0 && calibration.epsilon_share <= 0.5) {
            return Err(invalid(format!("epsilon_share must be in (0, 0.5], got {}", calibration.epsilon_share)));
        }
        let n = domain.columns.len();
        let mut tables: Vec<Vec<usize>> = (0..n).map(|c| vec![c]).collect();
        let target = spec.schema.target.as_deref().and_then(|t| domain.index_of(t));
        if let (Some(t), true) = (target, calibration.target_pairs) {
            tables.extend((0..n).filter(|&c| c != t).map(|c| vec![t, c]));
        }
        let task = MarginalsTask::new(spec, domain, tables, calibration.max_rows_per_unit);
        if task.cells() as f64 > MAX_MODEL_CELLS {
            return Err(invalid(format!("the tables hold more than {MAX_MODEL_CELLS:.0} cells")));
        }
        let p = &spec.privacy;
        let budget = zcdp_budget(p.epsilon, p.delta, options).map_err(|e| invalid(e.to_string()))?;
        let noise_multiplier = (2.0 * calibration.epsilon_share * budget).sqrt().recip();
        let plan = Self { task, noise_multiplier, pool: calibration.pool };
        Ok(Some(plan))
    }

    /// The tables' one Gaussian release.
    pub fn mechanism(&self) -> Mechanism {
        Mechanism::Gaussian {
            l2_sensitivity: self.task.sensitivity(),
            noise_multiplier: self.noise_multiplier,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }
    }

    /// The release's zCDP cost, 1/(2σ²).
    pub fn rho(&self) -> f64 {
        1.0 / (2.0 * self.noise_multiplier * self.noise_multiplier)
    }
}

/// A generator's mechanisms followed by its calibration's, if any: what it is charged for
/// and what its own noise is calibrated against.
pub fn with_calibration(mut mechanisms: Vec<Mechanism>, calibration: Option<&CalibrationPlan>) -> Vec<Mechanism> {
    mechanisms.extend(calibration.map(CalibrationPlan::mechanism));
    mechanisms
}
