//! Privacy-loss-distribution (PLD) accountant.
//!
//! A mechanism is described by its hockey-stick divergence δ(ε) for each direction of
//! add/remove adjacency. Each one-step curve is discretised on the grid `h·ℤ` with the
//! pessimistic "connect the dots" construction (Doroshenko, Ghazi, Kamath, Kumar &
//! Manurangsi 2022, Algorithm 1): the discrete PLD's δ(ε) interpolates the true curve
//! linearly in e^ε between grid points and lies above it, so every ε reported is an upper
//! bound. Composition is convolution, done with the FFT; tails cut to keep the arrays
//! finite are moved to +∞ (pessimistic). The reported ε is the larger of the two
//! directions.

use std::sync::Arc;

use rustfft::FftPlanner;
use rustfft::num_complex::Complex64;

use super::super::math::{log_add, normal_cdf, normal_sf};
use crate::accounting::PrivacyError;

/// Default grid spacing of privacy-loss values.
pub const DEFAULT_INTERVAL: f64 = 1e-4;

/// Probability mass moved to +∞ when composed tails are cut (per composition).
const TAIL_TRUNCATION: f64 = 1e-15;

/// Standard-normal quantile beyond which one step's tails are folded into the end points
/// (P[Z > 10] ≈ 7.6e-24).
const TAIL_Z: f64 = 10.0;

/// One direction of a mechanism's privacy loss: its hockey-stick divergence and the range
/// of losses that carries all but a negligible mass.
pub trait HockeyStick {
    /// δ(ε) = sup_S P(S) − e^ε Q(S).
    fn delta(&self, epsilon: f64) -> f64;
    /// Losses outside this range have negligible probability under P.
    fn loss_range(&self) -> (f64, f64);
}

/// The Poisson-subsampled Gaussian with noise multiplier `sigma` and rate `q`, for the
/// "remove" direction (P: the unit is present, a mixture; Q: it is absent) or the "add"
/// direction (the reverse). With `q = 1` both are the plain Gaussian mechanism.
#[derive(Clone, Copy, Debug)]
pub struct SubsampledGaussian {
    pub q: f64,
    pub sigma: f64,
    pub remove: bool,
}

impl SubsampledGaussian {
    /// Privacy loss ln(P/Q) at output x (unit mean shift 1).
    fn loss(&self, x: f64) -> f64 {
        let s2 = self.sigma * self.sigma;
        let mix = log_add((-self.q).ln_1p(), self.q.ln() + (2.0 * x - 1.0) / (2.0 * s2));
        if self.remove { mix } else { -mix }
    }
}

impl HockeyStick for SubsampledGaussian {
    fn delta(&self, eps: f64) -> f64 {
        let (q, s) = (self.q, self.sigma);
        let s2 = s * s;
        let d = if self.remove {
            // Loss > ε ⟺ x > x_ε, where (1−q) + q·e^{(2x−1)/(2σ²)} = e^ε.
            let excess = eps.exp() - (1.0 - q);
            if excess <= 0.0 {
                return 1.0 - eps.exp();
            }
            let x = s2 * (excess / q).ln() + 0.5;
            (1.0 - q) * normal_sf(x / s) + q * normal_sf((x - 1.0) / s) - eps.exp() * normal_sf(x / s)
        } else {
            // Loss > ε ⟺ x < x_ε, where (1−q) + q·e^{(2x−1)/(2σ²)} = e^{−ε}.
            let excess = (-eps).exp() - (1.0 - q);
            if excess <= 0.0 {
                return 0.0;
            }
            let x = s2 * (excess / q).ln() + 0.5;
            normal_cdf(x / s) - eps.exp() * ((1.0 - q) * normal_cdf(x / s) + q * normal_cdf((x - 1.0) / s))
        };
        d.clamp(0.0, 1.0)
    }

    fn loss_range(&self) -> (f64, f64) {
        let (lo_x, hi_x) = if self.remove {
            // P's mass lies in [−zσ, 1 + zσ].
            (-TAIL_Z * self.sigma, 1.0 + TAIL_Z * self.sigma)
        } else {
            (-TAIL_Z * self.sigma, TAIL_Z * self.sigma)
        };
        let (a, b) = (self.loss(lo_x), self.loss(hi_x));
        (a.min(b), a.max(b))
    }
}

/// Randomized response with parameter ε: P = (p, 1−p), Q = (1−p, p), p = e^ε/(1+e^ε).
/// It dominates every ε-DP mechanism in both directions (Kairouz, Oh & Viswanath 2015),
/// so its PLD is a sound, if not tight, one for any of them.
#[derive(Clone, Copy, Debug)]
pub struct RandomizedResponse {
    pub epsilon: f64,
}

