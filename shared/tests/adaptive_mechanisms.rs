//! The mechanisms of adaptive selection (AIM), against closed forms. The exponential
//! mechanism's PLD is randomized response's, whose k-fold composition has a binomial
//! privacy loss; its RDP is the smaller of the bounded-range bound α·ε²/8 and randomized
//! response's Rényi divergence. A zCDP budget ρ is α·ρ at every order and has no PLD.

use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account, rdp_curve};
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};

fn selections(epsilon: f64, k: u64) -> Vec<Mechanism> {
    vec![Mechanism::Exponential { sensitivity: 1.0, epsilon, selections: k }]
}

/// δ(ε′) of k-fold randomized response: the loss is ε·(2J − k), J ~ Binomial(k, p).
fn binomial_delta(epsilon: f64, k: u64, target: f64) -> f64 {
    let p = 1.0 / (1.0 + (-epsilon).exp());
    let mut ln_choose = 0.0;
    (0..=k)
        .map(|j| {
            if j > 0 {
                ln_choose += ((k - j + 1) as f64).ln() - (j as f64).ln();
            }
            let loss = epsilon * (2.0 * j as f64 - k as f64);
            let mass = (ln_choose + j as f64 * p.ln() + (k - j) as f64 * (1.0 - p).ln()).exp();
            mass * (1.0 - (target - loss).exp()).max(0.0)
        })
        .sum()
}

/// The smallest ε′ with δ(ε′) ≤ δ, by bisection.
fn binomial_epsilon(epsilon: f64, k: u64, delta: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, epsilon * k as f64);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if binomial_delta(epsilon, k, mid) > delta { lo = mid } else { hi = mid }
    }
    hi
}

#[test]
fn pld_of_composed_selections_matches_the_binomial_closed_form() {
    let options = AccountingOptions::default();
    for (epsilon, k) in [(0.1, 30_u64), (0.5, 8), (0.02, 200), (0.123_45, 10)] {
        let exact = binomial_epsilon(epsilon, k, 1e-5);
        let pld = account(&selections(epsilon, k), Accountant::Pld, 1e-5, &options).unwrap().epsilon;
        // Pessimistic discretisation: never below the exact value, and close to it
        // (a grid of 1e-4 on each of k losses moves ε by at most about k·1e-4).
        assert!(pld >= exact - 1e-9, "ε = {epsilon}, k = {k}: PLD {pld} below exact {exact}");
        assert!(pld <= exact + k as f64 * 1e-4 + 1e-6, "ε = {epsilon}, k = {k}: PLD {pld} vs exact {exact}");
        // And never above basic composition.
        assert!(pld <= epsilon * k as f64 + 1e-9);
    }
}

#[test]
fn rdp_is_the_smaller_of_the_bounded_range_and_randomized_response_bounds() {
    let orders = [1.5, 2.0, 8.0, 64.0];
    for epsilon in [0.05, 1.0, 4.0] {
        let curve = rdp_curve(&selections(epsilon, 3), &orders).unwrap();
        let p: f64 = 1.0 / (1.0 + (-epsilon).exp());
        for (&alpha, &value) in orders.iter().zip(&curve.values) {
            let rr = ((p.powf(alpha) * (1.0 - p).powf(1.0 - alpha) + (1.0 - p).powf(alpha) * p.powf(1.0 - alpha)).ln()
                / (alpha - 1.0))
                .min(epsilon);
            let expected = 3.0 * (alpha * epsilon * epsilon / 8.0).min(rr);
            assert!(
                (value - expected).abs() < 1e-9 * expected.max(1e-12),
                "ε = {epsilon}, α = {alpha}: {value} vs {expected}"
            );
        }
    }
    // At ε = 4 and α = 2 randomized response is the tighter: ln(p²/q + q²/p) ≈ 3.982 < 4.
    let curve = rdp_curve(&selections(4.0, 1), &[2.0]).unwrap();
    assert!((curve.values[0] - 3.9819).abs() < 1e-3, "{}", curve.values[0]);
}

