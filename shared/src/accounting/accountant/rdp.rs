//! Rényi-DP accountant: RDP curves of the mechanisms rhosynth uses, composition by
//! adding curves, and conversion to (ε, δ).
//!
//! The subsampled-Gaussian computation follows Mironov, Talwar & Zhang (2019),
//! "Rényi Differential Privacy of the Sampled Gaussian Mechanism": the exact binomial
//! expansion at integer orders and the two-sided series at fractional orders, both in
//! log space. Where the fractional series does not converge the order is reported as
//! `+∞`, i.e. dropped: that is always sound, since conversion takes a minimum over orders.

use serde::{Deserialize, Serialize};

use super::super::math::{log_add, log_binom, log_erfc};
use crate::accounting::PrivacyError;

/// Default RDP orders: 1.1, 1.2, …, 11.0, then 12 … 63, then 128, 256, 512, 1024.
///
/// Fine fractional orders matter for large ε and long runs; the large orders for tiny ε.
pub fn default_orders() -> Vec<f64> {
    let fine = (11..=110).map(|i| f64::from(i) / 10.0);
    let integers = (12..=63).map(f64::from);
    let large = [128.0, 256.0, 512.0, 1024.0];
    fine.chain(integers).chain(large).collect()
}

/// How an RDP curve becomes an (ε, δ) guarantee.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conversion {
    /// `ε = min_α r(α) + ln(1 − 1/α) − ln(δ α)/(α − 1)` (Balle et al. 2020, Prop. 12;
    /// Asoodeh et al. 2020), with the KL bound `δ ≤ √(1 − e^{−r})` giving ε = 0 where it
    /// applies — the conversion of current accountants.
    #[default]
    Improved,
    /// `ε = min_α r(α) − ln δ/(α − 1)` (Mironov 2017, Prop. 3).
    Classic,
}

/// An RDP guarantee: `values[i]` bounds the Rényi divergence of order `orders[i]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RdpCurve {
    pub orders: Vec<f64>,
    /// `+∞` marks an order the analysis could not bound; it never wins a minimum.
    #[serde(with = "finite_or_infinite")]
    pub values: Vec<f64>,
}

/// (ε, δ) obtained from an RDP curve, with the order that achieved it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RdpEpsilon {
    pub epsilon: f64,
    pub delta: f64,
    pub order: f64,
}

impl RdpCurve {
    /// The curve of a mechanism that releases nothing.
    pub fn zero(orders: &[f64]) -> Self {
        Self { orders: orders.to_vec(), values: vec![0.0; orders.len()] }
    }

    /// Builds a curve by evaluating `rdp(α)` at each order.
    pub fn from_fn(orders: &[f64], rdp: impl Fn(f64) -> f64) -> Self {
        Self { orders: orders.to_vec(), values: orders.iter().map(|&a| rdp(a)).collect() }
    }

    /// The curve of `count` independent runs: RDP composes additively.
    pub fn times(&self, count: u64) -> Self {
        let count = count as f64;
        Self {
            orders: self.orders.clone(),
            values: self.values.iter().map(|v| if *v == 0.0 { 0.0 } else { v * count }).collect(),
        }
    }

    /// Composition with another curve on the same orders.
    pub fn compose(&self, other: &RdpCurve) -> Result<Self, PrivacyError> {
        if self.orders != other.orders {
            return Err(PrivacyError::InvalidParameter("RDP curves on different orders cannot be composed".into()));
        }
        let values = self.values.iter().zip(&other.values).map(|(a, b)| a + b).collect();
        Ok(Self { orders: self.orders.clone(), values })
    }

    /// Smallest ε such that the curve implies (ε, δ)-DP.
    pub fn epsilon(&self, delta: f64, conversion: Conversion) -> Result<RdpEpsilon, PrivacyError> {
        if !(0.0..1.0).contains(&delta) {
            return Err(PrivacyError::InvalidParameter(format!("delta must be in [0, 1), got {delta}")));
        }
        if delta == 0.0 {
            let all_zero = self.values.iter().all(|v| *v == 0.0);
            let epsilon = if all_zero { 0.0 } else { f64::INFINITY };
            return Ok(RdpEpsilon { epsilon, delta, order: f64::INFINITY });
        }
        let mut best = RdpEpsilon { epsilon: f64::INFINITY, delta, order: f64::NAN };
        for (&a, &r) in self.orders.iter().zip(&self.values) {
            if a <= 1.0 || r.is_nan() || r < 0.0 {
                return Err(PrivacyError::InvalidParameter(format!("invalid RDP value {r} at order {a}")));
            }
            let eps = match conversion {
                Conversion::Improved => {
                    if delta * delta + (-r).exp_m1() > 0.0 {
                        0.0
                    } else if a > 1.01 {
                        r + (-1.0 / a).ln_1p() - (delta * a).ln() / (a - 1.0)
                    } else {
                        f64::INFINITY
                    }
                }
                Conversion::Classic => r - delta.ln() / (a - 1.0),
            };
            if eps < best.epsilon {
                best.epsilon = eps;
                best.order = a;
            }
        }
        best.epsilon = best.epsilon.max(0.0);
        Ok(best)
    }
}

