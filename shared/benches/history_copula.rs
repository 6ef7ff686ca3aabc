//! The history copula under DP (#39): fitted as a job fits it (margins, moments and
//! lengths released at the plan's noise, calibrated to (ε, δ)) on simulated cohorts of
//! several kinds of dynamics; its histories against the cohort and a held-out cohort:
//! mean lag-1 gap, transition error, rows-per-unit TV, each beside the held-out floor.
//! Noise here comes from a seeded generator: simulated data, a benchmark only.
//!
//! `cargo bench -p rhosynth-shared --bench history_copula --profile test`; environment:
//! `COPULA_PATIENTS` (3000,10000), `COPULA_EPSILON` (2), `COPULA_SEEDS` (1,2),
//! `COPULA_DYNAMICS` (`ar1:0.6,hidden-state,treated:0.6,hidden-state/irregular`).

use std::time::Instant;

use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use rhosynth_shared::accounting::accountant::AccountingOptions;
use rhosynth_shared::generators::GeneratorSpec;
use rhosynth_shared::generators::history_copula::{CopulaSampler, HistoryCopulaParams, HistoryCopulaPlan, simulated};
use rhosynth_shared::generators::sequence::ceiling::SimulatedCohort;

fn list<T: std::str::FromStr>(name: &str, default: &str) -> Vec<T> {
    let text = std::env::var(name).unwrap_or_else(|_| default.to_string());
    text.split(',').map(|v| v.trim().parse().ok().expect("a list of values")).collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let epsilon: f64 = list("COPULA_EPSILON", "2")[0];
    let dir = tempfile::tempdir().unwrap();
    println!("# History copula under DP: ε = {epsilon}, δ = 1e-8");
    println!(
        "| dynamics | units | seed | mean lag-1 gap (held-out) | transition error (held-out) | rows-per-unit TV | s |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for patients in list::<usize>("COPULA_PATIENTS", "3000,10000") {
        for kind in list::<String>("COPULA_DYNAMICS", "ar1:0.6,hidden-state,treated:0.6,hidden-state/irregular") {
            for seed in list::<u64>("COPULA_SEEDS", "1,2") {
                let started = Instant::now();
                let cohort = SimulatedCohort::new(&kind, patients, 2026 + seed, dir.path()).await;
                let mut spec = cohort.spec.clone();
                spec.generator = GeneratorSpec::HistoryCopula(HistoryCopulaParams::default());
                spec.privacy.epsilon = epsilon;
                let plan = HistoryCopulaPlan::new(&spec, &cohort.domain, &AccountingOptions::default()).unwrap();
                let histories = cohort.value_histories(&plan.layout.value_layout());
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let model = simulated::fit(&plan, &histories, |values, std| {
                    let normal = Normal::new(0.0, std).unwrap();
                    values.iter_mut().for_each(|v| *v += normal.sample(&mut rng));
                });
                let drawn = CopulaSampler::new(model).histories(patients, &mut rng);
                let l = cohort.evaluate(&drawn);
                let f = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.3}"));
                println!(
                    "| {kind} | {patients} | {seed} | {} ({}) | {:.3} ({:.3}) | {:.3} | {:.0} |",
                    f(l.mean_lag1_gap()),
                    f(l.holdout_mean_lag1_gap()),
                    l.state_transition_divergence,
                    l.holdout_transition_error(),
                    l.sequence_length_tv,
                    started.elapsed().as_secs_f64()
                );
            }
        }
    }
}
