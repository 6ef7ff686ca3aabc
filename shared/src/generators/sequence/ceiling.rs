//! The sequence model's ceiling: the same tokenization, windows, decoder and sampler,
//! trained without clipping or noise, so a DP run's shortfall can be told apart from what
//! the architecture cannot learn at all. A benchmark on data its owner may look at
//! (simulated cohorts, `cargo bench -p rhosynth-shared --bench sequence_ceiling`) and the
//! test that the model keeps dynamics; no job reaches this module, since what it trains
//! is not private.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::model::SequenceModel;
use super::sampler::SequenceSampler;
use super::task::Histories;
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::optimizer::{Optimizer, OptimizerSpec, Schedule};
use crate::dpsgd::params::TrainableLayers;
use crate::dpsgd::{DpModel, compute_device};

/// Ordinary minibatch training: `steps` Adam steps (cosine schedule) over `batch` units
/// drawn uniformly, each a training window as DP-SGD draws it.
#[derive(Clone, Debug)]
pub struct PlainTraining {
    pub steps: u64,
    pub batch: usize,
    pub learning_rate: f64,
}

/// Trains `model` on `histories`; returns each step's loss per unit.
pub fn train_plain(model: &mut SequenceModel, histories: &Histories, training: &PlainTraining, seed: u64) -> Vec<f64> {
    let device = compute_device();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let adam = OptimizerSpec::Adam { lr: training.learning_rate, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let mut optimizer = Optimizer::new(adam, Schedule::Cosine, training.steps, model.parameter_count());
    let mut parameters: Vec<f64> = model.parameters().into_iter().map(f64::from).collect();
    let mut losses = Vec::with_capacity(training.steps as usize);
    for _ in 0..training.steps {
        let units: Vec<usize> = (0..training.batch).map(|_| rng.random_range(0..histories.units.len())).collect();
        let windows_seed: [u8; 32] = rng.random();
        let tracked = model.tracked();
        let total = tracked.losses(histories, &units, &windows_seed, &device, &mut Plain).losses.sum();
        losses.push(f64::from(total.clone().into_scalar::<f32>()) / training.batch as f64);
        let gradient: Vec<f64> = tracked
            .flat_gradient(&total.backward())
            .into_iter()
            .map(|g| f64::from(g) / training.batch as f64)
            .collect();
        optimizer.step(&mut parameters, &gradient);
        let flat: Vec<f32> = parameters.iter().map(|&p| p as f32).collect();
        model.load_parameters(&flat).expect("the model's own parameter count");
    }
    losses
}

/// `count` histories drawn from `model` at temperature 1.
pub fn sample(model: &SequenceModel, count: usize, seed: u64) -> Vec<Vec<Vec<Option<f64>>>> {
    let sampler =
        SequenceSampler { transformer: model.transformer.clone(), spec: model.spec.clone(), temperature: 1.0 };
    sampler.histories(count, &mut ChaCha8Rng::seed_from_u64(seed))
}

/// Histories as the longitudinal evaluation reads them: per history, per column in
/// `columns`, the present values in order.
pub fn feature_sequences(histories: &[Vec<Vec<Option<f64>>>], columns: &[usize]) -> Vec<Vec<Vec<f64>>> {
    histories.iter().map(|rows| columns.iter().map(|&c| rows.iter().filter_map(|r| r[c]).collect()).collect()).collect()
}