impl HockeyStick for RandomizedResponse {
    fn delta(&self, eps: f64) -> f64 {
        let p = 1.0 / (1.0 + (-self.epsilon).exp());
        let q = 1.0 - p;
        ((p - eps.exp() * q).max(0.0) + (q - eps.exp() * p).max(0.0)).clamp(0.0, 1.0)
    }

    fn loss_range(&self) -> (f64, f64) {
        (-self.epsilon, self.epsilon)
    }
}

/// A discrete privacy-loss distribution on the grid `interval·(lower + i)`, plus mass at +∞.
#[derive(Clone, Debug)]
pub struct Pmf {
    pub interval: f64,
    pub lower: i64,
    pub probs: Vec<f64>,
    pub infinity_mass: f64,
}

impl Pmf {
    /// The distribution of a mechanism that reveals nothing.
    pub fn identity(interval: f64) -> Self {
        Self { interval, lower: 0, probs: vec![1.0], infinity_mass: 0.0 }
    }

    /// Pessimistic connect-the-dots discretisation of one mechanism direction.
    pub fn connect_the_dots(mechanism: &dyn HockeyStick, interval: f64) -> Result<Self, PrivacyError> {
        if !(interval > 0.0) {
            return Err(PrivacyError::InvalidParameter(format!("PLD interval must be > 0, got {interval}")));
        }
        let (lo, hi) = mechanism.loss_range();
        let lower = (lo / interval).floor() as i64;
        let upper = (hi / interval).ceil() as i64;
        let n = usize::try_from(upper - lower + 1).unwrap_or(0);
        if n > 50_000_000 {
            return Err(PrivacyError::InvalidParameter(format!(
                "PLD grid of {n} points is too large: raise the discretisation interval"
            )));
        }
        let deltas: Vec<f64> = (0..n).map(|i| mechanism.delta((lower + i as i64) as f64 * interval)).collect();
        if n == 1 {
            return Ok(Self { interval, lower, probs: vec![1.0 - deltas[0]], infinity_mass: deltas[0] });
        }
        let (em1, e) = (interval.exp_m1(), interval.exp());
        let mut probs = vec![0.0; n];
        probs[0] = 1.0 - deltas[0] + (deltas[1] - deltas[0]) / em1;
        for i in 1..n - 1 {
            probs[i] = ((deltas[i + 1] - deltas[i]) - e * (deltas[i] - deltas[i - 1])) / em1;
        }
        probs[n - 1] = (deltas[n - 1] - deltas[n - 2]) / (-interval).exp_m1();
        for p in &mut probs {
            *p = p.max(0.0);
        }
        Ok(Self { interval, lower, probs, infinity_mass: deltas[n - 1] }.trimmed())
    }

    /// Drops exact zeros at both ends (they carry no information).
    fn trimmed(mut self) -> Self {
        let first = self.probs.iter().position(|p| *p > 0.0).unwrap_or(0);
        let last = self.probs.iter().rposition(|p| *p > 0.0).unwrap_or(0);
        self.probs = self.probs[first..=last.max(first)].to_vec();
        self.lower += first as i64;
        self
    }

    fn loss(&self, i: usize) -> f64 {
        (self.lower + i as i64) as f64 * self.interval
    }

    /// `ln E[e^{λL}]` over the finite part.
    fn log_mgf(&self, lambda: f64) -> f64 {
        self.probs
            .iter()
            .enumerate()
            .filter(|(_, p)| **p > 0.0)
            .fold(f64::NEG_INFINITY, |acc, (i, p)| log_add(acc, p.ln() + lambda * self.loss(i)))
    }

    /// Grid-index window `[lo, hi]` (relative to `count·lower`) holding all but
    /// `TAIL_TRUNCATION` of the mass of the `count`-fold composition (Chernoff bounds).
    fn composition_window(&self, count: u64) -> (i64, i64) {
        let n = self.probs.len() as i64;
        let full = (0, (n - 1) * count as i64);
        let t = count as f64;
        let log_tail = (TAIL_TRUNCATION / 2.0).ln();
        let (mut hi_loss, mut lo_loss) = (f64::INFINITY, f64::NEG_INFINITY);
        for k in -40_i32..=40 {
            if k == 0 {
                continue;
            }
            let lambda = 10f64.powf(k.abs() as f64 / 10.0 - 1.0) * f64::from(k.signum());
            let bound = (t * self.log_mgf(lambda) - log_tail) / lambda;
            if lambda > 0.0 {
                hi_loss = hi_loss.min(bound);
            } else {
                lo_loss = lo_loss.max(bound);
            }
        }
        let base = self.lower as f64 * t;
        let hi = ((hi_loss / self.interval - base).ceil() as i64).clamp(full.0, full.1);
        let lo = ((lo_loss / self.interval - base).floor() as i64).clamp(full.0, hi);
        (lo, hi)
    }

