//! The sequence model's ceiling: the same tokenization, windows, decoder and sampler,
//! trained without clipping or noise (`super::pretrain`, as stage 1 trains), so a DP run's shortfall can be told apart from what
//! the architecture cannot learn at all. A benchmark on data its owner may look at
//! (simulated cohorts, `cargo bench -p rhosynth-shared --bench sequence_ceiling`) and the
//! test that the model keeps dynamics; no job reaches this module, since what it trains
//! is not private.

use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;

use super::histories::Histories;
use super::model::SequenceModel;
use super::sampler::SequenceSampler;
use super::tokens::Layout;
use crate::data::domain::Domain;
use crate::data::histories::{ValueHistory, ValueLayout, ValueRows, group};
use crate::data::table::Table;
use crate::eval::longitudinal::{self, Longitudinal};
use crate::eval::{EvalLimits, Sampling};
use crate::simulate::{Cohort, Dynamics, cohort_csv};
use crate::spec::JobSpec;

/// `count` histories drawn from `model` at temperature 1, their lengths from `lengths`
/// (weights of 1..=max_rows rows) when given.
pub fn sample(model: &SequenceModel, count: usize, lengths: Option<Vec<f64>>, seed: u64) -> Vec<Vec<Vec<Option<f64>>>> {
    let transformer = model.transformer.clone();
    let sampler = SequenceSampler { transformer, spec: model.spec.clone(), temperature: 1.0, lengths };
    // public randomness: a benchmark's and a test's model trained on simulated cohorts.
    sampler.histories(count, &mut ChaCha8Rng::seed_from_u64(seed))
}

/// Histories as the longitudinal evaluation reads them: per history, per column in
/// `columns`, the present values in order.
pub fn feature_sequences(histories: &[Vec<Vec<Option<f64>>>], columns: &[usize]) -> Vec<Vec<Vec<f64>>> {
    histories.iter().map(|rows| columns.iter().map(|&c| rows.iter().filter_map(|r| r[c]).collect()).collect()).collect()
}

/// A simulated cohort and a held-out one of half its size, of one kind of dynamics
/// (`simulate --dynamics`, with `/irregular` for irregular sampling), read with
/// `examples/icu-sequence.toml`'s schema: what the benchmarks train on and measure against.
pub struct SimulatedCohort {
    pub spec: JobSpec,
    pub domain: Domain,
    /// The order column's index.
    pub order: usize,
    pub train: Table,
    pub holdout: Table,
}

impl SimulatedCohort {
    /// Writes the cohorts into `dir` (seeds `seed` and `seed + 1000`: simulated data).
    pub async fn new(kind: &str, patients: usize, seed: u64, dir: &std::path::Path) -> Self {
        let (dynamics, irregular) = kind.split_once('/').map_or((kind, false), |(d, i)| (d, i == "irregular"));
        let dynamics: Dynamics = dynamics.parse().expect("a kind of dynamics");
        let files: Vec<String> = [(patients, seed), (patients / 2, seed + 1000)]
            .iter()
            .enumerate()
            .map(|(i, &(n, s))| {
                let path = dir.join(format!("cohort-{i}.csv"));
                std::fs::write(&path, cohort_csv(&Cohort { patients: n, dynamics, irregular }, s)).expect("writable");
                path.to_str().expect("a UTF-8 path").to_string()
            })
            .collect();
        let text = include_str!("../../../../examples/icu-sequence.toml")
            .replace("./rhosynth-out/demo/input/icu_vitals.csv", &files[0]);
        let spec = JobSpec::parse(&text, "simulated").expect("the example parses");
        let domain = Domain::from_spec(&spec);
        let order = domain.index_of(spec.schema.order_by.as_deref().expect("ordered")).expect("the order column");
        let train = crate::data::table::load(&spec, &domain, &files[..1]).await.expect("the cohort reads");
        let holdout = crate::data::table::load(&spec, &domain, &files[1..]).await.expect("the held-out cohort reads");
        Self { spec, domain, order, train, holdout }
    }

    /// The training cohort as histories of `layout`.
    pub fn histories(&self, layout: &Layout) -> Histories {
        Histories::from_rows(self.train_rows(), layout)
    }

    /// The training cohort as histories held as values.
    pub fn value_histories(&self, layout: &ValueLayout) -> Vec<ValueHistory> {
        group::<ValueRows>(self.train_rows(), layout)
    }

    fn train_rows(&self) -> impl Iterator<Item = (String, Vec<Option<f64>>)> + '_ {
        let train = &self.train;
        (0..train.rows()).map(|r| (train.units[r].clone(), train.columns.iter().map(|c| c[r]).collect()))
    }

    /// Drawn histories against the cohort and the held-out one.
    pub fn evaluate(&self, drawn: &[Vec<Vec<Option<f64>>>]) -> Longitudinal {
        let mut table = Table { units: Vec::new(), columns: vec![Vec::new(); self.domain.columns.len()] };
        for (i, rows) in drawn.iter().enumerate() {
            for row in rows {
                table.units.push(format!("s{i}"));
                row.iter().zip(&mut table.columns).for_each(|(v, c)| c.push(*v));
            }
        }
        let (limits, mut sampling) = (EvalLimits::default(), Sampling::new(1));
        longitudinal::evaluate(&self.domain, self.order, &self.train, &self.holdout, &table, &limits, &mut sampling)
    }
}
