//! Properties every accountant must have, checked over a seeded random sample of
//! parameters (the seed only picks parameters; no privacy noise is involved):
//! ε is monotone in T and q and antitone in σ, two halves compose to the whole,
//! calibration round-trips, and the RDP computation stays finite across its range.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account, calibrate_sigma, rdp_curve};
use rhosynth_shared::accounting::mechanism::Mechanism;

fn eps(accountant: Accountant, q: f64, sigma: f64, steps: u64) -> f64 {
    account(&[Mechanism::dp_sgd(q, sigma, steps)], accountant, 1e-5, &AccountingOptions::default()).unwrap().epsilon
}

/// Log-uniform sample in [lo, hi].
fn log_uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp()
}

#[test]
fn rdp_epsilon_is_monotone() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..40 {
        let q = log_uniform(&mut rng, 1e-4, 0.5);
        let sigma = log_uniform(&mut rng, 0.5, 20.0);
        let steps = log_uniform(&mut rng, 1.0, 1e5) as u64;
        let e = eps(Accountant::Rdp, q, sigma, steps);
        assert!(eps(Accountant::Rdp, q, sigma, steps * 2) >= e, "T: q={q} σ={sigma} T={steps}");
        assert!(eps(Accountant::Rdp, (q * 1.5).min(1.0), sigma, steps) >= e, "q: q={q} σ={sigma} T={steps}");
        assert!(eps(Accountant::Rdp, q, sigma * 1.2, steps) <= e, "σ: q={q} σ={sigma} T={steps}");
    }
}

#[test]
fn pld_epsilon_is_monotone_and_below_rdp() {
    for (q, sigma, steps) in [(0.01, 1.0, 200_u64), (0.05, 2.0, 100), (0.002, 0.8, 500)] {
        let e = eps(Accountant::Pld, q, sigma, steps);
        assert!(eps(Accountant::Pld, q, sigma, steps * 2) >= e);
        assert!(eps(Accountant::Pld, q * 2.0, sigma, steps) >= e);
        assert!(eps(Accountant::Pld, q, sigma * 1.2, steps) <= e);
        // PLD is the tighter analysis of the same mechanism.
        assert!(e <= eps(Accountant::Rdp, q, sigma, steps) + 1e-9);
    }
}

#[test]
fn two_halves_compose_to_the_whole() {
    let options = AccountingOptions::default();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..20 {
        let q = log_uniform(&mut rng, 1e-4, 0.5);
        let sigma = log_uniform(&mut rng, 0.5, 20.0);
        let half = log_uniform(&mut rng, 1.0, 5e4) as u64;
        let whole = rdp_curve(&[Mechanism::dp_sgd(q, sigma, 2 * half)], &options.orders).unwrap();
        let halves =
            rdp_curve(&[Mechanism::dp_sgd(q, sigma, half), Mechanism::dp_sgd(q, sigma, half)], &options.orders)
                .unwrap();
        for (a, b) in whole.values.iter().zip(&halves.values) {
            assert!((a - b).abs() <= 1e-12 * a.abs().max(1e-300) || a == b, "{a} vs {b}");
        }
    }
    // PLD: composing two half-run PLDs agrees with the whole run within discretisation error.
    let whole = account(&[Mechanism::dp_sgd(0.01, 1.0, 400)], Accountant::Pld, 1e-5, &options).unwrap().epsilon;
    let halves = account(
        &[Mechanism::dp_sgd(0.01, 1.0, 200), Mechanism::dp_sgd(0.01, 1.0, 200)],
        Accountant::Pld,
        1e-5,
        &options,
    )
    .unwrap()
    .epsilon;
    assert!((whole - halves).abs() < 2e-3, "{whole} vs {halves}");
}

#[test]
fn calibration_round_trips() {
    for accountant in [Accountant::Rdp, Accountant::Pld] {
        for (target, q, steps) in [(1.0, 0.01, 1000_u64), (4.0, 0.004, 3000), (0.5, 0.02, 200)] {
            let options = AccountingOptions::default();
            let sigma =
                calibrate_sigma(target, 1e-5, accountant, &options, |s| vec![Mechanism::dp_sgd(q, s, steps)]).unwrap();
            let achieved = eps(accountant, q, sigma, steps);
            assert!(achieved <= target, "{accountant}: σ {sigma} gives ε {achieved} > {target}");
            // Smallest: 0.01% less noise already overshoots the target.
            assert!(eps(accountant, q, sigma * (1.0 - 1e-4), steps) > target * (1.0 - 1e-3), "{accountant} not tight");
        }
    }
}

#[test]
fn rdp_is_finite_and_stable_across_the_supported_range() {
    let orders = AccountingOptions::default().orders;
    for q in [1e-6, 1e-4, 1e-2, 0.3, 1.0] {
        for sigma in [0.3, 1.0, 10.0, 100.0] {
            let curve = rdp_curve(&[Mechanism::dp_sgd(q, sigma, 10_000_000)], &orders).unwrap();
            assert!(curve.values.iter().all(|v| !v.is_nan() && *v >= 0.0), "q={q} σ={sigma}");
            assert!(curve.values.iter().any(|v| v.is_finite()), "q={q} σ={sigma}: no finite order");
            let e = curve.epsilon(1e-5, Default::default()).unwrap().epsilon;
            assert!(e.is_finite() && e >= 0.0, "q={q} σ={sigma}: ε={e}");
        }
    }
}
