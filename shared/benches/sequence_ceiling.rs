//! The sequence model's ceiling (#39): `examples/icu-sequence.toml`'s tokenization, windows
//! and decoder trained *without* clipping or noise on simulated cohorts of several kinds of
//! dynamics, then its histories against the cohort and a held-out cohort of the same kind:
//! per vital the lag-1 autocorrelation (real, held-out, synthetic), and the transition
//! error and rows-per-unit TV beside their real-vs-real floor. The data are simulated.
//!
//! `cargo bench -p rhosynth-shared --bench sequence_ceiling`; environment:
//! `CEILING_PATIENTS` (default 1000), `CEILING_STEPS` (600), `CEILING_BATCH` (32),
//! `CEILING_LR` (0.003), `CEILING_FAMILY` (the decoder's block, `gpt` or `llama`), `CEILING_DYNAMICS` (default
//! `hidden-state,ar1:0.6,ar1:0.3/irregular,treated:0.5`).

use std::time::Instant;

use rhosynth_shared::accounting::accountant::AccountingOptions;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::eval::longitudinal::Longitudinal;
use rhosynth_shared::generators::sequence::ceiling::{SimulatedCohort, sample};
use rhosynth_shared::generators::sequence::params::PlainTraining;
use rhosynth_shared::generators::sequence::pretrain::train_plain;
use rhosynth_shared::generators::sequence::{SequenceModel, SequencePlan};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn report(name: &str, l: &Longitudinal, seconds: f64) {
    println!("\n## {name} ({seconds:.0} s)");
    println!("| vital | lag-1 real | held-out | synthetic | transition error | held-out floor |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let f = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.3}"));
    for d in &l.dynamics {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} |",
            d.column,
            f(d.lag1_real),
            f(d.lag1_holdout),
            f(d.lag1_synthetic),
            d.transition_error,
            d.holdout_transition_error
        );
    }
    println!("{}", l.dynamics_summary());
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let patients: usize = env("CEILING_PATIENTS", 1000);
    let training = PlainTraining {
        steps: env("CEILING_STEPS", 600),
        batch: env("CEILING_BATCH", 32),
        learning_rate: env("CEILING_LR", 3e-3),
    };
    let kinds: String = env("CEILING_DYNAMICS", "hidden-state,ar1:0.6,ar1:0.3/irregular,treated:0.5".to_string());
    let dir = tempfile::tempdir().unwrap();
    println!("# Sequence ceiling: {patients} patients, {training:?}, no clipping or noise");
    for kind in kinds.split(',') {
        let cohort = SimulatedCohort::new(kind, patients, 2026, dir.path()).await;
        let mut plan = SequencePlan::new(&cohort.spec, &cohort.domain, &AccountingOptions::default()).unwrap();
        if let Ok(family) = std::env::var("CEILING_FAMILY") {
            plan.model.transformer.family = serde_json::from_value(serde_json::json!(family)).unwrap();
        }
        let histories = cohort.histories(&plan.model.layout);

        let started = Instant::now();
        let mut model = SequenceModel::new(&plan.model, &compute_device());
        let losses = train_plain(&mut model, &histories, &training, 1);
        let l = cohort.evaluate(&sample(&model, patients, None, 2));
        println!("\nloss per unit {:.1} → {:.1}", losses[0], losses.last().unwrap());
        report(kind, &l, started.elapsed().as_secs_f64());
    }
}
