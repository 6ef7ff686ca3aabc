//! Privacy accountants: from a list of mechanisms to one (ε, δ) guarantee.
//!
//! A job picks `rdp` (Rényi DP) or `pld` (privacy loss distributions, tighter for long
//! DP-SGD runs) to state its own cost; the ledger records which, and composes the
//! mechanisms of all jobs under both, keeping the tighter total.

pub mod pld;
pub mod rdp;

use serde::{Deserialize, Serialize};

use super::PrivacyError;
use super::mechanism::{Adjacency, Mechanism, PldComposition};
pub use rdp::{Conversion, RdpCurve};

/// Which analysis turns mechanisms into (ε, δ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Accountant {
    Rdp,
    Pld,
}

impl std::fmt::Display for Accountant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accountant::Rdp => "rdp",
            Accountant::Pld => "pld",
        })
    }
}

impl std::str::FromStr for Accountant {
    type Err = PrivacyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rdp" => Ok(Accountant::Rdp),
            "pld" => Ok(Accountant::Pld),
            other => Err(PrivacyError::InvalidParameter(format!("unknown accountant {other:?} (use rdp or pld)"))),
        }
    }
}

/// Tuning shared by both accountants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccountingOptions {
    /// RDP orders; the default list is [`rdp::default_orders`].
    pub orders: Vec<f64>,
    /// RDP → (ε, δ) conversion.
    pub conversion: Conversion,
    /// PLD grid spacing of privacy-loss values.
    pub pld_interval: f64,
}

impl Default for AccountingOptions {
    fn default() -> Self {
        Self { orders: rdp::default_orders(), conversion: Conversion::Improved, pld_interval: pld::DEFAULT_INTERVAL }
    }
}

/// The cost of a set of mechanisms under one accountant, as charged to the ledger.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrivacyCost {
    pub accountant: Accountant,
    pub epsilon: f64,
    pub delta: f64,
    /// Optimal RDP order (RDP only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<f64>,
    /// The full RDP curve (RDP only), for the record; the ledger composes mechanisms, not costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdp: Option<RdpCurve>,
}

/// Composes `mechanisms` and reports ε at `delta`.
pub fn account(
    mechanisms: &[Mechanism],
    accountant: Accountant,
    delta: f64,
    options: &AccountingOptions,
) -> Result<PrivacyCost, PrivacyError> {
    if !(0.0..1.0).contains(&delta) {
        return Err(PrivacyError::InvalidParameter(format!("delta must be in [0, 1), got {delta}")));
    }
    let stated = delta;
    let delta = delta_left(mechanisms.iter().map(Mechanism::added_delta).sum(), delta)?;
    match accountant {
        Accountant::Rdp => {
            let curve = rdp_curve(mechanisms, &options.orders)?;
            let e = curve.epsilon(delta, options.conversion)?;
            Ok(PrivacyCost {
                accountant,
                epsilon: e.epsilon,
                delta: stated,
                order: e.order.is_finite().then_some(e.order),
                rdp: Some(curve),
            })
        }
        Accountant::Pld => {
            let mut composition = PldComposition::new(options.pld_interval);
            for m in mechanisms {
                m.compose_into(&mut composition)?;
            }
            Ok(PrivacyCost { accountant, epsilon: composition.epsilon(delta)?, delta: stated, order: None, rdp: None })
        }
    }
}

/// The δ left for the accountants' analysis once mechanisms that add δ outright
/// (`added`, e.g. partition selection's threshold) have taken theirs from `delta`.
pub fn delta_left(added: f64, delta: f64) -> Result<f64, PrivacyError> {
    if added == 0.0 {
        return Ok(delta);
    }
    if added >= delta {
        return Err(PrivacyError::Unreachable(format!(
            "the mechanisms add δ = {added} outright, no less than the δ = {delta} of the guarantee"
        )));
    }
    Ok(delta - added)
}

/// The largest ρ whose zCDP guarantee meets (ε, δ) under RDP: the budget in the units in
/// which Gaussian releases add up (each costs 1/(2σ²)).
pub fn zcdp_budget(epsilon: f64, delta: f64, options: &AccountingOptions) -> Result<f64, PrivacyError> {
    let sigma = calibrate_sigma(epsilon, delta, Accountant::Rdp, options, |s| {
        vec![Mechanism::Zcdp { rho: 1.0 / (2.0 * s * s), adjacency: Adjacency::AddRemove }]
    })?;
    Ok(1.0 / (2.0 * sigma * sigma))
}

/// The composed RDP curve of `mechanisms`.
pub fn rdp_curve(mechanisms: &[Mechanism], orders: &[f64]) -> Result<RdpCurve, PrivacyError> {
    mechanisms.iter().try_fold(RdpCurve::zero(orders), |acc, m| acc.compose(&m.rdp(orders)?))
}

/// Smallest noise multiplier σ for which `family(σ)` meets (ε, δ), by bisection on ln σ
/// to relative precision 1e-6. ε must be non-increasing in σ (true of every mechanism
/// here). The returned σ always meets the target.
pub fn calibrate_sigma(
    target_epsilon: f64,
    delta: f64,
    accountant: Accountant,
    options: &AccountingOptions,
    family: impl Fn(f64) -> Vec<Mechanism>,
) -> Result<f64, PrivacyError> {
    if !(target_epsilon > 0.0) {
        return Err(PrivacyError::InvalidParameter(format!("target epsilon must be > 0, got {target_epsilon}")));
    }
    let eps = |sigma: f64| account(&family(sigma), accountant, delta, options).map(|c| c.epsilon);
    const MIN_SIGMA: f64 = 1e-3;
    const MAX_SIGMA: f64 = 1e6;
    let (mut lo, mut hi) = (0.5, 1.0);
    while eps(hi)? > target_epsilon {
        lo = hi;
        hi *= 2.0;
        if hi > MAX_SIGMA {
            return Err(PrivacyError::Unreachable(format!(
                "no noise multiplier up to {MAX_SIGMA} reaches epsilon {target_epsilon} at delta {delta}"
            )));
        }
    }
    while eps(lo)? <= target_epsilon {
        hi = lo;
        lo /= 2.0;
        if lo < MIN_SIGMA {
            return Ok(hi);
        }
    }
    while (hi - lo) > 1e-6 * hi {
        let mid = (lo * hi).sqrt();
        if eps(mid)? > target_epsilon { lo = mid } else { hi = mid }
    }
    Ok(hi)
}
