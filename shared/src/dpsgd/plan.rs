//! The privacy plan of a DP-SGD run over privacy units, the same for every model the
//! engine trains: a Gaussian release of the unit count N̂ (sensitivity 1) fixes the
//! Poisson rate q = batch / N̂, then T = ⌈epochs / q⌉ rounds of the subsampled Gaussian
//! mechanism, and any mechanisms the generator runs after training (charged with it).

use serde::{Deserialize, Serialize};

use super::run::RunParams;
use crate::accounting::PrivacyError;
use crate::accounting::accountant::{Accountant, AccountingOptions, PrivacyCost, account, calibrate_sigma, delta_left};
use crate::accounting::math::normal_sf;
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::calibration::{CalibrationPlan, with_calibration};
use crate::generators::{PlanError, require_positive};
use crate::spec::JobSpec;

/// A DP-SGD run as planned from the spec (a checkpoint keeps it, so a resumed run trains
/// as charged).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    pub run: RunParams,
    /// Mechanisms charged with the run after its rounds (e.g. a private selection).
    pub after_training: Vec<Mechanism>,
    /// The output's marginal calibration, charged with the run and released after it.
    #[serde(default)]
    pub calibration: Option<Box<CalibrationPlan>>,
}

impl RunPlan {
    /// The checked plan of a generator's run table: epochs, batch, clip and count noise
    /// positive, σ positive when declared, micro-batches of at least one unit; nothing
    /// after training yet.
    pub fn new(generator: &'static str, run: &RunParams) -> Result<Self, PlanError> {
        let positive = [
            ("epochs", run.epochs),
            ("batch_size", run.batch_size),
            ("clip", run.clip),
            ("count_noise_multiplier", run.count_noise_multiplier),
        ];
        require_positive(generator, &positive)?;
        if run.noise_multiplier.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
            return Err(PlanError::new(generator, "noise_multiplier must be a positive number"));
        }
        // The count's noise spans the orders a run is held at (`COUNT_BAND`): a few
        // hundred units of noise already hide any one unit, and more would only cost
        // calibrations.
        if !(run.count_noise_multiplier <= MAX_COUNT_NOISE_MULTIPLIER) {
            return Err(PlanError::new(
                generator,
                format!("count_noise_multiplier must be at most {MAX_COUNT_NOISE_MULTIPLIER}"),
            ));
        }
        if run.micro_batch == 0 {
            return Err(PlanError::new(generator, "micro_batch must be ≥ 1"));
        }
        Ok(Self { run: run.clone(), after_training: Vec::new(), calibration: None })
    }

    /// A stored plan (JSON) as this version reads it: a checkpoint written before the run
    /// table held the run's settings beside `after_training`; they move into `run`, so a
    /// run charged before an upgrade resumes after it.
    pub fn upgrade_stored(plan: &mut serde_json::Value) {
        let Some(fields) = plan.as_object_mut() else { return };
        if fields.contains_key("run") {
            return;
        }
        let settings: Vec<String> = fields.keys().filter(|k| RunParams::has_field(k)).cloned().collect();
        let run = settings.into_iter().filter_map(|k| fields.remove_entry(&k)).collect();
        fields.insert("run".into(), serde_json::Value::Object(run));
    }

    /// Poisson rate q = batch / N̂ (at most 1).
    pub fn rate(&self, noisy_units: f64) -> f64 {
        (self.run.batch_size / noisy_units.max(1.0)).min(1.0)
    }

    /// A stand-in unit count for the pre-flight budget check (a calibrated run's cost
    /// does not depend on q).
    pub fn provisional_units(&self) -> f64 {
        self.run.batch_size * 100.0
    }

    /// T = ⌈epochs / q⌉ rounds.
    pub fn steps(&self, rate: f64) -> u64 {
        (self.run.epochs / rate).ceil().max(1.0) as u64
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
            noise_multiplier: self.run.count_noise_multiplier,
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

    /// The RDP order at which the job is held for a pair of neighbouring datasets whose
    /// unit count is `units`: the best order of the run calibrated at the rate of the grid
    /// count at or below `units` (a public function of `units`, cheap to tabulate).
    pub fn order_for(&self, spec: &JobSpec, options: &AccountingOptions, units: f64) -> Result<f64, PrivacyError> {
        self.order_at_grid(spec, options, self.grid_step(units))
    }

    /// The grid step k of a unit count, COUNT_GRID^k ≤ units (every count up to one
    /// batch samples at q = 1 and shares the batch's step).
    fn grid_step(&self, units: f64) -> i32 {
        let units = units.max(self.run.batch_size).max(1.0);
        (units.ln() / COUNT_GRID.ln()).floor() as i32
    }

    /// [`RunPlan::order_for`] at the grid count COUNT_GRID^k.
    fn order_at_grid(&self, spec: &JobSpec, options: &AccountingOptions, step: i32) -> Result<f64, PrivacyError> {
        let rate = self.rate(COUNT_GRID.powi(step));
        let delta = held_delta(spec)?;
        // The calibrated run's order, a declared σ or not: a declared σ that meets ε at
        // its own best order and not at this one is below the calibrated σ, so it meets
        // it at no order.
        let sigma =
            calibrate_sigma(spec.privacy.epsilon, delta, Accountant::Rdp, options, |s| self.mechanisms(rate, s))?;
        let cost = account(&self.mechanisms(rate, sigma), Accountant::Rdp, delta, options)?;
        cost.order.ok_or_else(|| {
            PrivacyError::Unreachable(format!(
                "no RDP order bounds the run at ε = {} and δ = {}",
                spec.privacy.epsilon, spec.privacy.delta
            ))
        })
    }

    /// The orders of every unit count within [`COUNT_BAND`] count-σ (and the unit N̂ was
    /// rounded to) of `noisy_units`: the run released after that N̂ must meet the job's
    /// target at each of them.
    pub fn held_orders(
        &self,
        spec: &JobSpec,
        options: &AccountingOptions,
        noisy_units: f64,
    ) -> Result<Vec<f64>, PrivacyError> {
        // One unit more: N̂ is the noisy count rounded to a whole unit.
        let reach = COUNT_BAND * self.run.count_noise_multiplier + 1.0;
        let mut orders = Vec::new();
        for step in self.grid_step(noisy_units - reach)..=self.grid_step(noisy_units + reach) {
            let order = self.order_at_grid(spec, options, step)?;
            if !orders.contains(&order) {
                orders.push(order);
            }
        }
        Ok(orders)
    }

    /// The job's (ε, δ) cost after `noisy_units` with noise multiplier `sigma`: the worst
    /// over its held orders, each converted at δ less the count's tail.
    pub fn held_cost(
        &self,
        spec: &JobSpec,
        options: &AccountingOptions,
        noisy_units: f64,
        sigma: f64,
    ) -> Result<PrivacyCost, PrivacyError> {
        let orders = self.held_orders(spec, options, noisy_units)?;
        self.cost_at(spec, options, self.rate(noisy_units), sigma, &orders)
    }

    /// The smallest σ for which the job meets its (ε, δ) at every held order of
    /// `noisy_units` (see [`COUNT_BAND`] for why).
    pub fn calibrate(
        &self,
        spec: &JobSpec,
        options: &AccountingOptions,
        noisy_units: f64,
    ) -> Result<f64, PrivacyError> {
        let orders = self.held_orders(spec, options, noisy_units)?;
        self.calibrate_at(spec, options, self.rate(noisy_units), &orders)
    }

    /// The run's noise multiplier after `noisy_units` (declared, or calibrated) and the
    /// job's cost at its held orders, stated at the job's δ (the orders found once).
    pub fn settle(
        &self,
        spec: &JobSpec,
        options: &AccountingOptions,
        noisy_units: f64,
    ) -> Result<(f64, PrivacyCost), PrivacyError> {
        let (rate, orders) = (self.rate(noisy_units), self.held_orders(spec, options, noisy_units)?);
        let sigma = match self.run.noise_multiplier {
            Some(sigma) => sigma,
            None => self.calibrate_at(spec, options, rate, &orders)?,
        };
        let held = self.cost_at(spec, options, rate, sigma, &orders)?;
        Ok((sigma, PrivacyCost { delta: spec.privacy.delta, ..held }))
    }

    /// The worst cost over `orders` at `rate` and `sigma`, at δ less the count's tail.
    fn cost_at(
        &self,
        spec: &JobSpec,
        options: &AccountingOptions,
        rate: f64,
        sigma: f64,
        orders: &[f64],
    ) -> Result<PrivacyCost, PrivacyError> {
        let delta = held_delta(spec)?;
        let mut worst: Option<PrivacyCost> = None;
        for &order in orders {
            let cost = account(&self.mechanisms(rate, sigma), Accountant::Rdp, delta, &at_order(options, order))?;
            if worst.as_ref().is_none_or(|w| cost.epsilon > w.epsilon) {
                worst = Some(cost);
            }
        }
        worst.ok_or_else(|| PrivacyError::Unreachable("no RDP order holds the run".into()))
    }

    /// The smallest σ meeting the job's (ε, δ less the tail) at every one of `orders`.
    fn calibrate_at(
        &self,
        spec: &JobSpec,
        options: &AccountingOptions,
        rate: f64,
        orders: &[f64],
    ) -> Result<f64, PrivacyError> {
        let delta = held_delta(spec)?;
        let mut sigma: f64 = 0.0;
        for &order in orders {
            let at = calibrate_sigma(spec.privacy.epsilon, delta, Accountant::Rdp, &at_order(options, order), |s| {
                self.mechanisms(rate, s)
            })?;
            sigma = sigma.max(at);
        }
        Ok(sigma)
    }
}