#[test]
fn a_zcdp_budget_is_linear_in_the_order_and_refused_by_the_pld_accountant() {
    let orders = [1.25, 2.0, 10.0, 256.0];
    let curve = rdp_curve(&[Mechanism::Zcdp { rho: 0.3, adjacency: Adjacency::AddRemove }], &orders).unwrap();
    for (&alpha, &value) in orders.iter().zip(&curve.values) {
        assert!((value - 0.3 * alpha).abs() < 1e-12, "α = {alpha}: {value}");
    }
    let options = AccountingOptions::default();
    let pld =
        account(&[Mechanism::Zcdp { rho: 0.3, adjacency: Adjacency::AddRemove }], Accountant::Pld, 1e-6, &options);
    assert!(pld.unwrap_err().to_string().contains("RDP"));
    // Through RDP: never above the classic conversion ρ + 2√(ρ ln(1/δ)) at its best order.
    let rdp =
        account(&[Mechanism::Zcdp { rho: 0.3, adjacency: Adjacency::AddRemove }], Accountant::Rdp, 1e-6, &options)
            .unwrap()
            .epsilon;
    assert!(rdp <= 0.3 + 2.0 * (0.3 * 1e6_f64.ln()).sqrt() + 0.05, "{rdp}");
    assert!(Mechanism::Zcdp { rho: 0.0, adjacency: Adjacency::AddRemove }.validate().is_err());
}

/// Partition selection is the Gaussian mechanism on the keys both neighbours hold, plus
/// δ_τ outright for the keys one unit alone holds: under both accountants its ε at δ is
/// the Gaussian's at δ − δ_τ, composed alongside other mechanisms too; a δ_τ that takes
/// all of δ is refused; its threshold makes a lone key pass with probability δ_τ/L.
#[test]
fn partition_selection_costs_the_gaussian_at_the_delta_its_threshold_leaves() {
    let options = AccountingOptions::default();
    let selection = Mechanism::PartitionSelection { max_partitions: 3, noise_multiplier: 2.0, threshold_delta: 4e-7 };
    let gaussian = |releases| Mechanism::Gaussian {
        l2_sensitivity: 1.0,
        noise_multiplier: 2.0,
        releases,
        adjacency: Adjacency::AddRemove,
    };
    for accountant in [Accountant::Rdp, Accountant::Pld] {
        let cost = |m: &[Mechanism], delta| account(m, accountant, delta, &options).unwrap();
        let alone = cost(std::slice::from_ref(&selection), 1e-6);
        assert_eq!(alone.epsilon, cost(&[gaussian(1)], 6e-7).epsilon, "{accountant}");
        assert_eq!(alone.delta, 1e-6, "the cost is stated at the δ asked for");
        let both = cost(&[selection.clone(), selection.clone(), gaussian(3)], 1e-6).epsilon;
        assert_eq!(both, cost(&[gaussian(5)], 1e-6 - 8e-7).epsilon, "{accountant}");
        let all_of_delta =
            account(&[selection.clone(), selection.clone(), selection.clone()], accountant, 1e-6, &options);
        assert!(all_of_delta.unwrap_err().to_string().contains("outright"), "{accountant}");
    }
    // τ = 1 + σ√L·z with P[Z > z] = δ_τ/L: a count of 1 plus N(0, (σ√L)²) passes with
    // probability exactly δ_τ/L.
    let tau = Mechanism::selection_threshold(3, 2.0, 4e-7);
    let pass = rhosynth_shared::accounting::math::normal_sf((tau - 1.0) / (2.0 * 3f64.sqrt()));
    assert!((pass / (4e-7 / 3.0) - 1.0).abs() < 1e-9, "{pass}");
    assert!(
        Mechanism::PartitionSelection { max_partitions: 0, noise_multiplier: 1.0, threshold_delta: 1e-7 }
            .validate()
            .is_err()
    );
}
