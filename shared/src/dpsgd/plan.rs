//! The privacy plan of a DP-SGD run over privacy units, the same for every model the
//! engine trains: a Gaussian release of the unit count N̂ (sensitivity 1) fixes the
//! Poisson rate q = batch / N̂, then T = ⌈epochs / q⌉ rounds of the subsampled Gaussian
//! mechanism, and any mechanisms the generator runs after training (charged with it).

use serde::{Deserialize, Serialize};

use super::optimizer::{OptimizerSpec, Schedule};
use crate::accounting::PrivacyError;
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::calibration::{CalibrationPlan, with_calibration};
use crate::spec::JobSpec;

/// The checked [`RunPlan`] of a DP-SGD generator's parameters, whose sections share the
/// training fields by name: epochs, batch, clip and count noise positive, σ positive when
/// declared, micro-batches of at least one unit; nothing after training yet.
/// `run_plan!(GENERATOR, params)` → `Result<RunPlan, PlanError>`.
macro_rules! run_plan {
    ($generator:expr, $params:expr) => {{
        let p = &$params;
        let positive = [
            ("epochs", p.epochs),
            ("batch_size", p.batch_size),
            ("clip", p.clip),
            ("count_noise_multiplier", p.count_noise_multiplier),
        ];
        $crate::generators::require_positive($generator, &positive).and_then(|()| {
            if p.noise_multiplier.is_some_and(|s: f64| !(s.is_finite() && s > 0.0)) {
                return Err($crate::generators::PlanError::new(
                    $generator,
                    "noise_multiplier must be a positive number",
                ));
            }
            if p.micro_batch == 0 {
                return Err($crate::generators::PlanError::new($generator, "micro_batch must be ≥ 1"));
            }
            Ok($crate::dpsgd::plan::RunPlan {
                epochs: p.epochs,
                batch_size: p.batch_size,
                clip: p.clip,
                noise_multiplier: p.noise_multiplier,
                count_noise_multiplier: p.count_noise_multiplier,
                after_training: Vec::new(),
                calibration: None,
                optimizer: p.optimizer.clone(),
                schedule: p.schedule.clone(),
                micro_batch: p.micro_batch,
                checkpoint_every: p.checkpoint_every,
            })
        })
    }};
}
pub(crate) use run_plan;

/// A DP-SGD run as planned from the spec (a checkpoint keeps it, so a resumed run trains
/// as charged).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    /// Expected passes over the units.
    pub epochs: f64,
    /// Expected units per round q·N̂.
    pub batch_size: f64,
    /// Per-unit L2 clipping norm C.
    pub clip: f64,
    /// σ as declared; `None`: calibrated to the job's (ε, δ).
    pub noise_multiplier: Option<f64>,
    /// Noise multiplier of the unit-count release.
    pub count_noise_multiplier: f64,
    /// Mechanisms charged with the run after its rounds (e.g. a private selection).
    pub after_training: Vec<Mechanism>,
    /// The output's marginal calibration, charged with the run and released after it.
    #[serde(default)]
    pub calibration: Option<Box<CalibrationPlan>>,
    pub optimizer: OptimizerSpec,
    pub schedule: Schedule,
    /// Units per backward pass on a worker (memory only).
    pub micro_batch: usize,
    /// Rounds between coordinator checkpoints.
    pub checkpoint_every: u64,
}

impl RunPlan {
    /// Poisson rate q = batch / N̂ (at most 1).
    pub fn rate(&self, noisy_units: f64) -> f64 {
        (self.batch_size / noisy_units.max(1.0)).min(1.0)
    }

    /// A stand-in rate for the pre-flight budget check (a calibrated run's cost does not
    /// depend on q).
    pub fn provisional_rate(&self) -> f64 {
        self.rate(self.batch_size * 100.0)
    }

    /// T = ⌈epochs / q⌉ rounds.
    pub fn steps(&self, rate: f64) -> u64 {
        (self.epochs / rate).ceil().max(1.0) as u64
    }

    /// The unit count (sensitivity 1 under add/remove of a unit), then the run: each unit
    /// is one example; then what follows it, and the calibration.
    pub fn mechanisms(&self, rate: f64, sigma: f64) -> Vec<Mechanism> {
        let mut mechanisms = vec![self.count_mechanism(), self.run_mechanism(rate, sigma)];
        mechanisms.extend(self.after_training.iter().cloned());
        with_calibration(mechanisms, self.calibration.as_deref())
    }

    /// The unit-count release that fixes q (charged as its own ledger entry as soon as it
    /// is drawn: everything derived from it, refusals included, is then paid for).
    pub fn count_mechanism(&self) -> Mechanism {
        Mechanism::Gaussian {
            l2_sensitivity: 1.0,
            noise_multiplier: self.count_noise_multiplier,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }
    }

    /// The DP-SGD rounds at rate q and noise multiplier σ.
    pub fn run_mechanism(&self, rate: f64, sigma: f64) -> Mechanism {
        Mechanism::dp_sgd(rate, sigma, self.steps(rate))
    }

    /// What the run's own ledger entry charges: its rounds and what follows them.
    pub fn charged_with_run(&self, rate: f64, sigma: f64) -> Vec<Mechanism> {
        self.mechanisms(rate, sigma).split_off(1)
    }

    /// The smallest σ for which the whole job meets its (ε, δ).
    pub fn calibrate(&self, spec: &JobSpec, options: &AccountingOptions, rate: f64) -> Result<f64, PrivacyError> {
        calibrate_sigma(spec.privacy.epsilon, spec.privacy.delta, spec.privacy.accountant, options, |s| {
            self.mechanisms(rate, s)
        })
    }
}