/// RDP of one step of the Poisson-subsampled Gaussian mechanism at order `alpha`:
/// each unit is included with probability `q`, the sum of contributions (L2 norm ≤ 1
/// after scaling) gets N(0, σ²) noise. Add/remove-one adjacency.
pub fn poisson_subsampled_gaussian(q: f64, sigma: f64, alpha: f64) -> f64 {
    if sigma == 0.0 || alpha.is_infinite() {
        return f64::INFINITY;
    }
    if q == 0.0 {
        return 0.0;
    }
    if q == 1.0 {
        return alpha / (2.0 * sigma * sigma);
    }
    let log_a = if alpha.fract() == 0.0 {
        Some(log_a_integer(q, sigma, alpha as u64))
    } else {
        log_a_fractional(q, sigma, alpha)
    };
    match log_a {
        Some(log_a) => (log_a / (alpha - 1.0)).max(0.0),
        None => f64::INFINITY,
    }
}

/// `ln A_α = ln Σ_i C(α,i) q^i (1−q)^{α−i} e^{(i²−i)/(2σ²)}` for integer α.
fn log_a_integer(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (ln_q, ln_1mq) = (q.ln(), (-q).ln_1p());
    let a = alpha as f64;
    (0..=alpha).fold(f64::NEG_INFINITY, |acc, i| {
        let i = i as f64;
        let term = log_binom(a, i) + i * ln_q + (a - i) * ln_1mq + (i * i - i) / (2.0 * sigma * sigma);
        log_add(acc, term)
    })
}

/// Fractional α: split the integral at z₀, where the two mixture densities cross, and
/// expand each half as a binomial series. The series alternates in sign; summing the
/// *absolute values* of its terms bounds A_α from above and cannot cancel
/// catastrophically (a signed sum can, and could then under-report the cost). This is the
/// computation of dp_accounting ≥ 0.4 (Mironov, Talwar & Zhang 2019, Sec. 3.3); it is
/// slightly looser than the exact A_α at small orders and never below it.
fn log_a_fractional(q: f64, sigma: f64, alpha: f64) -> Option<f64> {
    const MAX_TERMS: usize = 1000;
    let (ln_q, ln_1mq) = (q.ln(), (-q).ln_1p());
    let var = sigma * sigma;
    let z0 = var * (1.0 / q - 1.0).ln() + 0.5;
    let scale = std::f64::consts::SQRT_2 * sigma;
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let (mut last_s0, mut last_s1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for step in 0..MAX_TERMS {
        let i = step as f64;
        let j = alpha - i;
        // ln |C(α, i)| (log-gamma takes absolute values).
        let log_coef = log_binom(alpha, i);
        let log_t0 = log_coef + i * ln_q + j * ln_1mq;
        let log_t1 = log_coef + j * ln_q + i * ln_1mq;
        let log_e0 = 0.5_f64.ln() + log_erfc((i - z0) / scale);
        let log_e1 = 0.5_f64.ln() + log_erfc((z0 - j) / scale);
        let log_s0 = log_t0 + (i * i - i) / (2.0 * var) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * var) + log_e1;
        log_a0 = log_add(log_a0, log_s0);
        log_a1 = log_add(log_a1, log_s1);
        let total = log_add(log_a0, log_a1);
        // Stop once both halves' terms are decreasing and negligible against the total.
        if log_s0 < last_s0 && log_s1 < last_s1 && log_s0.max(log_s1) < total - 30.0 {
            return Some(total);
        }
        (last_s0, last_s1) = (log_s0, log_s1);
    }
    tracing::warn!(q, sigma, alpha, "RDP series did not converge; order dropped");
    None
}

/// RDP of the Gaussian mechanism with noise multiplier `sigma` (std / L2 sensitivity).
pub fn gaussian(sigma: f64, alpha: f64) -> f64 {
    alpha / (2.0 * sigma * sigma)
}

/// RDP of randomized response with parameter ε (P = (p, 1−p), Q = (1−p, p),
/// p = e^ε/(1+e^ε)): every ε-DP mechanism is a post-processing of it (Kairouz, Oh &
/// Viswanath 2015), so this bounds the RDP of any ε-DP mechanism at every order.
pub fn randomized_response(epsilon: f64, alpha: f64) -> f64 {
    let (ln_p, ln_q) = (-(-epsilon).exp().ln_1p(), -epsilon.exp().ln_1p());
    if alpha.is_infinite() {
        return epsilon;
    }
    let terms = log_add(alpha * ln_p + (1.0 - alpha) * ln_q, alpha * ln_q + (1.0 - alpha) * ln_p);
    (terms / (alpha - 1.0)).min(epsilon)
}

/// JSON has no infinity: unbounded orders are stored as `null`.
mod finite_or_infinite {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(values: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let v: Vec<Option<f64>> = values.iter().map(|v| v.is_finite().then_some(*v)).collect();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        let v: Vec<Option<f64>> = Vec::deserialize(d)?;
        Ok(v.into_iter().map(|v| v.unwrap_or(f64::INFINITY)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_orders_match_the_reference_list() {
        let orders = default_orders();
        assert_eq!(orders.len(), 156);
        assert_eq!(orders[0], 1.1);
        assert_eq!(orders[99], 11.0);
        assert_eq!(orders[100], 12.0);
        assert_eq!(*orders.last().unwrap(), 1024.0);
    }

    #[test]
    fn full_batch_is_the_gaussian() {
        for a in [1.5, 2.0, 32.0] {
            assert_eq!(poisson_subsampled_gaussian(1.0, 2.0, a), gaussian(2.0, a));
        }
    }
}
