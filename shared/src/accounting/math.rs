//! Log-space arithmetic and normal-distribution tails shared by the accountants.
//!
//! Accountants work with quantities from 1e-300 to 1e300, so everything that can
//! underflow is kept as a logarithm. The tails of the normal distribution are computed
//! without cancellation (through `erfc`, and an asymptotic series where `erfc` underflows).

use std::f64::consts::{LN_2, PI, SQRT_2};

/// `ln(e^a + e^b)`, exact for infinite arguments.
pub fn log_add(a: f64, b: f64) -> f64 {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    (lo - hi).exp().ln_1p() + hi
}

/// `ln(1 − e^x)` for `x ≤ 0`, accurate near both ends.
pub fn log1mexp(x: f64) -> f64 {
    if x > -LN_2 { (-x.exp_m1()).ln() } else { (-x.exp()).ln_1p() }
}

/// `ln erfc(x)`, accurate for large positive `x` where `erfc` underflows.
pub fn log_erfc(x: f64) -> f64 {
    if x < 20.0 {
        return libm::erfc(x).ln();
    }
    // Asymptotic expansion erfc(x) = e^{-x²}/(x√π) · Σ_k (−1)^k (2k−1)!!/(2x²)^k.
    // At x ≥ 20 the terms fall by a factor ≥ 800 each, so 8 terms are exact in f64.
    let inv = 1.0 / (2.0 * x * x);
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..8 {
        term *= -((2 * k - 1) as f64) * inv;
        sum += term;
    }
    -x * x - x.ln() - 0.5 * PI.ln() + sum.ln()
}

/// Upper tail of the standard normal, `P[Z > z]`.
pub fn normal_sf(z: f64) -> f64 {
    0.5 * libm::erfc(z / SQRT_2)
}

/// `ln P[Z > z]` for the standard normal, finite far into the tail.
pub fn log_normal_sf(z: f64) -> f64 {
    -LN_2 + log_erfc(z / SQRT_2)
}

/// Standard normal CDF, `P[Z ≤ z]`.
pub fn normal_cdf(z: f64) -> f64 {
    normal_sf(-z)
}

/// The z with `P[Z > z] = p` (0 < p < 1), by bisection on ln P[Z > z] (finite far into
/// the tail, where P itself underflows); the upper end, so P[Z > z] ≤ p.
pub fn normal_isf(p: f64) -> f64 {
    let target = p.ln();
    let (mut lo, mut hi) = (-40.0, 1e3);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if log_normal_sf(mid) > target { lo = mid } else { hi = mid }
    }
    hi
}

/// `ln C(n, k)` for real `n ≥ k ≥ 0`, via log-gamma.
pub fn log_binom(n: f64, k: f64) -> f64 {
    libm::lgamma(n + 1.0) - libm::lgamma(k + 1.0) - libm::lgamma(n - k + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_add_adds() {
        let (a, b) = (3.0_f64.ln(), 2.0_f64.ln());
        assert!((log_add(a, b) - 5.0_f64.ln()).abs() < 1e-15);
        assert_eq!(log_add(f64::NEG_INFINITY, a), a);
    }

    #[test]
    fn log_erfc_is_continuous_at_the_switch() {
        let below = libm::erfc(19.999_999).ln();
        let above = log_erfc(20.0);
        assert!((below - above).abs() < 1e-4, "{below} vs {above}");
        // ln erfc(30) from mpmath.
        assert!((log_erfc(30.0) + 903.974_117_110_644).abs() < 1e-9);
    }

    #[test]
    fn normal_tails() {
        assert!((normal_cdf(1.96) - 0.975_002_104_851_780).abs() < 1e-12);
        assert!((log_normal_sf(40.0) - (-804.608_442_013_754)).abs() < 1e-6);
        // The inverse, also where erfc(z/√2) underflows to 0 (z > 38.5).
        assert!((normal_isf(0.025) - 1.959_963_984_540_054).abs() < 1e-9);
        let deep = normal_isf(1e-320);
        assert!(deep > 38.0 && (log_normal_sf(deep) - 1e-320f64.ln()).abs() < 1e-6, "{deep}");
    }

    #[test]
    fn binomials() {
        assert!((log_binom(10.0, 3.0) - 120.0_f64.ln()).abs() < 1e-12);
        assert!((log1mexp(-1e-20) - (1e-20_f64).ln()).abs() < 1e-9);
    }
}
