//! Descriptions of the noise mechanisms rhosynth runs, each with its sensitivity and its
//! privacy map (RDP curve, PLD) stated next to it.
//!
//! Sensitivities are per *privacy unit* (a row, or a whole patient history). When a unit
//! can contribute to several examples or counts, the description carries that bound and
//! the privacy map scales the sensitivity by it.

use serde::{Deserialize, Serialize};

use super::PrivacyError;
use super::accountant::pld::{HockeyStick, Pld, RandomizedResponse, SubsampledGaussian};
use super::accountant::rdp::{self, RdpCurve};

/// What "neighbouring datasets" means for a guarantee.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Adjacency {
    /// One privacy unit added or removed (the dataset size is private).
    AddRemove,
    /// One privacy unit replaced by another (the dataset size is public).
    Substitution,
}

impl std::fmt::Display for Adjacency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Adjacency::AddRemove => "add/remove one unit",
            Adjacency::Substitution => "substitute one unit",
        })
    }
}

/// How a DP-SGD step picks its batch.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "scheme", rename_all = "snake_case", deny_unknown_fields)]
pub enum Sampling {
    /// Every unit joins the batch independently with probability `rate`. Add/remove
    /// adjacency; amplification by Mironov, Talwar & Zhang (2019).
    Poisson { rate: f64 },
}

/// A noise mechanism, as recorded in the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Mechanism {
    /// `releases` answers of a query with L2 sensitivity Δ = `l2_sensitivity` (per unit,
    /// under `adjacency`), each with N(0, (σΔ)²) noise on every coordinate, σ = `noise_multiplier`.
    /// RDP α/(2σ²) per release; the PLD is exact (μ-GDP, μ = 1/σ).
    Gaussian { l2_sensitivity: f64, noise_multiplier: f64, releases: u64, adjacency: Adjacency },
    /// One DP-SGD run: `steps` noisy sums of per-unit clipped gradients (clip norm C), noise
    /// N(0, (σC)²) per coordinate with σ = `noise_multiplier`. A sampled unit contributes
    /// at most `max_examples_per_unit` clipped examples, so its L2 sensitivity is that
    /// times C (1 when a unit's rows form one example or are summed before clipping).
    SubsampledGaussian { sampling: Sampling, noise_multiplier: f64, steps: u64, max_examples_per_unit: u32 },
    /// PATE GNMax: `queries` answered argmaxes of k = `classes`-class vote histograms with
    /// N(0, σ²) on every count. Adding or removing one unit changes one teacher's vote: L2
    /// sensitivity √2. Charged data-independently: RDP α/σ² per answer. Add/remove only:
    /// substituting a unit can change two teachers (2√2).
    GnMax { sigma: f64, classes: u32, queries: u64 },
    /// `selections` draws of the exponential mechanism: one candidate picked with
    /// probability ∝ exp(ε·score / (2Δ)) from scores that adding or removing one unit moves
    /// by at most Δ = `sensitivity`, so each draw is ε-DP and ε-bounded-range (add/remove only).
    /// RDP: min(α·ε²/8 (bounded range, Cesar & Rogers 2021), randomized response's RDP
    /// (any ε-DP mechanism)); PLD: randomized response's, which dominates any ε-DP
    /// mechanism — sound, looser than the bounded-range analysis.
    Exponential { sensitivity: f64, epsilon: f64, selections: u64 },
    /// An adaptive run that spends at most ρ of zero-concentrated DP (Bun & Steinke 2016)
    /// on Gaussian measurements (1/(2σ²) each, σ the noise multiplier) and
    /// exponential-mechanism draws (ε²/8 each, bounded range), their parameters chosen as
    /// it goes (AIM's annealing). The release side is a privacy filter that stops at ρ, and
    /// fully adaptive composition holds for Rényi DP at every order (Feldman & Zrnic 2021),
    /// so its RDP is α·ρ. The PLD accountant cannot analyse it. The releases' sensitivities
    /// are stated under `adjacency`.
    Zcdp { rho: f64, adjacency: Adjacency },
    /// Gaussian partition selection: the keys (e.g. a column's values) whose count of
    /// distinct units, plus N(0, (σ√L)²), exceeds τ = 1 + σ√L·Φ⁻¹(1 − δ_τ/L), each unit
    /// counted once per key in at most L = `max_partitions` keys. On the keys both
    /// neighbours hold it is the Gaussian mechanism with L2 sensitivity √L (RDP α/(2σ²));
    /// each of the ≤ L keys only one neighbour holds (count 1) passes with probability at
    /// most δ_τ/L, so the mechanism adds δ_τ = `threshold_delta` to the δ at which the
    /// composition is stated (Gopi et al. 2020; Google's DP library, Gaussian thresholding).
    /// Add/remove adjacency only.
    PartitionSelection { max_partitions: u32, noise_multiplier: f64, threshold_delta: f64 },
}