/// Count-σ multiples within which N̂ lies but for [`count_tail`] of the time.
///
/// Why: q, T and σ follow the released count N̂, so the run is chosen adaptively. Rényi
/// divergences of one order add up under adaptive composition (ρ(α) ≤ ρ_count(α) +
/// sup over N̂ of ρ_run(α; N̂)); picking each N̂'s best order afterwards bounds no such
/// sum. For neighbouring datasets with N units the job is held at one order α_N
/// ([`RunPlan::order_for`]), and every N̂ within ±6σ of N is calibrated to meet the job's
/// ε at α_N, at δ less the tail. Outside the band (probability [`count_tail`]) nothing is
/// claimed and the tail is counted in δ, so the job is (ε, δ)-DP whatever N̂ turns out
/// to be. Since N is private, the run released after N̂ meets the target at the order of
/// every N whose band holds N̂ ([`RunPlan::held_orders`]); at large N that is one or two
/// orders, next to the best one, so holding them costs almost no noise.
pub const COUNT_BAND: f64 = 6.0;

/// The largest count noise multiplier a run may declare.
pub const MAX_COUNT_NOISE_MULTIPLIER: f64 = 1000.0;

/// Ratio of the geometric grid of unit counts on which [`RunPlan::order_for`] is fixed.
const COUNT_GRID: f64 = 1.05;