    /// The PLD of `count` independent runs of this mechanism.
    pub fn self_compose(&self, count: u64) -> Self {
        if count == 1 {
            return self.clone();
        }
        let (lo, hi) = self.composition_window(count);
        let window = (hi - lo + 1) as usize;
        let size = window.max(self.probs.len()).next_power_of_two();
        let mut planner = FftPlanner::new();
        let forward = planner.plan_fft_forward(size);
        let inverse = planner.plan_fft_inverse(size);
        let mut buf: Vec<Complex64> =
            (0..size).map(|i| Complex64::new(self.probs.get(i).copied().unwrap_or(0.0), 0.0)).collect();
        forward.process(&mut buf);
        let t = count as f64;
        for z in &mut buf {
            let (r, theta) = z.to_polar();
            *z = if r == 0.0 { Complex64::new(0.0, 0.0) } else { Complex64::from_polar((t * r.ln()).exp(), t * theta) };
        }
        inverse.process(&mut buf);
        let scale = 1.0 / size as f64;
        let probs: Vec<f64> =
            (lo..=hi).map(|k| (buf[k.rem_euclid(size as i64) as usize].re * scale).max(0.0)).collect();
        let infinity_mass = TAIL_TRUNCATION - (t * (-self.infinity_mass).ln_1p()).exp_m1();
        Self { interval: self.interval, lower: self.lower * count as i64 + lo, probs, infinity_mass }
    }

    /// The PLD of running this mechanism and then `other` (independent noise).
    pub fn compose(&self, other: &Pmf) -> Result<Self, PrivacyError> {
        if self.interval != other.interval {
            return Err(PrivacyError::InvalidParameter("PLDs with different intervals cannot be composed".into()));
        }
        let len = self.probs.len() + other.probs.len() - 1;
        let size = len.next_power_of_two();
        let mut planner = FftPlanner::new();
        let forward = planner.plan_fft_forward(size);
        let inverse = planner.plan_fft_inverse(size);
        let spectrum = |p: &[f64], fft: &Arc<dyn rustfft::Fft<f64>>| {
            let mut b: Vec<Complex64> =
                (0..size).map(|i| Complex64::new(p.get(i).copied().unwrap_or(0.0), 0.0)).collect();
            fft.process(&mut b);
            b
        };
        let mut a = spectrum(&self.probs, &forward);
        let b = spectrum(&other.probs, &forward);
        for (x, y) in a.iter_mut().zip(&b) {
            *x *= y;
        }
        inverse.process(&mut a);
        let scale = 1.0 / size as f64;
        let probs: Vec<f64> = a[..len].iter().map(|z| (z.re * scale).max(0.0)).collect();
        let infinity_mass = 1.0 - (1.0 - self.infinity_mass) * (1.0 - other.infinity_mass);
        Ok(Self { interval: self.interval, lower: self.lower + other.lower, probs, infinity_mass }.truncated())
    }

    /// Cuts at most `TAIL_TRUNCATION/2` from each end, the right tail going to +∞.
    fn truncated(mut self) -> Self {
        let half = TAIL_TRUNCATION / 2.0;
        let mut left = 0;
        let mut acc = 0.0;
        while left + 1 < self.probs.len() && acc + self.probs[left] <= half {
            acc += self.probs[left];
            left += 1;
        }
        let left_mass = acc;
        let mut right = self.probs.len();
        acc = 0.0;
        while right > left + 1 && acc + self.probs[right - 1] <= half {
            acc += self.probs[right - 1];
            right -= 1;
        }
        self.infinity_mass += acc;
        let mut probs = self.probs[left..right].to_vec();
        probs[0] += left_mass;
        self.probs = probs;
        self.lower += left as i64;
        self
    }

    /// δ(ε) of this distribution.
    pub fn delta(&self, epsilon: f64) -> f64 {
        let mut delta = self.infinity_mass;
        for (i, p) in self.probs.iter().enumerate().rev() {
            let l = self.loss(i);
            if l <= epsilon {
                break;
            }
            delta += p * -(epsilon - l).exp_m1();
        }
        delta
    }