fn positive(name: &str, v: f64) -> Result<(), PrivacyError> {
    if v > 0.0 && v.is_finite() {
        Ok(())
    } else {
        Err(PrivacyError::InvalidParameter(format!("{name} must be a positive finite number, got {v}")))
    }
}

impl Mechanism {
    /// One DP-SGD run with Poisson sampling of units at `rate`, each unit one example.
    pub fn dp_sgd(rate: f64, noise_multiplier: f64, steps: u64) -> Self {
        Mechanism::SubsampledGaussian {
            sampling: Sampling::Poisson { rate },
            noise_multiplier,
            steps,
            max_examples_per_unit: 1,
        }
    }

    /// Checks parameter ranges; every privacy map assumes this passed.
    pub fn validate(&self) -> Result<(), PrivacyError> {
        match *self {
            Mechanism::Gaussian { l2_sensitivity, noise_multiplier, .. } => {
                positive("l2_sensitivity", l2_sensitivity)?;
                positive("noise_multiplier", noise_multiplier)
            }
            Mechanism::SubsampledGaussian { sampling, noise_multiplier, max_examples_per_unit, .. } => {
                positive("noise_multiplier", noise_multiplier)?;
                if max_examples_per_unit == 0 {
                    return Err(PrivacyError::InvalidParameter("max_examples_per_unit must be ≥ 1".into()));
                }
                let Sampling::Poisson { rate } = sampling;
                if !(rate > 0.0 && rate <= 1.0) {
                    return Err(PrivacyError::InvalidParameter(format!("sampling rate must be in (0, 1], got {rate}")));
                }
                Ok(())
            }
            Mechanism::GnMax { sigma, classes, .. } => {
                positive("sigma", sigma)?;
                if classes < 2 {
                    return Err(PrivacyError::InvalidParameter("GNMax needs at least 2 classes".into()));
                }
                Ok(())
            }
            Mechanism::Exponential { sensitivity, epsilon, .. } => {
                positive("sensitivity", sensitivity)?;
                positive("epsilon", epsilon)
            }
            Mechanism::Zcdp { rho, .. } => positive("rho", rho),
            Mechanism::PartitionSelection { max_partitions, noise_multiplier, threshold_delta } => {
                positive("noise_multiplier", noise_multiplier)?;
                if max_partitions == 0 || !(threshold_delta > 0.0 && threshold_delta < 1.0) {
                    return Err(PrivacyError::InvalidParameter(
                        "partition selection needs max_partitions ≥ 1 and 0 < threshold_delta < 1".into(),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The δ this mechanism adds outright to a composition's (its event of failure): the
    /// accountants state the rest at δ less the sum of these.
    pub fn added_delta(&self) -> f64 {
        match *self {
            Mechanism::PartitionSelection { threshold_delta, .. } => threshold_delta,
            _ => 0.0,
        }
    }

    /// Partition selection's threshold τ on a key's noisy unit count.
    pub fn selection_threshold(max_partitions: u32, noise_multiplier: f64, threshold_delta: f64) -> f64 {
        let l = f64::from(max_partitions);
        1.0 + noise_multiplier * l.sqrt() * super::math::normal_isf(threshold_delta / l)
    }

    /// Whether this mechanism's analysis holds under `adjacency`.
    pub fn supports(&self, adjacency: Adjacency) -> bool {
        match self {
            Mechanism::Gaussian { adjacency: a, .. } => *a == adjacency,
            Mechanism::SubsampledGaussian { sampling: Sampling::Poisson { .. }, .. } => {
                adjacency == Adjacency::AddRemove
            }
            // The caller states Δ under the job's adjacency; the map holds for either.
            Mechanism::Zcdp { adjacency: a, .. } => *a == adjacency,
            // Teachers are disjoint partitions keyed by the unit: substituting a unit can
            // change two teachers' votes (L2 2√2, four times the RDP the map charges).
            Mechanism::GnMax { .. } => adjacency == Adjacency::AddRemove,
            // Its Δ is a unit's under add/remove (the only place it runs is AIM's zCDP run).
            Mechanism::Exponential { .. } => adjacency == Adjacency::AddRemove,
            Mechanism::PartitionSelection { .. } => adjacency == Adjacency::AddRemove,
        }
    }

    /// Short human-readable summary for logs, the CLI and reports.
    pub fn describe(&self) -> String {
        match self {
            Mechanism::Gaussian { noise_multiplier, releases, .. } => {
                format!("Gaussian ×{releases} (σ/Δ = {noise_multiplier})")
            }
            Mechanism::SubsampledGaussian { sampling, noise_multiplier, steps, .. } => {
                format!("DP-SGD {steps} steps, σ = {noise_multiplier}, {sampling:?}")
            }
            Mechanism::GnMax { sigma, queries, .. } => format!("GNMax ×{queries} (σ = {sigma})"),
            Mechanism::Exponential { epsilon, selections, .. } => {
                format!("exponential mechanism ×{selections} (ε = {epsilon})")
            }
            Mechanism::Zcdp { rho, .. } => format!("adaptive run within ρ = {rho} (zCDP)"),
            Mechanism::PartitionSelection { max_partitions, noise_multiplier, threshold_delta } => format!(
                "partition selection (σ = {noise_multiplier}, ≤ {max_partitions} keys a unit, δ_τ = {threshold_delta})"
            ),
        }
    }

    /// Noise multiplier relative to one unit's sensitivity, for the Gaussian-based maps.
    fn unit_sigma(noise_multiplier: f64, max_examples_per_unit: u32) -> f64 {
        noise_multiplier / f64::from(max_examples_per_unit)
    }

    /// The RDP curve of the whole mechanism (all its releases) at `orders`.
    pub fn rdp(&self, orders: &[f64]) -> Result<RdpCurve, PrivacyError> {
        self.validate()?;
        Ok(match *self {
            Mechanism::Gaussian { noise_multiplier, releases, .. } => {
                RdpCurve::from_fn(orders, |a| rdp::gaussian(noise_multiplier, a)).times(releases)
            }
            Mechanism::SubsampledGaussian { sampling, noise_multiplier, steps, max_examples_per_unit } => {
                let sigma = Self::unit_sigma(noise_multiplier, max_examples_per_unit);
                let Sampling::Poisson { rate } = sampling;
                RdpCurve::from_fn(orders, |a| rdp::poisson_subsampled_gaussian(rate, sigma, a)).times(steps)
            }
            Mechanism::GnMax { sigma, queries, .. } => {
                RdpCurve::from_fn(orders, |a| super::gnmax::rdp_data_independent(sigma, a)).times(queries)
            }
            Mechanism::Exponential { epsilon, selections, .. } => {
                RdpCurve::from_fn(orders, |a| (a * epsilon * epsilon / 8.0).min(rdp::randomized_response(epsilon, a)))
                    .times(selections)
            }
            Mechanism::Zcdp { rho, .. } => RdpCurve::from_fn(orders, |a| a * rho),
            Mechanism::PartitionSelection { noise_multiplier, .. } => {
                RdpCurve::from_fn(orders, |a| rdp::gaussian(noise_multiplier, a))
            }
        })
    }

    /// Adds this mechanism to a PLD composition.
    pub fn compose_into(&self, pld: &mut PldComposition) -> Result<(), PrivacyError> {
        self.validate()?;
        match *self {
            Mechanism::Gaussian { noise_multiplier, releases, .. } => {
                pld.gaussian_mu_squared += releases as f64 / (noise_multiplier * noise_multiplier);
            }
            Mechanism::PartitionSelection { noise_multiplier, .. } => {
                pld.gaussian_mu_squared += 1.0 / (noise_multiplier * noise_multiplier);
            }
            Mechanism::GnMax { sigma, queries, .. } => {
                pld.gaussian_mu_squared += queries as f64 * 2.0 / (sigma * sigma);
            }
            Mechanism::Exponential { epsilon, selections, .. } => {
                let rr = RandomizedResponse { epsilon };
                pld.push(Pld::from_directions(&rr, &rr, pld.interval)?.self_compose(selections))?;
            }
            Mechanism::Zcdp { .. } => {
                return Err(PrivacyError::Unsupported(
                    "a zCDP budget has no PLD; the RDP accountant analyses it".into(),
                ));
            }
            Mechanism::SubsampledGaussian { sampling, noise_multiplier, steps, max_examples_per_unit } => {
                let sigma = Self::unit_sigma(noise_multiplier, max_examples_per_unit);
                match sampling {
                    Sampling::Poisson { rate: 1.0 } => pld.gaussian_mu_squared += steps as f64 / (sigma * sigma),
                    Sampling::Poisson { rate } => {
                        let remove = SubsampledGaussian { q: rate, sigma, remove: true };
                        let add = SubsampledGaussian { remove: false, ..remove };
                        pld.push(Pld::from_directions(&remove, &add, pld.interval)?.self_compose(steps))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A PLD composition under construction: Gaussian parts are kept exact (they compose by
/// adding μ²), everything else as a discretised PLD.
#[derive(Clone)]
pub struct PldComposition {
    pub interval: f64,
    pub gaussian_mu_squared: f64,
    pub discrete: Option<Pld>,
}

impl PldComposition {
    pub fn new(interval: f64) -> Self {
        Self { interval, gaussian_mu_squared: 0.0, discrete: None }
    }

    fn push(&mut self, pld: Pld) -> Result<(), PrivacyError> {
        self.discrete = Some(match self.discrete.take() {
            None => pld,
            Some(prev) => prev.compose(&pld)?,
        });
        Ok(())
    }

    /// ε at `delta` of everything composed so far.
    pub fn epsilon(self, delta: f64) -> Result<f64, PrivacyError> {
        let mu = self.gaussian_mu_squared.sqrt();
        match self.discrete {
            None if mu == 0.0 => Ok(0.0),
            None => Ok(super::accountant::pld::gaussian_epsilon(mu, delta)),
            Some(pld) if mu == 0.0 => Ok(pld.epsilon(delta)),
            Some(pld) => {
                let g = SubsampledGaussian { q: 1.0, sigma: 1.0 / mu, remove: true };
                let gaussian = Pld::from_directions(&g as &dyn HockeyStick, &g, self.interval)?;
                Ok(pld.compose(&gaussian)?.epsilon(delta))
            }
        }
    }
}

/// Sensitivities of a count histogram when a unit contributes at most `max_rows` rows:
/// `(L1, L2)`. In the worst case all rows land in one cell (L1 = L2 = m); substituting a
/// unit can also move them all to another cell (L1 = 2m, L2 = √2·m).
pub fn histogram_sensitivity(max_rows: u32, adjacency: Adjacency) -> (f64, f64) {
    let m = f64::from(max_rows);
    match adjacency {
        Adjacency::AddRemove => (m, m),
        Adjacency::Substitution => (2.0 * m, std::f64::consts::SQRT_2 * m),
    }
}
