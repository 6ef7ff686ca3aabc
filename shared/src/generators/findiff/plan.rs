//! The model and the privacy parameters that do not depend on the data.

use super::encoding::TabularEncoding;
use super::model::DenoiserConfig;
use super::task::FinDiffModelSpec;
use crate::accounting::accountant::AccountingOptions;
use crate::calibration::CalibrationPlan;
use crate::data::domain::Domain;
use crate::dpsgd::plan::RunPlan;
use crate::entropy::os_seed;
use crate::generators::findiff::FinDiffParams;
use crate::generators::{GeneratorSpec, PlanError, require_columns, require_positive};
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "findiff";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}
/// A DP-FinDiff job's plan: the model and the privacy parameters that do not depend on
/// the data. The run's sampling rate depends on the DP unit count and is fixed later.
#[derive(Clone, Debug)]
pub struct FinDiffPlan {
    pub model: FinDiffModelSpec,
    pub params: FinDiffParams,
    pub run: RunPlan,
}

/// Plans from the spec and the declared domain alone, as a job is submitted.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    FinDiffPlan::new(spec, domain, &AccountingOptions::default()).map(drop)
}

impl FinDiffPlan {
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        let GeneratorSpec::Findiff(params) = spec.generator.clone() else {
            return Err(invalid("the job's generator is another"));
        };
        let mut run = RunPlan::new(GENERATOR, &params.run)?;
        run.calibration = CalibrationPlan::new(spec, domain, options)?.map(Box::new);
        require_positive(GENERATOR, &[("beta_start", params.beta_start), ("beta_end", params.beta_end)])?;
        if params.beta_end >= 1.0 || params.beta_start > params.beta_end {
            return Err(invalid("need 0 < beta_start ≤ beta_end < 1"));
        }
        // Each round's exponent travels to the workers as JSON, which holds finite numbers only.
        if !(params.alpha_start.is_finite() && params.alpha_end.is_finite()) {
            return Err(invalid("alpha_start and alpha_end must be finite numbers"));
        }
        if params.diffusion_steps == 0 || params.sampling_steps == 0 || params.sampling_steps > params.diffusion_steps {
            return Err(invalid("need 1 ≤ sampling_steps ≤ diffusion_steps"));
        }
        if params.hidden == 0
            || params.time_embedding < 2
            || params.embedding_width == 0
            || params.max_rows_per_unit == 0
        {
            return Err(invalid("hidden, embedding_width, max_rows_per_unit must be ≥ 1 and time_embedding ≥ 2"));
        }
        require_columns(GENERATOR, domain)?;
        let seed = os_seed().map_err(|e| invalid(e.to_string()))?;
        let encoding = TabularEncoding::new(domain, params.embedding_width, seed);
        let denoiser = DenoiserConfig::new(encoding.width, params.hidden, params.blocks, params.time_embedding);
        let model = FinDiffModelSpec {
            domain: domain.clone(),
            encoding,
            denoiser,
            diffusion_steps: params.diffusion_steps,
            beta_start: params.beta_start,
            beta_end: params.beta_end,
            max_rows_per_unit: params.max_rows_per_unit,
        };
        Ok(Self { model, params, run })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{demo_job, generator};

    /// A timestep exponent JSON cannot carry is refused when the job is submitted, not
    /// after its run is charged (every round would fail on the workers).
    #[test]
    fn a_timestep_exponent_that_is_not_finite_is_refused_at_submission() {
        for alphas in ["alpha_start = nan", "alpha_end = inf", "alpha_start = -inf"] {
            let spec = demo_job(&generator("findiff", alphas));
            let refused = check(&spec, &Domain::from_spec(&spec)).unwrap_err().to_string();
            assert!(refused.contains("alpha_start and alpha_end must be finite"), "{alphas}: {refused}");
        }
        let spec = demo_job(&generator("findiff", "alpha_start = 2.0"));
        check(&spec, &Domain::from_spec(&spec)).unwrap();
    }
}
