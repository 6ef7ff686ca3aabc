//! The ε lower bound of a one-run audit (Steinke, Nasr & Jagielski 2023, "Privacy auditing
//! with one (1) training run", Theorem 3.1 with its δ term, as their Algorithm 2 and
//! `jax_privacy.auditing` compute it).
//!
//! m canaries are each included independently with probability ½; an auditor guesses
//! inclusion for r of them and is right v times. Under (ε, δ)-DP the number of right
//! guesses is at most Binomial(r, e^ε/(1 + e^ε)) plus a δ-dependent slack, so
//! p(ε) = P[Binomial(r, q) ≥ v] + 2mδ·max_{1≤i≤v} P[v − i ≤ Binomial(r, q) < v] / i
//! (q = e^ε/(1 + e^ε)) is a p-value for "the mechanism is (ε, δ)-DP". The lower bound is
//! the largest ε that the counts reject at the chosen significance; p grows with ε.

use crate::accounting::math::log_binom;

/// `ln P[Binomial(r, q) = k]` for every k in 0..=r, with q = e^ε/(1 + e^ε).
fn log_pmf(r: u64, epsilon: f64) -> Vec<f64> {
    // ln q = −ln(1 + e^−ε), ln(1 − q) = −ln(1 + e^ε), both without cancellation.
    let softplus = |x: f64| if x > 0.0 { x + (-x).exp().ln_1p() } else { x.exp().ln_1p() };
    let (ln_q, ln_not_q) = (-softplus(-epsilon), -softplus(epsilon));
    (0..=r).map(|k| log_binom(r as f64, k as f64) + k as f64 * ln_q + (r - k) as f64 * ln_not_q).collect()
}

/// The p-value of `correct` right guesses out of `guesses` among `canaries` under the
/// hypothesis that the mechanism is (ε, δ)-DP.
pub fn p_value(canaries: u64, guesses: u64, correct: u64, epsilon: f64, delta: f64) -> f64 {
    assert!(correct <= guesses && guesses <= canaries, "need correct ≤ guesses ≤ canaries");
    let pmf: Vec<f64> = log_pmf(guesses, epsilon).into_iter().map(f64::exp).collect();
    let beta: f64 = pmf[correct as usize..].iter().sum();
    if delta == 0.0 {
        return beta.min(1.0);
    }
    // α = max over i of P[v − i ≤ X < v] / i, the sum grown one term at a time.
    let (mut below, mut alpha) = (0.0, 0.0_f64);
    for i in 1..=correct {
        below += pmf[(correct - i) as usize];
        alpha = alpha.max(below / i as f64);
    }
    (beta + alpha * delta * 2.0 * canaries as f64).min(1.0)
}

/// The largest ε that `correct` right guesses out of `guesses` among `canaries` reject at
/// `significance` (0.05: 95% confidence) for (ε, δ)-DP; 0 when none is rejected. Bisection
/// to 1e-9 on a bracket doubled until it holds.
pub fn epsilon_lower_bound(canaries: u64, guesses: u64, correct: u64, delta: f64, significance: f64) -> f64 {
    let rejects = |epsilon: f64| p_value(canaries, guesses, correct, epsilon, delta) < significance;
    if guesses == 0 || !rejects(0.0) {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0, 1.0);
    while rejects(hi) {
        (lo, hi) = (hi, 2.0 * hi);
        if hi > 1e3 {
            // All right guesses with δ = 0 reject every ε below ln(q*/(1 − q*)), finite
            // for r ≥ 1; beyond this the counts say nothing more.
            return lo;
        }
    }
    while hi - lo > 1e-9 {
        let mid = 0.5 * (lo + hi);
        if rejects(mid) { lo = mid } else { hi = mid }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `jax_privacy.auditing._epsilon_one_run` (jax-privacy 2.0.0, the paper's Algorithm 2)
    /// on the same counts: `bench/audit_reference/one_run.py` writes these.
    const REFERENCE: &str = include_str!("one_run_vectors.json");

    #[test]
    fn matches_the_public_implementation() {
        let vectors: serde_json::Value = serde_json::from_str(REFERENCE).unwrap();
        let cases = vectors["cases"].as_array().unwrap();
        assert!(cases.len() >= 20);
        for case in cases {
            let n = |k: &str| case[k].as_u64().unwrap();
            let (m, r, v) = (n("canaries"), n("guesses"), n("correct"));
            let (delta, significance) = (case["delta"].as_f64().unwrap(), case["significance"].as_f64().unwrap());
            let ours = epsilon_lower_bound(m, r, v, delta, significance);
            let theirs = case["epsilon_lower_bound"].as_f64().unwrap();
            // brentq stops at xtol 1e-6 (absolute, plus a relative term on large ε).
            assert!((ours - theirs).abs() <= 1e-5 * theirs.max(1.0), "{case}: ours {ours}");
            let p = p_value(m, r, v, 1.0, delta);
            let their_p = case["p_value_at_1"].as_f64().unwrap();
            assert!((p - their_p).abs() <= 1e-9 + 1e-9 * their_p, "{case}: ours p {p}");
        }
    }

    #[test]
    fn chance_level_guessing_bounds_nothing() {
        // Half right is what a coin does: no ε > 0 is rejected, with or without δ.
        assert_eq!(epsilon_lower_bound(1000, 200, 100, 0.0, 0.05), 0.0);
        assert_eq!(epsilon_lower_bound(1000, 0, 0, 1e-5, 0.05), 0.0);
    }

    #[test]
    fn all_right_without_delta_is_the_closed_form() {
        // p(ε) = q^r, so the bound is where q = significance^(1/r): ε = ln(q/(1 − q)).
        for r in [10u64, 50, 200] {
            let q = 0.05f64.powf(1.0 / r as f64);
            let expected = (q / (1.0 - q)).ln();
            assert!((epsilon_lower_bound(1000, r, r, 0.0, 0.05) - expected).abs() < 1e-7, "r = {r}");
        }
    }

    #[test]
    fn delta_only_weakens_the_bound() {
        for v in [150u64, 170, 190, 200] {
            let pure = epsilon_lower_bound(1000, 200, v, 0.0, 0.05);
            let approx = epsilon_lower_bound(1000, 200, v, 1e-4, 0.05);
            assert!(approx <= pure + 1e-12, "v = {v}: {approx} > {pure}");
        }
    }
}