/// P[|N̂ − N| > 6σ]: the δ outside the band.
pub fn count_tail() -> f64 {
    2.0 * normal_sf(COUNT_BAND)
}

/// The job's δ less the count's tail.
fn held_delta(spec: &JobSpec) -> Result<f64, PrivacyError> {
    delta_left(count_tail(), spec.privacy.delta)
}

/// `options` with the one RDP order `order`.
fn at_order(options: &AccountingOptions, order: f64) -> AccountingOptions {
    AccountingOptions { orders: vec![order], ..options.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plan stored with its settings flat (before the run table) reads as the same plan;
    /// one stored now is left as it is.
    #[test]
    fn a_plan_stored_before_the_run_table_reads_the_same() {
        let run = RunParams { epochs: 3.0, noise_multiplier: Some(1.1), ..RunParams::default() };
        let plan = RunPlan::new("test", &run).unwrap();
        let mut flat = serde_json::to_value(&plan).unwrap();
        let settings = flat.as_object_mut().unwrap().remove("run").unwrap();
        flat.as_object_mut().unwrap().extend(settings.as_object().unwrap().clone());
        assert!(serde_json::from_value::<RunPlan>(flat.clone()).is_err());
        RunPlan::upgrade_stored(&mut flat);
        assert_eq!(serde_json::from_value::<RunPlan>(flat).unwrap(), plan);
        let mut current = serde_json::to_value(&plan).unwrap();
        RunPlan::upgrade_stored(&mut current);
        assert_eq!(current, serde_json::to_value(&plan).unwrap());
    }
}
