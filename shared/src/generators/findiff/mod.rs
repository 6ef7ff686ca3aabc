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

use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{PlanError, require_columns, require_positive};
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::Domain;
use crate::data::examples::Examples;
use crate::dpsgd::ghost::LinearHook;
use crate::dpsgd::params::LinearStack;
use crate::dpsgd::{DpModel, RoundSettings, RowRef};
use crate::entropy::os_seed;
use diffusion::{Draw, Schedule, draw, timestep_cdf};
use encoding::TabularEncoding;
use model::{Denoiser, DenoiserConfig};

/// This generator's name in plan errors.
const GENERATOR: &str = "findiff";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// Everything a worker needs to rebuild the model of a job (no weights).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FinDiffModelSpec {
    pub domain: Domain,
    pub encoding: TabularEncoding,
    pub denoiser: DenoiserConfig,
    pub diffusion_steps: u32,
    pub beta_start: f64,
    pub beta_end: f64,
    pub max_rows_per_unit: u32,
}

impl FinDiffModelSpec {
    pub fn schedule(&self) -> Schedule {
        Schedule::linear(self.diffusion_steps, self.beta_start, self.beta_end)
    }

    /// The worker's examples: its partitions encoded into the feature space.
    pub async fn load_examples(&self, urls: &[String]) -> Result<Examples, crate::data::DataError> {
        Examples::load(urls, &self.domain, self.max_rows_per_unit, self.encoding.width, |batch, row, out| {
            self.encoding.encode_row(batch, row, out)
        })
        .await
    }
}

/// One DP-SGD round of a DP-FinDiff job, as a worker receives it (weights follow it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FinDiffRound {
    pub settings: RoundSettings,
    pub model: FinDiffModelSpec,
    /// α_k of the adaptive timestep sampler for this round's epoch.
    pub timestep_exponent: f64,
}

/// The denoiser with its diffusion schedule and this round's timestep distribution.
pub struct FinDiffModel {
    pub denoiser: Denoiser,
    pub schedule: Schedule,
    timestep_cdf: Vec<f64>,
}

impl FinDiffModel {
    pub fn new(spec: &FinDiffModelSpec, device: &Device) -> Self {
        let schedule = spec.schedule();
        let timestep_cdf = timestep_cdf(schedule.steps(), 0.0);
        Self { denoiser: spec.denoiser.init(device), schedule, timestep_cdf }
    }

    /// A copy whose parameters track gradients: the ordinary (non-private) backward pass,
    /// for baselines and for checking the ghost norms against a per-example loop.
    pub fn tracked(&self) -> Self {
        use burn::module::Module;
        Self {
            denoiser: self.denoiser.clone().train(),
            schedule: self.schedule.clone(),
            timestep_cdf: self.timestep_cdf.clone(),
        }
    }

    /// Sets the adaptive sampler's exponent α_k for the coming round.
    pub fn set_timestep_exponent(&mut self, exponent: f64) {
        self.timestep_cdf = timestep_cdf(self.schedule.steps(), exponent);
    }
}

/// A row's timestep and noise, keyed by the round seed, its unit and its position in the
/// unit: independent of which worker or micro-batch the row lands in.
fn keyed_draw(seed: &[u8; 32], row: &RowRef<'_>, cdf: &[f64], width: usize) -> Draw {
    let mut hasher = Sha256::new();
    hasher.update(seed);
    hasher.update((row.unit.len() as u64).to_le_bytes());
    hasher.update(row.unit.as_bytes());
    hasher.update((row.position as u64).to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(hasher.finalize().into());
    draw(cdf, width, &mut rng)
}

impl LinearStack for FinDiffModel {
    fn linears(&self) -> Vec<&Linear> {
        self.denoiser.linears()
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        self.denoiser.linears_mut()
    }
}

impl DpModel for FinDiffModel {
    fn losses(
        &self,
        examples: &Examples,
        rows: &[RowRef<'_>],
        seed: &[u8; 32],
        device: &Device,
        hook: &mut impl LinearHook,
    ) -> Tensor<1> {
        let width = examples.width;
        let mut x0 = Vec::with_capacity(rows.len() * width);
        let mut draws = Vec::with_capacity(rows.len());
        for row in rows {
            x0.extend_from_slice(&examples.x[row.row * width..(row.row + 1) * width]);
            draws.push(keyed_draw(seed, row, &self.timestep_cdf, width));
        }
        diffusion::losses(&self.denoiser, &self.schedule, &x0, &draws, width, device, hook)
    }
}

/// A DP-FinDiff job's plan: the model and the privacy parameters that do not depend on
/// the data. The sampling rate depends on the DP unit count and is fixed later.
#[derive(Clone, Debug)]
pub struct FinDiffPlan {
    pub model: FinDiffModelSpec,
    pub params: crate::spec::FinDiffParams,
}

impl FinDiffPlan {
    pub fn new(spec: &crate::spec::JobSpec, domain: &Domain) -> Result<Self, PlanError> {
        let crate::spec::GeneratorSpec::Findiff(params) = spec.generator.clone() else {
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
    pub fn calibrate(
        &self,
        spec: &crate::spec::JobSpec,
        options: &AccountingOptions,
        rate: f64,
    ) -> Result<f64, crate::accounting::PrivacyError> {
        calibrate_sigma(spec.privacy.epsilon, spec.privacy.delta, spec.privacy.accountant, options, |s| {
            self.mechanisms(rate, s)
        })
    }
}