    /// Smallest ε ≥ 0 with δ(ε) ≤ `delta`; `+∞` if the mass at +∞ alone exceeds it.
    pub fn epsilon(&self, delta: f64) -> f64 {
        if self.infinity_mass > delta {
            return f64::INFINITY;
        }
        // Scan losses from the top, keeping Σp and Σp·e^{−l} over losses above the cursor;
        // on [l_{i−1}, l_i) the curve is δ(ε) = upper − e^ε·lower.
        let (mut upper, mut lower) = (self.infinity_mass, 0.0);
        for (i, p) in self.probs.iter().enumerate().rev() {
            let l = self.loss(i);
            if upper > delta && lower > 0.0 && ((upper - delta) / lower).ln() >= l {
                break;
            }
            upper += p;
            lower += p * (-l).exp();
            if upper >= delta && lower == 0.0 {
                return l.max(0.0);
            }
        }
        if upper <= lower + delta { 0.0 } else { ((upper - delta) / lower).ln().max(0.0) }
    }
}

/// A mechanism's PLD for both directions of add/remove adjacency.
#[derive(Clone, Debug)]
pub struct Pld {
    pub remove: Pmf,
    pub add: Pmf,
}

impl Pld {
    pub fn identity(interval: f64) -> Self {
        Self { remove: Pmf::identity(interval), add: Pmf::identity(interval) }
    }

    /// Discretises a mechanism given by its two directions.
    pub fn from_directions(
        remove: &dyn HockeyStick,
        add: &dyn HockeyStick,
        interval: f64,
    ) -> Result<Self, PrivacyError> {
        Ok(Self { remove: Pmf::connect_the_dots(remove, interval)?, add: Pmf::connect_the_dots(add, interval)? })
    }

    pub fn self_compose(&self, count: u64) -> Self {
        Self { remove: self.remove.self_compose(count), add: self.add.self_compose(count) }
    }

    pub fn compose(&self, other: &Pld) -> Result<Self, PrivacyError> {
        Ok(Self { remove: self.remove.compose(&other.remove)?, add: self.add.compose(&other.add)? })
    }

    pub fn epsilon(&self, delta: f64) -> f64 {
        self.remove.epsilon(delta).max(self.add.epsilon(delta))
    }

    pub fn delta(&self, epsilon: f64) -> f64 {
        self.remove.delta(epsilon).max(self.add.delta(epsilon))
    }
}

/// Exact (ε, δ) of the Gaussian mechanism with noise multiplier `sigma`, composed `count`
/// times (μ-GDP with μ = √count/σ; Balle & Wang 2018): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
pub fn gaussian_delta(mu: f64, epsilon: f64) -> f64 {
    (normal_cdf(-epsilon / mu + mu / 2.0) - epsilon.exp() * normal_cdf(-epsilon / mu - mu / 2.0)).max(0.0)
}

/// Smallest ε with `gaussian_delta(mu, ε) ≤ delta` (bisection; δ(ε) is decreasing).
pub fn gaussian_epsilon(mu: f64, delta: f64) -> f64 {
    if gaussian_delta(mu, 0.0) <= delta {
        return 0.0;
    }
    let mut hi = 1.0;
    while gaussian_delta(mu, hi) > delta {
        hi *= 2.0;
        if hi > 1e6 {
            return f64::INFINITY;
        }
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if gaussian_delta(mu, mid) > delta {
            lo = mid
        } else {
            hi = mid
        }
        if hi - lo <= 1e-12 * hi {
            break;
        }
    }
    hi
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discretised_gaussian_upper_bounds_the_exact_curve() {
        let sigma = 2.0;
        let g = SubsampledGaussian { q: 1.0, sigma, remove: true };
        let pmf = Pmf::connect_the_dots(&g, 1e-3).unwrap();
        let total: f64 = pmf.probs.iter().sum::<f64>() + pmf.infinity_mass;
        assert!((total - 1.0).abs() < 1e-9, "mass {total}");
        for eps in [0.1, 0.5, 1.0, 2.0] {
            let exact = gaussian_delta(1.0 / sigma, eps);
            let d = pmf.delta(eps);
            assert!(d >= exact * (1.0 - 1e-9) && d <= exact * 1.01 + 1e-12, "eps {eps}: {d} vs {exact}");
        }
    }

    #[test]
    fn composed_gaussian_matches_gdp() {
        let (sigma, t) = (4.0, 64);
        let g = SubsampledGaussian { q: 1.0, sigma, remove: true };
        let pld = Pld::from_directions(&g, &SubsampledGaussian { remove: false, ..g }, 1e-4).unwrap();
        let eps = pld.self_compose(t).epsilon(1e-5);
        let exact = gaussian_epsilon((t as f64).sqrt() / sigma, 1e-5);
        assert!(eps >= exact - 1e-9 && eps - exact < 2e-3, "{eps} vs {exact}");
    }
}
