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
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::eval::longitudinal::{self, Longitudinal};
use rhosynth_shared::eval::{EvalLimits, Sampling, Table};
use rhosynth_shared::generators::sequence::ceiling::{PlainTraining, sample, train_plain};
use rhosynth_shared::generators::sequence::{Histories, SequenceModel, SequencePlan};
use rhosynth_shared::simulate::{Cohort, Dynamics, cohort_csv};
use rhosynth_shared::spec::JobSpec;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Drawn histories as a table (units `s0`, `s1`, …).
fn table(histories: &[Vec<Vec<Option<f64>>>], columns: usize) -> Table {
    let mut out = Table { units: Vec::new(), columns: vec![Vec::new(); columns] };
    for (i, rows) in histories.iter().enumerate() {
        for row in rows {
            out.units.push(format!("s{i}"));
            row.iter().zip(&mut out.columns).for_each(|(v, c)| c.push(*v));
        }
    }
    out
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
    println!(
        "mean lag-1 gap {} (held-out {}); transition error {:.3} (held-out {:.3}); rows-per-unit TV {:.3}",
        f(l.mean_lag1_gap()),
        f(l.holdout_mean_lag1_gap()),
        l.state_transition_divergence,
        l.holdout_transition_error(),
        l.sequence_length_tv
    );
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
        let (dynamics, irregular) = kind.split_once('/').map_or((kind, false), |(d, i)| (d, i == "irregular"));
        let dynamics: Dynamics = dynamics.parse().unwrap();
        let files: Vec<String> = [(patients, 2026), (patients / 2, 2027)]
            .iter()
            .enumerate()
            .map(|(i, &(n, seed))| {
                let path = dir.path().join(format!("cohort-{i}.csv"));
                std::fs::write(&path, cohort_csv(&Cohort { patients: n, dynamics, irregular }, seed)).unwrap();
                path.to_str().unwrap().to_string()
            })
            .collect();
        let text = include_str!("../../examples/icu-sequence.toml")
            .replace("./rhosynth-out/demo/input/icu_vitals.csv", &files[0]);
        let spec = JobSpec::parse(&text, "ceiling").unwrap();
        let domain = Domain::from_spec(&spec);
        let mut plan = SequencePlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
        if let Ok(family) = std::env::var("CEILING_FAMILY") {
            plan.model.transformer.family = serde_json::from_value(serde_json::json!(family)).unwrap();
        }
        let train = rhosynth_shared::eval::load(&spec, &domain, &files[..1]).await.unwrap();
        let holdout = rhosynth_shared::eval::load(&spec, &domain, &files[1..]).await.unwrap();
        let rows = (0..train.rows()).map(|r| (train.units[r].clone(), train.columns.iter().map(|c| c[r]).collect()));
        let histories = Histories::from_rows(rows, &plan.model.layout);

        let started = Instant::now();
        let mut model = SequenceModel::new(&plan.model, &compute_device());
        let losses = train_plain(&mut model, &histories, &training, 1);
        let drawn = table(&sample(&model, patients, 2), domain.columns.len());
        let order = domain.index_of(spec.schema.order_by.as_deref().unwrap()).unwrap();
        let l = longitudinal::evaluate(
            &domain,
            order,
            &train,
            &holdout,
            &drawn,
            &EvalLimits::default(),
            &mut Sampling::new(1),
        );
        println!("\nloss per unit {:.1} → {:.1}", losses[0], losses.last().unwrap());
        report(kind, &l, started.elapsed().as_secs_f64());
    }
}
