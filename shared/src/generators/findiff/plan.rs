//! The model and the privacy parameters that do not depend on the data.

use super::encoding::TabularEncoding;
use super::model::DenoiserConfig;
use super::task::FinDiffModelSpec;
use crate::accounting::PrivacyError;
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::Domain;
use crate::entropy::os_seed;
use crate::generators::{PlanError, require_columns, require_positive};
use crate::spec::{FinDiffParams, GeneratorSpec, JobSpec};

/// This generator's name in plan errors.
const GENERATOR: &str = "findiff";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}
/// A DP-FinDiff job's plan: the model and the privacy parameters that do not depend on
/// the data. The sampling rate depends on the DP unit count and is fixed later.
#[derive(Clone, Debug)]
pub struct FinDiffPlan {
    pub model: FinDiffModelSpec,
    pub params: FinDiffParams,
}

impl FinDiffPlan {
    pub fn new(spec: &JobSpec, domain: &Domain) -> Result<Self, PlanError> {
        let GeneratorSpec::Findiff(params) = spec.generator.clone() else {
            return Err(invalid("the job's generator is another"));
        };
        let positive = [
            ("epochs", params.epochs),
            ("batch_size", params.batch_size),
            ("clip", params.clip),
            ("count_noise_multiplier", params.count_noise_multiplier),
            ("beta_start", params.beta_start),
            ("beta_end", params.beta_end),
        ];
        require_positive(GENERATOR, &positive)?;
        if params.noise_multiplier.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
            return Err(invalid("noise_multiplier must be a positive number"));
        }
        if params.beta_end >= 1.0 || params.beta_start > params.beta_end {
            return Err(invalid("need 0 < beta_start ≤ beta_end < 1"));
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
        Ok(Self { model, params })
    }

    /// Poisson rate q = batch / N̂ (at most 1).
    pub fn rate(&self, noisy_units: f64) -> f64 {
        (self.params.batch_size / noisy_units.max(1.0)).min(1.0)
    }

    /// A stand-in rate for the pre-flight budget check (a calibrated run's cost does not
    /// depend on q).
    pub fn provisional_rate(&self) -> f64 {
        self.rate(self.params.batch_size * 100.0)
    }

    /// T = ⌈epochs / q⌉ rounds.
    pub fn steps(&self, rate: f64) -> u64 {
        (self.params.epochs / rate).ceil().max(1.0) as u64
    }

    /// The unit count (sensitivity 1 under add/remove of a unit), then DP-SGD: each unit
    /// is one example (its rows are summed before clipping).
    pub fn mechanisms(&self, rate: f64, sigma: f64) -> Vec<Mechanism> {
        vec![self.count_mechanism(), self.run_mechanism(rate, sigma)]
    }

    /// The unit-count release that fixes q (charged as its own ledger entry as soon as it
    /// is drawn: everything derived from it, refusals included, is then paid for).
    pub fn count_mechanism(&self) -> Mechanism {
        Mechanism::Gaussian {
            l2_sensitivity: 1.0,
            noise_multiplier: self.params.count_noise_multiplier,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }
    }

    /// The DP-SGD run at rate q and noise multiplier σ.
    pub fn run_mechanism(&self, rate: f64, sigma: f64) -> Mechanism {
        Mechanism::dp_sgd(rate, sigma, self.steps(rate))
    }

    /// The smallest σ for which the whole job meets its (ε, δ).
    pub fn calibrate(&self, spec: &JobSpec, options: &AccountingOptions, rate: f64) -> Result<f64, PrivacyError> {
        calibrate_sigma(spec.privacy.epsilon, spec.privacy.delta, spec.privacy.accountant, options, |s| {
            self.mechanisms(rate, s)
        })
    }
}
