//! A DP-SGD run's q, T and σ follow the released unit count N̂, so the run is chosen
//! adaptively. Rényi divergences of one order add up under adaptive composition; a bound
//! that picks its best order after N̂ is known does not. For neighbouring datasets with N
//! units the engine holds the job at one order α_N (`RunPlan::order_for`, a public
//! function of N), for every N̂ within ±6 count-σ of N, and counts the tail outside that
//! band in δ (`dpsgd::plan::COUNT_BAND`).
//!
//! Property: for counts N from small to large and every N̂ in N's band, the job's RDP at
//! α_N — the count's plus the run's at the q, T and σ that N̂ gives — converts to at most
//! the job's ε at δ less the tail. Calibrating at each N̂'s own best order (the former
//! rule) leaves N̂ for which α_N exceeds ε; the test shows such an N̂ exists. Holding the
//! orders costs little noise: σ within a few percent of the former rule's.

use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account, calibrate_sigma};
use rhosynth_shared::dpsgd::plan::{RunPlan, count_tail};
use rhosynth_shared::dpsgd::run::RunParams;
use rhosynth_shared::spec::JobSpec;

fn plan(epochs: f64, batch_size: f64, count_noise_multiplier: f64) -> RunPlan {
    let run = RunParams { epochs, batch_size, count_noise_multiplier, ..RunParams::default() };
    RunPlan::new("test", &run).unwrap()
}

fn spec(epsilon: f64, delta: f64) -> JobSpec {
    let mut spec = JobSpec::parse(include_str!("../../examples/demo.toml"), "demo").unwrap();
    spec.privacy.epsilon = epsilon;
    spec.privacy.delta = delta;
    spec
}

/// ε at `order` alone, at δ less the count's tail.
fn epsilon_at(plan: &RunPlan, rate: f64, sigma: f64, delta: f64, order: f64) -> f64 {
    let options = AccountingOptions { orders: vec![order], ..AccountingOptions::default() };
    account(&plan.mechanisms(rate, sigma), Accountant::Rdp, delta - count_tail(), &options).unwrap().epsilon
}

#[test]
fn every_count_in_its_band_holds_the_job_to_its_target_at_the_pairs_order() {
    let options = AccountingOptions::default();
    let mut former_rule_exceeds = 0;
    let mut worst_ratio: f64 = 0.0;
    for (epsilon, delta) in [(1.0, 1e-5), (8.0, 1e-6), (3.0, 1e-5)] {
        let spec = spec(epsilon, delta);
        for (epochs, batch, count_sigma) in [(10.0, 64.0, 20.0), (3.0, 256.0, 10.0)] {
            let plan = plan(epochs, batch, count_sigma);
            for units in [300.0, 3_000.0, 100_000.0] {
                let order = plan.order_for(&spec, &options, units).unwrap();
                for k in [-6.0, -3.0, 0.0, 3.0, 6.0] {
                    let noisy = (units + k * count_sigma).max(1.0);
                    let rate = plan.rate(noisy);
                    let sigma = plan.calibrate(&spec, &options, noisy).unwrap();
                    let held = epsilon_at(&plan, rate, sigma, delta, order);
                    assert!(
                        held <= epsilon * (1.0 + 1e-9),
                        "ε = {epsilon}, N = {units}, N̂ = {noisy}: {held} at order {order}"
                    );
                    // The former rule: σ calibrated at whatever order suits this N̂.
                    let free = calibrate_sigma(epsilon, delta - count_tail(), Accountant::Rdp, &options, |s| {
                        plan.mechanisms(rate, s)
                    })
                    .unwrap();
                    if epsilon_at(&plan, rate, free, delta, order) > epsilon * (1.0 + 1e-6) {
                        former_rule_exceeds += 1;
                    }
                    worst_ratio = worst_ratio.max(sigma / free);
                }
            }
        }
    }
    assert!(former_rule_exceeds > 0, "the former rule never left the pair's order");
    assert!(worst_ratio <= 1.05, "holding the orders costs {worst_ratio}× the former σ");
}

#[test]
fn a_declared_sigma_is_checked_at_every_held_order() {
    let options = AccountingOptions::default();
    let spec = spec(1.0, 1e-5);
    let mut plan = plan(10.0, 64.0, 20.0);
    plan.run.noise_multiplier = Some(1.2);
    let noisy = 3_000.0;
    let held = plan.held_cost(&spec, &options, noisy, 1.2).unwrap();
    for order in plan.held_orders(&spec, &options, noisy).unwrap() {
        let at = epsilon_at(&plan, plan.rate(noisy), 1.2, spec.privacy.delta, order);
        assert!(at <= held.epsilon, "order {order}: {at} above the held {}", held.epsilon);
    }
    // Never below what the best order alone gives.
    let best = account(&plan.mechanisms(plan.rate(noisy), 1.2), Accountant::Rdp, 1e-5, &options).unwrap();
    assert!(held.epsilon >= best.epsilon, "{} below {}", held.epsilon, best.epsilon);
}
